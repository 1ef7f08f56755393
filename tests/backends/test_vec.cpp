// The run-time-selected vector kernels against the C library, across the range and at the
// edges (overflow to inf, subnormal results, nan), with lengths that leave vector tails.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "backends/cpu/vec.h"
#include "hetrain/graph/ops.h"

using namespace hetrain;

TEST(Vec, ExpMatchesLibmWithin2Ulp) {
  std::vector<float> x;
  for (float v = -110.0f; v <= 95.0f; v += 0.0137f) x.push_back(v);
  const float inf = std::numeric_limits<float>::infinity();
  for (float v : {0.0f, -0.0f, 1.0f, -1.0f, 88.0f, 88.72f, 88.73f, -87.0f, -87.5f, -103.0f, -104.0f,
                  inf, -inf, std::numeric_limits<float>::quiet_NaN()})
    x.push_back(v);
  for (int64_t n : {int64_t(x.size()), int64_t(7), int64_t(9), int64_t(17)}) {
    std::vector<float> y(static_cast<size_t>(n));
    cpu::exp_f32(x.data() + (x.size() - static_cast<size_t>(n)), y.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      const float xi = x[x.size() - static_cast<size_t>(n) + static_cast<size_t>(i)];
      const float want = std::exp(xi);
      const float got = y[static_cast<size_t>(i)];
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(got)) << xi;
      } else if (std::isinf(want) || want == 0.0f || !std::isnormal(want)) {
        EXPECT_EQ(got, want) << "exp(" << xi << ")";
      } else {
        // 2 ulp of the float result.
        const float ulp = std::nextafter(want, inf) - want;
        EXPECT_LE(std::abs(got - want), 2 * ulp) << "exp(" << xi << ")";
      }
    }
  }
}

// An element's result depends on its value only, not on where in a run it sits: the same
// values at every offset and run length (tails of 1 to 7 included) give the same bits (a fused
// chain's blocks and each thread's share end at other places than a whole tensor's run).
TEST(Vec, ExpGivesTheSameBitsWhereverARunEnds) {
  std::vector<float> x;
  for (float v = -90.0f; v <= 90.0f; v += 0.731f) x.push_back(v);
  std::vector<float> whole(x.size());
  cpu::exp_f32(x.data(), whole.data(), static_cast<int64_t>(x.size()));
  for (size_t start : {size_t(0), size_t(3), size_t(9)})
    for (size_t len = 1; len <= 19; ++len) {
      std::vector<float> part(len);
      cpu::exp_f32(x.data() + start, part.data(), static_cast<int64_t>(len));
      for (size_t i = 0; i < len; ++i)
        ASSERT_EQ(part[i], whole[start + i])
            << "exp(" << x[start + i] << ") at " << i << " of " << len;
    }
}

TEST(Vec, ExpOpUsesTheKernelOnContiguousAndStridedInputs) {
  // Through the op: contiguous (vector path) and a transposed view (strided path) agree.
  Tensor x = rand({33, 65}, -20, 20, Dtype::f32);
  auto a = exp(x).to_vector<double>();
  auto b = exp(transpose(x, 0, 1)).to_vector<double>();
  auto xs = x.to_vector<double>();
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_NEAR(a[i], std::exp(xs[i]), 3e-7 * std::exp(xs[i])) << i;
  for (int64_t r = 0; r < 33; ++r)
    for (int64_t c = 0; c < 65; ++c)
      EXPECT_NEAR(b[static_cast<size_t>(c * 33 + r)], a[static_cast<size_t>(r * 65 + c)],
                  3e-7 * a[static_cast<size_t>(r * 65 + c)]);
}

// F16C conversions give the scalar conversions' bits: every half value to f32, and f32 values
// across the half range (ties, subnormals, overflow to inf) back, with a vector tail.
TEST(Vec, HalfConversionsMatchScalar) {
  std::vector<uint16_t> h(65536 + 3);
  for (size_t i = 0; i < h.size(); ++i) h[i] = static_cast<uint16_t>(i);
  std::vector<float> f(h.size());
  cpu::f16_to_f32(h.data(), f.data(), static_cast<int64_t>(h.size()));
  for (size_t i = 0; i < h.size(); ++i) {
    const float want = half_to_float(h[i]);
    if (std::isnan(want))
      EXPECT_TRUE(std::isnan(f[i])) << i;
    else
      EXPECT_EQ(f[i], want) << i;
  }
  std::vector<float> x;
  for (float v = -70000.0f; v <= 70000.0f; v += 3.37f) x.push_back(v);
  for (float v = -1e-4f; v <= 1e-4f; v += 1.3e-8f) x.push_back(v);  // subnormal halves
  for (uint16_t b = 0; b < 0x7c00; b += 7) {                        // exact ties
    x.push_back(0.5f * (half_to_float(b) + half_to_float(static_cast<uint16_t>(b + 1))));
  }
  x.push_back(std::numeric_limits<float>::infinity());
  x.push_back(65520.0f);  // rounds to inf
  std::vector<uint16_t> y(x.size());
  cpu::f32_to_f16(x.data(), y.data(), static_cast<int64_t>(x.size()));
  for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(y[i], float_to_half(x[i])) << x[i];
}
