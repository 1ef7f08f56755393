// How much of this process's CPUs other work takes, and a team size that follows what is free.
//
//   TeamSizer sizer(num_threads(), available_cpus());
//   after each step:
//     if (sizer.due(monotonic_seconds())) {
//       if (std::optional<int> n = sizer.observe(sample_cpu_load())) set_num_threads(*n);
//     }
//
// Why: every parallel region of the OpenMP team (Hetrain's kernels and oneDNN's alike) ends at
// a barrier that waits for its slowest thread. When another process keeps one of the cores busy,
// one thread of the team loses whole time slices to it and every barrier waits for that thread.
// Nice values do not prevent it: the kernel's autogroups share the cores between sessions (a
// compile in another terminal) whatever their nice values. On a 2-vCPU Zen 4 with a compile
// running, gpt-mini's bf16 step took 0.3-2.1 s on a team of 2 and 0.09 s on a team of 1
// (docs/PERFORMANCE.md, "On a busy machine").
//
// What is measured: over a window of at least min_window_s, the CPU time /proc/stat counts on
// this process's CPUs (its affinity mask; steal time included, as a CPU the hypervisor gave to
// someone else is not free either), less this process's own CPU time, per second of wall time:
// the CPUs other work used. The team is the CPUs left, rounded down after adding a small margin
// (a background process using a third of a CPU leaves a 2-CPU team at 2), between 1 and the
// most the caller allows. A new size is taken only when two windows in a row ask for it, so one
// burst (a page-cache flush, a short command) does not resize the team.
#pragma once

#include <optional>
#include <string_view>
#include <vector>

namespace hetrain {

/// CPU time on this process's CPUs, by everyone and by this process, at one moment.
struct CpuLoadSample {
  double wall_s = 0;   // monotonic_seconds() (base/cpu_time.h)
  double busy_s = 0;   // CPU seconds /proc/stat counts on the CPUs of the affinity mask
  double own_s = 0;    // this process's CPU seconds (all its threads)
  bool valid = false;  // false where /proc/stat could not be read (not Linux, a masked /proc)
};

/// The CPU seconds spent busy (user, nice, system, irq, softirq, steal) on the CPUs listed in
/// cpus, from a /proc/stat text whose counters are in ticks of 1/ticks_per_s s. nullopt when the
/// text has no "cpuN" line for one of them, or a line is malformed.
std::optional<double> busy_seconds(std::string_view proc_stat, const std::vector<int>& cpus,
                                   double ticks_per_s);

/// The CPUs of this process's affinity mask, in increasing order.
std::vector<int> affinity_cpus();

/// A sample now (wall clock, /proc/stat for affinity_cpus(), this process's CPU time).
CpuLoadSample sample_cpu_load();

class TeamSizer {
 public:
  /// most: the largest team (the requested thread count); cpus: the CPUs the process may use.
  TeamSizer(int most, int cpus, double min_window_s = 0.5);

  /// Whether a window has passed since the last sample taken (the first call: always), so that
  /// sampling costs nothing on the steps between.
  bool due(double now_s) const;
  /// Takes a sample; returns the new team size when the team changes. Invalid samples change
  /// nothing.
  std::optional<int> observe(const CpuLoadSample& s);

  int team() const { return team_; }
  /// The CPUs other work used over the last complete window (0 before one).
  double others() const { return others_; }

 private:
  int most_, cpus_;
  double min_window_s_;
  int team_;
  int pending_ = 0;  // what the previous window asked for (0: nothing yet)
  double others_ = 0;
  std::optional<CpuLoadSample> start_;
};

}  // namespace hetrain
