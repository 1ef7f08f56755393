// The CPU backend's vector math: its f32 exp and the run-time-selected half conversions,
// against the C library and the scalar conversions, at the edges and with vector tails.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <vector>

#include "backends/cpu/vec.h"
#include "backends/cpu/vec_math.h"
#include "hetrain/graph/ops.h"

using namespace hetrain;

// cpu::vexp, the backend's one f32 exp, against the C library across the range and at every
// documented edge: overflow to inf, subnormal results, underflow to 0, infinities and NaN.
namespace {
void expect_exp_close(float x, float got) {
  const float want = std::exp(x);
  const float inf = std::numeric_limits<float>::infinity();
  if (std::isnan(want)) {
    EXPECT_TRUE(std::isnan(got)) << "exp(" << x << ")";
  } else if (std::isinf(want) || want == 0.0f) {
    EXPECT_EQ(got, want) << "exp(" << x << ")";
  } else if (!std::isnormal(want)) {
    // Subnormal: one unit of the smallest subnormal.
    EXPECT_LE(std::abs(got - want), std::numeric_limits<float>::denorm_min()) << "exp(" << x << ")";
  } else {
    const float ulp = std::nextafter(want, inf) - want;
    EXPECT_LE(std::abs(got - want), 2 * ulp) << "exp(" << x << ")";
  }
}

std::vector<float> exp_inputs() {
  std::vector<float> x;
  for (float v = -110.0f; v <= 95.0f; v += 0.0137f) x.push_back(v);
  const float inf = std::numeric_limits<float>::infinity();
  for (float v : {0.0f,     -0.0f,
                  1.0f,     -1.0f,
                  88.0f,    88.5f,
                  88.72f,   88.7228f,
                  88.73f,   -87.0f,
                  -87.3f,   -87.33f,
                  -87.34f,  -87.5f,
                  -100.0f,  -103.0f,
                  -103.97f, -103.98f,
                  -104.0f,  inf,
                  -inf,     std::numeric_limits<float>::quiet_NaN()})
    x.push_back(v);
  return x;
}
}  // namespace

TEST(Vec, ExpMatchesLibmWithin2UlpAndAtTheEdges) {
  for (float v : exp_inputs()) expect_exp_close(v, cpu::vexp(v));
}

// Through the Exp op every layout and length runs the same compiled loop (a vector one where
// the CPU has AVX2+FMA): contiguous runs of any length (vector tails), a transposed view and a
// column of a wider tensor give each element the same bits, all within the bounds above.
TEST(Vec, ExpOpGivesTheSameBitsForEveryLayoutAndLength) {
  const std::vector<float> xs = exp_inputs();
  const auto n = static_cast<int64_t>(xs.size());
  Tensor x = from_vector(xs, {n});
  const std::vector<float> whole = exp(x).to_vector<float>();
  for (int64_t i = 0; i < n; ++i)
    expect_exp_close(xs[static_cast<size_t>(i)], whole[static_cast<size_t>(i)]);
  for (int64_t start : {0, 3, 9})
    for (int64_t len = 1; len <= 19; ++len) {
      const std::vector<float> part = exp(slice(x, 0, start, start + len)).to_vector<float>();
      for (int64_t i = 0; i < len; ++i)
        ASSERT_EQ(part[static_cast<size_t>(i)], whole[static_cast<size_t>(start + i)])
            << "exp(" << xs[static_cast<size_t>(start + i)] << ") at " << i << " of " << len;
    }
  // Strided: the same values as the column of a [n, 3] tensor, read through a transpose.
  std::vector<float> wide(static_cast<size_t>(n * 3), 0.5f);
  for (int64_t i = 0; i < n; ++i) wide[static_cast<size_t>(i * 3 + 1)] = xs[static_cast<size_t>(i)];
  const std::vector<float> col =
      exp(transpose(from_vector(wide, {n, 3}), 0, 1)).to_vector<float>();  // [3, n]
  for (int64_t i = 0; i < n; ++i)
    ASSERT_EQ(std::bit_cast<uint32_t>(col[static_cast<size_t>(n + i)]),
              std::bit_cast<uint32_t>(whole[static_cast<size_t>(i)]))
        << "exp(" << xs[static_cast<size_t>(i)] << ") strided";
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
