#include "hetrain/base/cpu_load.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <fstream>
#include <iterator>
#include <map>
#include <string>

#include "hetrain/base/cpu_time.h"

namespace hetrain {

namespace {

// The fields of a "cpuN" line that count busy time: user nice system idle iowait irq softirq
// steal (guest and guest_nice are already inside user and nice).
constexpr std::array<bool, 8> kBusyField = {true, true, true, false, false, true, true, true};

bool parse_u64(std::string_view s, unsigned long long& v) {
  const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  return ec == std::errc() && p == s.data() + s.size();
}

// "cpuN f0 f1 ...": N and the busy ticks; false for other lines or a malformed one.
bool cpu_line(std::string_view line, int& cpu, unsigned long long& busy, bool& malformed) {
  malformed = false;
  if (line.size() < 4 || line.substr(0, 3) != "cpu" || line[3] < '0' || line[3] > '9') return false;
  size_t pos = 3;
  const size_t end_n = line.find(' ', pos);
  unsigned long long n = 0;
  if (end_n == std::string_view::npos || !parse_u64(line.substr(pos, end_n - pos), n)) {
    malformed = true;
    return false;
  }
  cpu = static_cast<int>(n);
  busy = 0;
  size_t field = 0;
  pos = end_n;
  while (pos < line.size()) {
    while (pos < line.size() && line[pos] == ' ') ++pos;
    if (pos >= line.size()) break;
    size_t e = line.find(' ', pos);
    if (e == std::string_view::npos) e = line.size();
    unsigned long long v = 0;
    if (!parse_u64(line.substr(pos, e - pos), v)) {
      malformed = true;
      return false;
    }
    if (field < kBusyField.size() && kBusyField[field]) busy += v;
    ++field;
    pos = e;
  }
  if (field < 4) {  // user nice system idle at the least
    malformed = true;
    return false;
  }
  return true;
}

}  // namespace

std::optional<double> busy_seconds(std::string_view proc_stat, const std::vector<int>& cpus,
                                   double ticks_per_s) {
  if (!(ticks_per_s > 0)) return std::nullopt;
  std::map<int, unsigned long long> busy;
  size_t pos = 0;
  while (pos < proc_stat.size()) {
    size_t e = proc_stat.find('\n', pos);
    if (e == std::string_view::npos) e = proc_stat.size();
    int cpu = 0;
    unsigned long long b = 0;
    bool malformed = false;
    if (cpu_line(proc_stat.substr(pos, e - pos), cpu, b, malformed)) busy[cpu] = b;
    if (malformed) return std::nullopt;
    pos = e + 1;
  }
  unsigned long long total = 0;
  for (const int c : cpus) {
    const auto it = busy.find(c);
    if (it == busy.end()) return std::nullopt;
    total += it->second;
  }
  return static_cast<double>(total) / ticks_per_s;
}

std::vector<int> affinity_cpus() {
  std::vector<int> out;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0)
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) out.push_back(c);
  return out;
}

CpuLoadSample sample_cpu_load() {
  CpuLoadSample s;
  s.wall_s = monotonic_seconds();
  s.own_s = process_cpu_seconds();
  std::ifstream in("/proc/stat");
  if (!in) return s;
  const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  const long tck = sysconf(_SC_CLK_TCK);
  const std::optional<double> busy =
      busy_seconds(text, affinity_cpus(), static_cast<double>(tck > 0 ? tck : 100));
  if (!busy) return s;
  s.busy_s = *busy;
  s.valid = true;
  return s;
}

TeamSizer::TeamSizer(int most, int cpus, double min_window_s)
    : most_(std::max(most, 1)),
      cpus_(std::max(cpus, 1)),
      min_window_s_(min_window_s),
      team_(std::max(most, 1)) {}

bool TeamSizer::due(double now_s) const {
  return !start_ || now_s - start_->wall_s >= min_window_s_;
}

std::optional<int> TeamSizer::observe(const CpuLoadSample& s) {
  if (!s.valid) return std::nullopt;
  if (!start_) {
    start_ = s;
    return std::nullopt;
  }
  const double wall = s.wall_s - start_->wall_s;
  if (wall < min_window_s_) return std::nullopt;
  others_ = std::max(0.0, ((s.busy_s - start_->busy_s) - (s.own_s - start_->own_s)) / wall);
  start_ = s;
  // The margin: a background process using under a third of a CPU leaves the team whole.
  constexpr double kMargin = 0.3;
  const int want = std::clamp(static_cast<int>(std::floor(cpus_ - others_ + kMargin)), 1, most_);
  const bool confirmed = want == pending_;
  pending_ = want;
  if (!confirmed || want == team_) return std::nullopt;
  team_ = want;
  return team_;
}

}  // namespace hetrain
