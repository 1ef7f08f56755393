// Branch-free math the compiler can vectorise (std::exp is a library call it cannot), plus
// row reductions with several partial accumulators (vectorisable without -ffast-math).
// Loops calling vexp vectorise only where GCC may if-convert float compares: compile them
// with -fno-trapping-math (see the pragma in eval_nn.cpp).
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

#include "hetrain/base/dtype.h"

namespace hetrain::cpu {

/// exp in f32 to about 1 ulp (Cephes expf); 0 below -87.3, clamped at exp(88).
[[gnu::always_inline]] inline float vexp(float x) {
  const bool underflow = x < -87.3f;
  x = x < -87.3f ? -87.3f : x;
  x = x > 88.0f ? 88.0f : x;
  // Round x*log2(e) to the nearest integer with the 1.5*2^23 trick (no SSE4.1 needed).
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t e = static_cast<int32_t>(n) + 127;
  const float scale = std::bit_cast<float>(static_cast<uint32_t>(e) << 23);
  return underflow ? 0.0f : p * scale;
}
inline double vexp(double x) { return std::exp(x); }

/// Max of n values of T in compute precision (NaN propagates).
template <class T>
inline compute_t<T> row_max(const T* x, int64_t n) {
  using C = compute_t<T>;
  C acc[8];
  for (auto& a : acc) a = -INFINITY;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) {
      C v = to_compute(x[i + j]);
      acc[j] = (v > acc[j] || v != v) ? v : acc[j];
    }
  for (; i < n; ++i) {
    C v = to_compute(x[i]);
    acc[0] = (v > acc[0] || v != v) ? v : acc[0];
  }
  C m = acc[0];
  for (int j = 1; j < 8; ++j) m = (acc[j] > m || acc[j] != acc[j]) ? acc[j] : m;
  return m;
}

/// sum over i of f(to_compute(x[i])) with eight partial sums.
template <class T, class F>
inline compute_t<T> row_sum(const T* x, int64_t n, F&& f) {
  using C = compute_t<T>;
  C acc[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += f(to_compute(x[i + j]));
  for (; i < n; ++i) acc[0] += f(to_compute(x[i]));
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

/// Rows per parallel_for chunk so that a chunk holds about this many elements.
inline constexpr int64_t kRowGrainElems = 1 << 14;
inline int64_t row_grain(int64_t row_len) {
  return std::max<int64_t>(1, kRowGrainElems / std::max<int64_t>(row_len, 1));
}

}  // namespace hetrain::cpu
