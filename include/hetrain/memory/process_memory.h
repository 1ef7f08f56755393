// The process's resident memory as the operating system counts it (Linux /proc). Hetrain's own
// figures come from the allocator's counters (allocator.h); this is the measure another framework
// can be compared on, since it counts the same thing for any process: pages actually held,
// allocator caches and library workspaces included.
#pragma once

#include <cstdint>
#include <optional>

namespace hetrain {

struct ProcessMemory {
  int64_t rss_bytes = 0;       ///< resident now (VmRSS)
  int64_t peak_rss_bytes = 0;  ///< resident high-water mark since start or the last reset (VmHWM)
};

/// Reads /proc/self/status; nullopt where it is not available.
std::optional<ProcessMemory> process_memory();

/// Resets the high-water mark to the current RSS (writes "5" to /proc/self/clear_refs, Linux >=
/// 4.0). Returns false where that is not possible; the mark then keeps counting from the start.
bool reset_peak_rss();

/// Measures the growth of resident memory over a stretch of work: the high-water mark during it
/// minus the RSS at its start. Needs the reset; without it, reports nothing.
class RssGrowth {
 public:
  RssGrowth();  ///< resets the mark and records the RSS at the start
  /// Peak RSS since construction minus the RSS then, or nullopt where it cannot be measured.
  std::optional<int64_t> bytes() const;

 private:
  std::optional<int64_t> start_;
};

}  // namespace hetrain
