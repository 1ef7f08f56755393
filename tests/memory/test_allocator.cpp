// The allocator under pressure: sizes as users write them, a capacity that throws Hetrain's
// out-of-memory error (naming the device, the request, live bytes by tag and the largest
// tensors alive), and the cache given back before the reserved bytes pass the capacity.
#include <gtest/gtest.h>

#include "hetrain/base/byte_size.h"
#include "hetrain/memory/allocator.h"

namespace hetrain {
namespace {

TEST(ByteSize, ParsesUnits) {
  EXPECT_EQ(parse_byte_size("2GiB", "x"), int64_t{2} << 30);
  EXPECT_EQ(parse_byte_size("512MiB", "x"), int64_t{512} << 20);
  EXPECT_EQ(parse_byte_size("1048576", "x"), 1048576);
  EXPECT_EQ(parse_byte_size("1.5KiB", "x"), 1536);
  EXPECT_EQ(parse_byte_size("10MB", "x"), 10000000);
  EXPECT_EQ(parse_byte_size("3 GB", "x"), 3000000000);
  EXPECT_EQ(parse_byte_size("100B", "x"), 100);
}

TEST(ByteSize, RefusesBadText) {
  for (const char* bad : {"", "lots", "-1", "0", "12XB", "2GiBs", "0.5"}) {
    try {
      parse_byte_size(bad, "flag --memory-budget");
      FAIL() << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("flag --memory-budget: expected a size in bytes"),
                std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find("got '" + std::string(bad) + "'"), std::string::npos)
          << e.what();
    }
  }
}

TEST(ByteSize, Formats) {
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(200 * 1024), "200.0 KiB");
  EXPECT_EQ(format_bytes(int64_t{3} << 20), "3.0 MiB");
  EXPECT_EQ(format_bytes(int64_t{5} << 29), "2.50 GiB");
}

TEST(AllocatorCapacity, OutOfMemoryNamesRequestTagsAndLargestTensors) {
  HostAllocator a;
  a.set_capacity(1 << 20, "--memory-budget 1.0 MiB");
  EXPECT_EQ(a.capacity(), 1 << 20);
  const Shape wshape{300, 512};  // 600 KiB of f32
  std::shared_ptr<Buffer> w, x;
  {
    AllocationSiteScope op("matmul");
    AllocationSiteScope arr(&wshape, Dtype::f32);
    w = a.allocate(600 * 1024, MemoryTag::parameters);
  }
  const Shape xshape{75, 1024};
  {
    AllocationSiteScope op("softmax");
    AllocationSiteScope arr(&xshape, Dtype::f32);
    x = a.allocate(300 * 1024, MemoryTag::activations);
  }
  try {
    AllocationSiteScope op("exp");
    a.allocate(200 * 1024, MemoryTag::activations);
    FAIL() << "no out-of-memory error";
  } catch (const OutOfMemoryError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("[memory] out of memory on cpu: exp asks 200.0 KiB (204800 bytes) for "
                     "activations while 900.0 KiB is live of its 1.0 MiB capacity "
                     "(--memory-budget 1.0 MiB)"),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("live by tag: parameters 600.0 KiB, gradients 0 B, optimizer_state 0 B, "
                     "activations 300.0 KiB, workspace 0 B"),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("largest tensors alive: 600.0 KiB parameters f32 (300, 512) from matmul, "
                     "300.0 KiB activations f32 (75, 1024) from softmax"),
              std::string::npos)
        << m;
  }
  // The refused request left the counters as they were; freeing makes room.
  EXPECT_EQ(a.stats().current_total, 900 * 1024);
  x.reset();
  auto y = a.allocate(200 * 1024, MemoryTag::activations);
  EXPECT_EQ(a.stats().current_total, 800 * 1024);
  // A retag moves the block's tag in the report too.
  w->retag(MemoryTag::gradients);
  try {
    a.allocate(300 * 1024, MemoryTag::workspace);
    FAIL() << "no out-of-memory error";
  } catch (const OutOfMemoryError& e) {
    EXPECT_NE(std::string(e.what()).find("600.0 KiB gradients f32 (300, 512) from matmul"),
              std::string::npos)
        << e.what();
  }
  // Lifted: the same request succeeds.
  a.set_capacity(0, "");
  EXPECT_NO_THROW(a.allocate(300 * 1024, MemoryTag::workspace));
}

TEST(AllocatorCapacity, CacheIsGivenBackBeforeReservedPassesCapacity) {
  HostAllocator a;
  a.set_capacity(1 << 20, "test");
  // 512 KiB cached, then 700 KiB asked: the cached block is too small to reuse, and keeping it
  // would hold 1.2 MiB, so it goes back to the system first.
  a.allocate(512 * 1024, MemoryTag::activations).reset();
  EXPECT_EQ(a.stats().reserved, 512 * 1024);
  auto b = a.allocate(700 * 1024, MemoryTag::activations);
  EXPECT_EQ(a.stats().reserved, 700 * 1024);
  EXPECT_EQ(a.stats().peak_reserved, 700 * 1024);
  EXPECT_LE(a.stats().reserved, a.capacity());
  // Without a capacity the cache is kept.
  HostAllocator c;
  c.allocate(512 * 1024, MemoryTag::activations).reset();
  auto d = c.allocate(700 * 1024, MemoryTag::activations);
  EXPECT_EQ(c.stats().reserved, (512 + 700) * 1024);
  EXPECT_EQ(c.stats().peak_reserved, (512 + 700) * 1024);
}

// at_peak: the live bytes by tag when the total peaked, not each tag's own peak.
TEST(AllocatorStats, AtPeakIsWhatWasLiveWhenTheTotalPeaked) {
  HostAllocator a;
  auto idx = [](MemoryTag t) { return static_cast<size_t>(t); };
  auto acts = a.allocate(4096, MemoryTag::activations);
  auto grads = a.allocate(1024, MemoryTag::gradients);
  acts.reset();  // activations peaked at 4096 with 5120 in all
  auto state = a.allocate(8192, MemoryTag::optimizer_state);  // the total's peak: 9216
  state.reset();
  auto more = a.allocate(2048, MemoryTag::activations);  // below the peak: no change
  MemoryStats s = a.stats();
  EXPECT_EQ(s.peak_total, 1024 + 8192);
  EXPECT_EQ(s.peak[idx(MemoryTag::activations)], 4096);
  EXPECT_EQ(s.at_peak[idx(MemoryTag::activations)], 0);
  EXPECT_EQ(s.at_peak[idx(MemoryTag::gradients)], 1024);
  EXPECT_EQ(s.at_peak[idx(MemoryTag::optimizer_state)], 8192);
  // After reset_peak the peaks start again from what is live.
  a.reset_peak();
  s = a.stats();
  EXPECT_EQ(s.peak_total, 1024 + 2048);
  EXPECT_EQ(s.at_peak[idx(MemoryTag::activations)], 2048);
  EXPECT_EQ(s.at_peak[idx(MemoryTag::optimizer_state)], 0);
}

TEST(AllocatorCapacity, NegativeCapacityRefused) {
  HostAllocator a;
  EXPECT_THROW(a.set_capacity(-5, "test"), Error);
}

}  // namespace
}  // namespace hetrain
