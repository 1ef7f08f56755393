#include "hetrain/base/thread_pool.h"

#include <omp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <exception>
#include <mutex>
#include <thread>

#include "hetrain/base/cpu_load.h"
#include "hetrain/base/error.h"

namespace hetrain {

namespace {
thread_local bool g_serial = false;

// LLVM's OpenMP runtime (libomp; clang builds link it, the sanitizer build among them) keeps a
// file /dev/shm/__KMP_REGISTERED_LIB_<pid>_<uid> for each process and, where one of that name
// exists already, reads it. A process stopped between creating the file and sizing it (one that
// starts under a file-size limit of 0 does) leaves it empty, and the next process given the same
// PID dies of SIGBUS in its first OpenMP call (libomp 14; it struck a CI run at the 4-rank ZeRO
// test). Before this process's runtime has started, a file with this PID and no data in it can
// only be such a leftover, so it goes. GCC's libgomp keeps no such file: then this finds none.
struct ClearStaleOpenMpRegistration {
  ClearStaleOpenMpRegistration() noexcept {
    char name[96];
    std::snprintf(name, sizeof name, "/dev/shm/__KMP_REGISTERED_LIB_%d_%d",
                  static_cast<int>(getpid()), static_cast<int>(getuid()));
    struct stat st {};
    if (lstat(name, &st) == 0 && S_ISREG(st.st_mode) && st.st_blocks == 0) unlink(name);
  }
};
const ClearStaleOpenMpRegistration g_clear_stale_registration;
}  // namespace
SerialScope::SerialScope() : prev_(g_serial) { g_serial = true; }
SerialScope::~SerialScope() { g_serial = prev_; }
bool SerialScope::active() { return g_serial; }

ThreadPool::ThreadPool(int threads) : threads_(threads) {
  // oneDNN's calls from this thread take their team size from OpenMP's setting.
  omp_set_num_threads(threads);
}

void ThreadPool::resize(int threads) {
  threads_.store(threads, std::memory_order_relaxed);
  omp_set_num_threads(threads);
}

void ThreadPool::parallel_for(int64_t n, int64_t grain,
                              const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  const int threads = size();  // once: a resize on another thread does not split this call
  const int64_t chunks = std::min<int64_t>((n + grain - 1) / grain, threads * 4);
  if (chunks <= 1 || threads == 1) {
    fn(0, n);
    return;
  }
  const int64_t per = (n + chunks - 1) / chunks;
  if (g_serial || omp_get_level() > 0) {
    // The same chunks as a parallel run, one after another: results that depend on the
    // split (partial sums) come out bit for bit the same.
    for (int64_t b = 0; b < n; b += per) fn(b, std::min(n, b + per));
    return;
  }
  std::atomic<int64_t> next{0};
  std::mutex mu;
  std::exception_ptr error;  // the first exception a chunk threw, rethrown below
  const int team = static_cast<int>(std::min<int64_t>(chunks, threads));
#pragma omp parallel num_threads(team)
  for (;;) {
    const int64_t c = next.fetch_add(1);
    if (c >= chunks) break;
    const int64_t b = c * per, e = std::min(n, b + per);
    try {
      if (b < e) fn(b, e);
    } catch (...) {
      std::lock_guard<std::mutex> lk(mu);
      if (!error) error = std::current_exception();
    }
  }
  if (error) std::rethrow_exception(error);
}

int available_cpus() {
  const size_t mask = affinity_cpus().size();
  if (mask > 0) return static_cast<int>(mask);
  const unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : static_cast<int>(n);
}

namespace {
int default_threads() { return available_cpus(); }
}  // namespace

ThreadPool& thread_pool() {
  // One pool for the process's life, resized in place: a reference taken on one thread stays
  // good whatever another thread's set_num_threads does.
  static ThreadPool pool(default_threads());
  return pool;
}

int max_threads() { return std::max(64, 4 * default_threads()); }

void set_num_threads(int n) {
  if (n <= 0) n = default_threads();
  if (n > max_threads())
    fail("[threads] ", n, " threads requested; at most ", max_threads(),
         " (4 per core, at least 64) are allowed");
  thread_pool().resize(n);  // also when n is its size: OpenMP's setting is per thread
}

int num_threads() { return thread_pool().size(); }

}  // namespace hetrain
