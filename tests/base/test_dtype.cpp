#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "hetrain/base/dtype.h"
#include "hetrain/base/error.h"
#include "hetrain/base/shape.h"

using namespace hetrain;

TEST(Dtype, HalfKnownBitPatterns) {
  EXPECT_EQ(float_to_half(1.0f), 0x3c00);
  EXPECT_EQ(float_to_half(-2.0f), 0xc000);
  EXPECT_EQ(float_to_half(65504.0f), 0x7bff);
  EXPECT_EQ(float_to_half(65520.0f), 0x7c00);        // rounds up to inf
  EXPECT_EQ(float_to_half(5.9604645e-08f), 0x0001);  // smallest subnormal
  EXPECT_EQ(float_to_half(2.9802322e-08f), 0x0000);  // exactly half of it: ties to even (0)
  EXPECT_EQ(float_to_half(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_TRUE(std::isnan(half_to_float(float_to_half(NAN))));
  // 1 + 2^-11 is halfway between 1 and the next half; ties to even -> 1.
  EXPECT_EQ(float_to_half(1.0f + std::ldexp(1.0f, -11)), 0x3c00);
  // 1 + 3*2^-11 is halfway between 1+2^-10 (odd) and 1+2^-9 (even) -> even.
  EXPECT_EQ(float_to_half(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
}

TEST(Dtype, HalfRoundTripAllFinite) {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    uint16_t h = static_cast<uint16_t>(b);
    float f = half_to_float(h);
    if (std::isnan(f)) continue;
    ASSERT_EQ(float_to_half(f), h) << "bits " << b;
  }
}

// Every half against its value from the definition, and float -> half at, just above and just
// below every midpoint between neighbouring halves (ties to even).
TEST(Dtype, HalfConversionsMatchTheDefinitionEverywhere) {
  auto value = [](uint32_t b) {
    const int e = static_cast<int>((b >> 10) & 0x1f), m = static_cast<int>(b & 0x3ff);
    const double mag = e == 0 ? std::ldexp(m, -24) : std::ldexp(1024 + m, e - 25);
    return (b & 0x8000) ? -mag : mag;
  };
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const float f = half_to_float(static_cast<uint16_t>(b));
    if (((b >> 10) & 0x1f) == 0x1f) {
      EXPECT_EQ(std::isnan(f), (b & 0x3ff) != 0) << b;
      continue;
    }
    ASSERT_EQ(static_cast<double>(f), value(b)) << "bits " << b;
  }
  for (uint32_t b = 0; b < 0x7bff; ++b) {
    const float lo = half_to_float(static_cast<uint16_t>(b));
    const float hi = half_to_float(static_cast<uint16_t>(b + 1));
    const float mid = static_cast<float>((static_cast<double>(lo) + hi) / 2);  // exact
    const uint16_t even = (b & 1) ? static_cast<uint16_t>(b + 1) : static_cast<uint16_t>(b);
    for (float sign : {1.0f, -1.0f}) {
      const uint16_t s = sign < 0 ? 0x8000 : 0;
      ASSERT_EQ(float_to_half(sign * mid), s | even) << "bits " << b;
      ASSERT_EQ(float_to_half(sign * std::nextafter(mid, 1e9f)), s | (b + 1)) << "bits " << b;
      ASSERT_EQ(float_to_half(sign * std::nextafter(mid, 0.0f)), s | b) << "bits " << b;
    }
  }
  // Between the largest half and 65520 rounds down; from 65520 up overflows to inf.
  EXPECT_EQ(float_to_half(65519.99f), 0x7bff);
  EXPECT_EQ(float_to_half(-1e10f), 0xfc00);
  EXPECT_EQ(float_to_half(-0.0f), 0x8000);
}

TEST(Dtype, Bf16RoundsToNearestEven) {
  EXPECT_EQ(float_to_bf16(1.0f), 0x3f80);
  // 1 + 2^-8 is halfway between 1 and 1+2^-7: ties to even -> 1.
  EXPECT_EQ(float_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  EXPECT_EQ(float_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  EXPECT_FLOAT_EQ(bf16_to_float(0x4049), 3.140625f);
}

TEST(Dtype, Promotion) {
  EXPECT_EQ(promote_types(Dtype::f16, Dtype::bf16), Dtype::f32);
  EXPECT_EQ(promote_types(Dtype::i64, Dtype::f16), Dtype::f16);
  EXPECT_EQ(promote_types(Dtype::f32, Dtype::f64), Dtype::f64);
  EXPECT_EQ(promote_types(Dtype::boolean, Dtype::i32), Dtype::i32);
  EXPECT_THROW(dtype_from_name("f8"), Error);
}

TEST(Shape, BroadcastAndErrors) {
  EXPECT_EQ(broadcast_shapes({2, 1, 3}, {4, 1}, "add"), (Shape{2, 4, 3}));
  try {
    broadcast_shapes({2, 3}, {4, 3}, "add");
    FAIL();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "[add] shapes (2, 3) and (4, 3) do not broadcast");
  }
  EXPECT_EQ(contiguous_strides({2, 3, 4}), (Strides{12, 4, 1}));
  EXPECT_THROW(normalize_axis(3, 3, "sum"), Error);
  EXPECT_EQ(normalize_axis(-1, 3, "sum"), 2);
}

// The fuzzer's finding: an ONNX model whose shapes multiply past 2^63 made numel() overflow
// (undefined behaviour, then a wrong allocation size). Now the count is checked.
TEST(Shape, ElementCountPast64BitsIsAnError) {
  const Shape huge{int64_t{1} << 32, int64_t{1} << 31, 4};
  try {
    numel(huge);
    FAIL();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(),
                 "[shape] (4294967296, 2147483648, 4) has more elements than a 64-bit count holds");
  }
  EXPECT_THROW(contiguous_strides(huge), Error);
  EXPECT_THROW(split_at(huge, 2), Error);  // the outer count, 2^63, overflows
  EXPECT_EQ(numel(Shape{int64_t{1} << 32, int64_t{1} << 30}), int64_t{1} << 62);  // still fits
  EXPECT_EQ(numel(Shape{}), 1);
  EXPECT_EQ(numel(Shape{3, 0, 5}), 0);
}

#include <omp.h>

#include <set>

#include "hetrain/base/thread_pool.h"

TEST(ThreadPool, ExceptionInAChunkReachesTheCaller) {
  std::atomic<int64_t> covered{0};
  EXPECT_THROW(parallel_for(1000, 10,
                            [&](int64_t b, int64_t e) {
                              covered += e - b;
                              if (b <= 500 && 500 < e) fail("[test] chunk failed");
                            }),
               Error);
  EXPECT_EQ(covered.load(), 1000);  // every other chunk still ran; nothing left running
  int64_t total = 0;
  std::mutex mu;
  parallel_for(1000, 10, [&](int64_t b, int64_t e) {
    std::lock_guard<std::mutex> lk(mu);
    for (int64_t i = b; i < e; ++i) total += i;
  });
  EXPECT_EQ(total, 999 * 1000 / 2);
}

TEST(ThreadPool, ChunksRunOnOpenMpsTeamAndSplitAlikeNestedAndSerial) {
  // The pool's chunks run on OpenMP's team (the one oneDNN's calls use), so the two never
  // compete for the cores; nested and serial calls run the very same chunks one after another.
  set_num_threads(2);
  using Chunks = std::set<std::pair<int64_t, int64_t>>;
  std::mutex mu;
  Chunks top, nested, serial;
  std::set<int> team_sizes;
  parallel_for(100, 1, [&](int64_t b, int64_t e) {
    std::lock_guard<std::mutex> lk(mu);
    top.emplace(b, e);
    team_sizes.insert(omp_get_num_threads());
  });
  EXPECT_EQ(team_sizes, std::set<int>{2});
  EXPECT_EQ(top.size(), 8u);  // 4 chunks per thread
  parallel_for(2, 1, [&](int64_t b, int64_t) {
    if (b != 0) return;
    parallel_for(100, 1, [&](int64_t b2, int64_t e2) {
      std::lock_guard<std::mutex> lk(mu);
      nested.emplace(b2, e2);
    });
  });
  {
    SerialScope one_thread;
    parallel_for(100, 1, [&](int64_t b, int64_t e) { serial.emplace(b, e); });
  }
  EXPECT_EQ(nested, top);
  EXPECT_EQ(serial, top);
  set_num_threads(0);
}

TEST(ThreadPool, ResizesInPlaceSoThatAReferenceOnAnotherThreadStaysGood) {
  // A training run resizes the pool between steps (base/cpu_load.h) while other threads (a data
  // loader, a device worker) may hold the reference thread_pool() gave them.
  ThreadPool& pool = thread_pool();
  set_num_threads(1);
  EXPECT_EQ(&thread_pool(), &pool);
  EXPECT_EQ(pool.size(), 1);
  EXPECT_EQ(omp_get_max_threads(), 1);  // this thread's oneDNN calls follow
  set_num_threads(2);
  EXPECT_EQ(&thread_pool(), &pool);
  EXPECT_EQ(pool.size(), 2);
  EXPECT_EQ(omp_get_max_threads(), 2);
  std::set<int> team_sizes;
  std::mutex mu;
  pool.parallel_for(100, 1, [&](int64_t, int64_t) {
    std::lock_guard<std::mutex> lk(mu);
    team_sizes.insert(omp_get_num_threads());
  });
  EXPECT_EQ(team_sizes, std::set<int>{2});
  set_num_threads(0);
}
