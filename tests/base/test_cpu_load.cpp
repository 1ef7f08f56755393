// The load probe (/proc/stat on the affinity mask, less this process's CPU time) and the team
// size that follows it (base/cpu_load.h).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include "hetrain/base/cpu_load.h"
#include "hetrain/base/cpu_time.h"

namespace hetrain {
namespace {

// Two CPUs; fields: user nice system idle iowait irq softirq steal guest guest_nice.
constexpr const char* kStat =
    "cpu  100 5 50 1000 10 1 2 3 7 0\n"
    "cpu0 60 3 30 500 5 1 1 2 4 0\n"
    "cpu1 40 2 20 500 5 0 1 1 3 0\n"
    "intr 12345 0 0\n"
    "ctxt 999\n";

TEST(CpuLoad, BusySecondsSumTheMaskedCpusBusyFields) {
  // cpu0: 60 + 3 + 30 + 1 + 1 + 2 (idle, iowait and guest, already in user, left out) = 97
  // ticks; cpu1: 40 + 2 + 20 + 0 + 1 + 1 = 64.
  EXPECT_DOUBLE_EQ(*busy_seconds(kStat, {0}, 100), 0.97);
  EXPECT_DOUBLE_EQ(*busy_seconds(kStat, {1}, 100), 0.64);
  EXPECT_DOUBLE_EQ(*busy_seconds(kStat, {0, 1}, 100), 1.61);
  EXPECT_DOUBLE_EQ(*busy_seconds(kStat, {0, 1}, 1000), 0.161);
  EXPECT_DOUBLE_EQ(*busy_seconds(kStat, {}, 100), 0.0);
  // A CPU without a line, a malformed line, a bad tick rate: no answer rather than a wrong one.
  EXPECT_FALSE(busy_seconds(kStat, {2}, 100));
  EXPECT_FALSE(busy_seconds("cpu0 60 3 x 500\n", {0}, 100));
  EXPECT_FALSE(busy_seconds("cpu0 60 3 30\n", {0}, 100));
  EXPECT_FALSE(busy_seconds("cpuX 60 3 30 500\n", {0}, 100));
  EXPECT_FALSE(busy_seconds(kStat, {0}, 0));
  // An old kernel's four fields are enough.
  EXPECT_DOUBLE_EQ(*busy_seconds("cpu0 10 20 30 400\n", {0}, 100), 0.6);
}

// A sample at time t after others_cpus of other work and own_cpus of this process's, per second,
// since t = 0.
struct Clock {
  double t = 0, busy = 0, own = 0;
  CpuLoadSample advance(double dt, double others_cpus, double own_cpus) {
    t += dt;
    busy += dt * (others_cpus + own_cpus);
    own += dt * own_cpus;
    return {.wall_s = t, .busy_s = busy, .own_s = own, .valid = true};
  }
};

TEST(CpuLoad, TeamShrinksWhenTwoWindowsFindACpuTakenAndGrowsBackWhenFree) {
  TeamSizer s(2, 2, 0.5);
  Clock c;
  EXPECT_EQ(s.team(), 2);
  EXPECT_TRUE(s.due(0));
  EXPECT_FALSE(s.observe(c.advance(0, 0, 0)));  // the first sample starts a window
  EXPECT_FALSE(s.due(c.t + 0.2));
  EXPECT_TRUE(s.due(c.t + 0.5));
  // Another process takes one CPU: the first window asks for 1, the second confirms it.
  EXPECT_FALSE(s.observe(c.advance(0.6, 1.0, 1.0)));
  EXPECT_NEAR(s.others(), 1.0, 1e-9);
  EXPECT_EQ(s.team(), 2);
  EXPECT_EQ(s.observe(c.advance(0.6, 1.0, 1.0)), 1);
  EXPECT_EQ(s.team(), 1);
  // A window too short to judge changes nothing and keeps its start.
  EXPECT_FALSE(s.observe(c.advance(0.1, 0, 1.0)));
  // One free window alone (a burst ended) does not grow the team back ...
  EXPECT_FALSE(s.observe(c.advance(0.6, 0, 1.0)));
  EXPECT_FALSE(s.observe(c.advance(0.6, 1.0, 1.0)));
  EXPECT_EQ(s.team(), 1);
  // ... two do.
  EXPECT_FALSE(s.observe(c.advance(0.6, 0.05, 1.0)));
  EXPECT_EQ(s.observe(c.advance(0.6, 0.05, 1.0)), 2);
  // Invalid samples (no /proc/stat) change nothing.
  CpuLoadSample bad = c.advance(5, 2.0, 0);
  bad.valid = false;
  EXPECT_FALSE(s.observe(bad));
  EXPECT_FALSE(s.observe(bad));
  EXPECT_EQ(s.team(), 2);
}

TEST(CpuLoad, TeamSizeIsTheFreeCpusWithAMarginBetweenOneAndTheMost) {
  // want = floor(cpus - others + 0.3), in [1, most]; each case confirmed by two windows.
  struct Case {
    int most, cpus;
    double others;
    int team;
  };
  for (const Case k : {Case{2, 2, 0.25, 2}, Case{2, 2, 0.35, 1}, Case{2, 2, 1.9, 1},
                       Case{2, 2, 5.0, 1}, Case{4, 4, 2.5, 1}, Case{4, 4, 1.5, 2},
                       Case{4, 4, 0.6, 3}, Case{3, 8, 1.0, 3}, Case{1, 2, 0.0, 1}}) {
    TeamSizer s(k.most, k.cpus, 0.5);
    Clock c;
    s.observe(c.advance(0, 0, 0));
    s.observe(c.advance(1, k.others, 1));
    s.observe(c.advance(1, k.others, 1));
    EXPECT_EQ(s.team(), k.team) << "most " << k.most << " cpus " << k.cpus << " others "
                                << k.others;
  }
}

TEST(CpuLoad, ThisProcessesWorkIsNotCountedAsOthers) {
  if (!std::ifstream("/proc/stat")) GTEST_SKIP() << "no /proc/stat here";
  const CpuLoadSample a = sample_cpu_load();
  ASSERT_TRUE(a.valid);
  EXPECT_FALSE(affinity_cpus().empty());
  // Busy for 0.3 s of CPU on this thread: the CPUs' busy time grows by at least that (less a
  // tick of rounding per CPU), and this process's own time by about that.
  volatile double x = 0;
  const double start = thread_cpu_seconds();
  while (thread_cpu_seconds() - start < 0.3) x = x + std::sqrt(x + 1);
  const CpuLoadSample b = sample_cpu_load();
  ASSERT_TRUE(b.valid);
  EXPECT_GE(b.own_s - a.own_s, 0.3);
  EXPECT_GE(b.busy_s - a.busy_s,
            (b.own_s - a.own_s) - 0.02 * static_cast<double>(affinity_cpus().size()));
  EXPECT_GT(b.wall_s, a.wall_s);
}

}  // namespace
}  // namespace hetrain
