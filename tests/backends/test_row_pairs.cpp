// The AVX2 row helpers of the direct and Winograd convolutions that copy rows of any length:
// every value written, nothing written outside the row.
#include <gtest/gtest.h>

#include <vector>

#include "backends/cpu/row_pairs.h"
#include "hetrain/base/cpu_features.h"

using namespace hetrain;

TEST(RowPairs, CopyRowWritesExactlyTheRow) {
  if (!cpu_features().avx2) GTEST_SKIP() << "needs AVX2";
  constexpr float kCanary = -777.0f;
  for (int64_t n = 0; n <= 41; ++n)
    for (int mode = 0; mode < 4; ++mode) {
      const bool bias = mode & 1, add = mode & 2;
      std::vector<float> s(static_cast<size_t>(n) + 8), a(s.size()), d(s.size() + 16, kCanary);
      for (size_t i = 0; i < s.size(); ++i) {
        s[i] = 0.5f * static_cast<float>(i) + 1.0f;
        a[i] = 100.0f * static_cast<float>(i) - 3.0f;
      }
      float* out = d.data() + 8;  // 8 canaries before the row, at least 8 after it
      if (bias)
        cpu::copy_row<true>(out, s.data(), n, add ? a.data() : nullptr, 0.25f);
      else
        cpu::copy_row(out, s.data(), n, add ? a.data() : nullptr);
      for (int64_t i = -8; i < n + 8; ++i) {
        const auto k = static_cast<size_t>(i);
        const float want =
            i < 0 || i >= n ? kCanary : s[k] + (bias ? 0.25f : 0.0f) + (add ? a[k] : 0.0f);
        ASSERT_EQ(out[i], want) << "n " << n << " bias " << bias << " add " << add << " at " << i;
      }
    }
}

TEST(RowPairs, CopyRowsUsesBothStrides) {
  if (!cpu_features().avx2) GTEST_SKIP() << "needs AVX2";
  const int64_t rows = 3, n = 13, lds = 14, ldd = 17;
  std::vector<float> s(static_cast<size_t>(rows * lds));
  for (size_t i = 0; i < s.size(); ++i) s[i] = static_cast<float>(i);
  std::vector<float> d(static_cast<size_t>(rows * ldd), -1.0f);
  cpu::copy_rows(d.data(), ldd, s.data(), lds, rows, n);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < ldd; ++i)
      EXPECT_EQ(d[static_cast<size_t>(r * ldd + i)],
                i < n ? s[static_cast<size_t>(r * lds + i)] : -1.0f)
          << "row " << r << " column " << i;
}

namespace {
/// load_first's 8 lanes as floats.
__attribute__((target("avx2,fma"))) std::vector<float> load_first_lanes(const float* p, int64_t n) {
  std::vector<float> out(8);
  _mm256_storeu_ps(out.data(), cpu::load_first(p, n));
  return out;
}
}  // namespace

// Rows start at any float, so the pair loads must not assume 8-byte alignment (UBSan found a
// misaligned double load here, reached by fashion-cnn's convolutions).
TEST(RowPairs, LoadFirstAtEveryFloatOffset) {
  if (!cpu_features().avx2) GTEST_SKIP() << "needs AVX2";
  alignas(32) float buf[24];
  for (int i = 0; i < 24; ++i) buf[i] = static_cast<float>(i) + 0.5f;
  for (int offset = 0; offset < 4; ++offset)
    for (int64_t n = -1; n <= 9; ++n) {
      const std::vector<float> lanes = load_first_lanes(buf + offset, n);
      for (int64_t i = 0; i < 8; ++i)
        ASSERT_EQ(lanes[static_cast<size_t>(i)], i < n ? buf[offset + i] : 0.0f)
            << "offset " << offset << " n " << n << " lane " << i;
    }
}
