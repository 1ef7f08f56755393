#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "hetrain/memory/process_memory.h"

using namespace hetrain;

TEST(ProcessMemory, ReadsResidentSet) {
  auto m = process_memory();
  if (!m) GTEST_SKIP() << "no /proc/self/status on this system";
  EXPECT_GT(m->rss_bytes, 0);
  EXPECT_GE(m->peak_rss_bytes, m->rss_bytes);
}

TEST(ProcessMemory, GrowthCountsTouchedPagesAndResetsBetweenMeasurements) {
  if (!process_memory() || !reset_peak_rss()) GTEST_SKIP() << "no /proc/self/clear_refs";
  constexpr size_t kBytes = size_t{64} << 20;
  {
    RssGrowth growth;
    std::vector<char> big(kBytes);
    std::memset(big.data(), 1, big.size());  // make every page resident
    const auto grown = growth.bytes();
    ASSERT_TRUE(grown.has_value());
    EXPECT_GE(*grown, static_cast<int64_t>(kBytes) * 9 / 10);
    EXPECT_LT(*grown, static_cast<int64_t>(kBytes) * 2);
  }
  // The 64 MiB are freed (a block this large goes back to the system); a new measurement that
  // touches little starts from a reset mark and does not see them.
  RssGrowth small;
  std::vector<char> bit(size_t{1} << 20, 1);
  const auto grown = small.bytes();
  ASSERT_TRUE(grown.has_value());
  EXPECT_LT(*grown, static_cast<int64_t>(kBytes) / 4);
}
