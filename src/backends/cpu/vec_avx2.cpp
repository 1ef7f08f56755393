#include <immintrin.h>

#include <cmath>

#include "backends/cpu/vec.h"
#include "hetrain/base/cpu_features.h"
#include "hetrain/base/dtype.h"

namespace hetrain::cpu {

namespace {

/// Cephes-style expf on 8 lanes: x = n ln2 + r with |r| <= ln2/2, exp(r) by a degree-6
/// polynomial, 2^n from the exponent bits. Lanes outside [-87, 88] (and NaN) are recomputed
/// with std::exp.
__attribute__((target("avx2,fma"))) inline void exp8_avx2(const float* xi, float* yi) {
  const __m256 log2e = _mm256_set1_ps(1.44269504088896341f);
  const __m256 c1 = _mm256_set1_ps(0.693359375f), c2 = _mm256_set1_ps(-2.12194440e-4f);
  const __m256 p0 = _mm256_set1_ps(1.9875691500e-4f), p1 = _mm256_set1_ps(1.3981999507e-3f),
               p2 = _mm256_set1_ps(8.3334519073e-3f), p3 = _mm256_set1_ps(4.1665795894e-2f),
               p4 = _mm256_set1_ps(1.6666665459e-1f), p5 = _mm256_set1_ps(5.0000001201e-1f);
  const __m256 one = _mm256_set1_ps(1.0f), lo = _mm256_set1_ps(-87.0f), hi = _mm256_set1_ps(88.0f);
  const __m256 v = _mm256_loadu_ps(xi);
  const __m256 k =
      _mm256_round_ps(_mm256_mul_ps(v, log2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(k, c1, v);
  r = _mm256_fnmadd_ps(k, c2, r);
  __m256 p = _mm256_fmadd_ps(p0, r, p1);
  p = _mm256_fmadd_ps(p, r, p2);
  p = _mm256_fmadd_ps(p, r, p3);
  p = _mm256_fmadd_ps(p, r, p4);
  p = _mm256_fmadd_ps(p, r, p5);
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, one));
  const __m256i e =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
  _mm256_storeu_ps(yi, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
  // Ordered compares: NaN fails both, so it takes the scalar path too.
  const __m256 ok =
      _mm256_and_ps(_mm256_cmp_ps(v, lo, _CMP_GE_OQ), _mm256_cmp_ps(v, hi, _CMP_LE_OQ));
  const int bad = ~_mm256_movemask_ps(ok) & 0xff;
  if (bad)
    for (int j = 0; j < 8; ++j)
      if (bad & (1 << j)) yi[j] = std::exp(xi[j]);
}

// The tail goes through the same 8 lanes (padded), so an element's result depends on its value
// only, never on where a run of elements ends (a thread's share, a fused chain's block).
__attribute__((target("avx2,fma"))) void exp_f32_avx2(const float* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) exp8_avx2(x + i, y + i);
  if (i < n) {
    float xt[8] = {}, yt[8];
    for (int64_t j = i; j < n; ++j) xt[j - i] = x[j];
    exp8_avx2(xt, yt);
    for (int64_t j = i; j < n; ++j) y[j] = yt[j - i];
  }
}

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

void exp_f32(const float* x, float* y, int64_t n) {
  static const bool avx2 = cpu_features().avx2 && cpu_features().fma;
  if (avx2) {
    exp_f32_avx2(x, y, n);
    return;
  }
  for (int64_t i = 0; i < n; ++i) y[i] = std::exp(x[i]);
}

}  // namespace hetrain::cpu
