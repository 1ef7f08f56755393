#include "hetrain/base/cpu_time.h"

#include <ctime>

namespace hetrain {

namespace {
double seconds(clockid_t clock) {
  timespec ts{};
  clock_gettime(clock, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}
}  // namespace

double process_cpu_seconds() { return seconds(CLOCK_PROCESS_CPUTIME_ID); }
double thread_cpu_seconds() { return seconds(CLOCK_THREAD_CPUTIME_ID); }
double monotonic_seconds() { return seconds(CLOCK_MONOTONIC); }

}  // namespace hetrain
