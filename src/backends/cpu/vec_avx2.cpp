#include <immintrin.h>

#include <cmath>

#include "backends/cpu/vec.h"
#include "hetrain/base/cpu_features.h"
#include "hetrain/base/dtype.h"

namespace hetrain::cpu {

namespace {

__attribute__((target("avx,f16c"))) void f16_to_f32_f16c(const uint16_t* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i,
                     _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i))));
  for (; i < n; ++i) y[i] = half_to_float(x[i]);
}

__attribute__((target("avx,f16c"))) void f32_to_f16_f16c(const float* x, uint16_t* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(y + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
  for (; i < n; ++i) y[i] = float_to_half(x[i]);
}

}  // namespace

void f16_to_f32(const uint16_t* x, float* y, int64_t n) {
  static const bool f16c = cpu_features().f16c && cpu_features().avx2;
  if (f16c) {
    f16_to_f32_f16c(x, y, n);
    return;
  }
  for (int64_t i = 0; i < n; ++i) y[i] = half_to_float(x[i]);
}

void f32_to_f16(const float* x, uint16_t* y, int64_t n) {
  static const bool f16c = cpu_features().f16c && cpu_features().avx2;
  if (f16c) {
    f32_to_f16_f16c(x, y, n);
    return;
  }
  for (int64_t i = 0; i < n; ++i) y[i] = float_to_half(x[i]);
}

}  // namespace hetrain::cpu
