#include "hetrain/memory/process_memory.h"

#include <fstream>
#include <sstream>
#include <string>

namespace hetrain {

std::optional<ProcessMemory> process_memory() {
  std::ifstream f("/proc/self/status");
  if (!f) return std::nullopt;
  ProcessMemory m;
  bool rss = false, hwm = false;
  std::string line;
  while (std::getline(f, line)) {
    // Lines read "VmRSS:     123456 kB".
    auto field = [&](const char* key, int64_t& out, bool& found) {
      const std::string k = key;
      if (line.compare(0, k.size(), k) != 0) return;
      std::istringstream is(line.substr(k.size()));
      int64_t kib = 0;
      if (is >> kib) {
        out = kib * 1024;
        found = true;
      }
    };
    field("VmRSS:", m.rss_bytes, rss);
    field("VmHWM:", m.peak_rss_bytes, hwm);
  }
  if (!rss || !hwm) return std::nullopt;
  return m;
}

bool reset_peak_rss() {
  std::ofstream f("/proc/self/clear_refs");
  if (!f) return false;
  f << "5";
  f.flush();
  return static_cast<bool>(f);
}

RssGrowth::RssGrowth() {
  if (!reset_peak_rss()) return;
  if (auto m = process_memory()) start_ = m->rss_bytes;
}

std::optional<int64_t> RssGrowth::bytes() const {
  if (!start_) return std::nullopt;
  auto m = process_memory();
  if (!m) return std::nullopt;
  return m->peak_rss_bytes - *start_;
}

}  // namespace hetrain
