// AVX2 helpers for rows split into even and odd columns (or into the four columns mod 4) and
// merged back: the Winograd transforms' column pairs and quads, and the direct kernels' stride-2
// phase planes.
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace hetrain::cpu {

/// The first n floats of src (all 8 when n >= 8), zeros after them (all zeros when n <= 0).
/// Loaded by halves, pairs and singles, not vmaskmovps, which is slow on AMD: on Zen 3 the
/// masked tail loads took 86% of split_row's time.
inline __attribute__((target("avx2,fma"))) __m256 load_first(const float* src, int64_t n) {
  if (n >= 8) return _mm256_loadu_ps(src);
  if (n <= 0) return _mm256_setzero_ps();
  // The first m (< 4) floats of p, zeros after them.
  auto part = [](const float* p, int64_t m) {
    __m128 v = _mm_setzero_ps();
    // _mm_loadu_si64: p is only float-aligned (_mm_load_sd's double* would be misaligned).
    if (m & 2) v = _mm_castsi128_ps(_mm_loadu_si64(p));
    if (m & 1) {
      const __m128 last = _mm_load_ss(p + (m & 2));
      v = (m & 2) ? _mm_movelh_ps(v, last) : last;
    }
    return v;
  };
  if (n < 4) return _mm256_castps128_ps256(part(src, n));
  return _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_loadu_ps(src)), part(src + 4, n - 4), 1);
}

/// even[k] = src[2k], odd[k] = src[2k + 1] for the columns of a row of W floats, and zeros after
/// them up to whole vectors: each of even and odd gets a multiple of 8 floats, up to 8 past
/// its W / 2 (rounded up) values.
inline __attribute__((target("avx2,fma"))) void split_row(const float* src, int64_t W, float* even,
                                                          float* odd) {
  for (int64_t k = 0; k < W; k += 16) {
    const __m256 a = load_first(src + k, W - k), b = load_first(src + k + 8, W - k - 8);
    // shuffle_ps pairs within 128-bit lanes; the 64-bit permute puts the pairs in order.
    const __m256d e = _mm256_castps_pd(_mm256_shuffle_ps(a, b, 0x88));
    const __m256d o = _mm256_castps_pd(_mm256_shuffle_ps(a, b, 0xDD));
    _mm256_storeu_ps(even + k / 2, _mm256_castpd_ps(_mm256_permute4x64_pd(e, 0xD8)));
    _mm256_storeu_ps(odd + k / 2, _mm256_castpd_ps(_mm256_permute4x64_pd(o, 0xD8)));
  }
}

/// Stores the first n (< 8) floats of v to d.
inline __attribute__((target("avx2,fma"))) void store_first(float* d, __m256 v, int64_t n) {
  __m128 h = _mm256_castps256_ps128(v);
  if (n & 4) {
    _mm_storeu_ps(d, h);
    h = _mm256_extractf128_ps(v, 1);
    d += 4;
  }
  if (n & 2) {
    _mm_storel_pi(reinterpret_cast<__m64*>(d), h);
    h = _mm_movehl_ps(h, h);
    d += 2;
  }
  if (n & 1) _mm_store_ss(d, h);
}

/// d[i] = s[i] (+ bias where Bias) (+ add[i] where add is not null) for i < n: a short row's copy
/// without a call to memcpy, which cost more than the copy on the direct kernels' 7- to 28-float
/// rows (a fifth of a 1x1 stride-2 convolution's time).
template <bool Bias = false>
inline __attribute__((target("avx2,fma"))) void copy_row(float* d, const float* s, int64_t n,
                                                         const float* add = nullptr,
                                                         float bias = 0.0f) {
  const __m256 bv = _mm256_set1_ps(bias);
  if (n < 8) {
    __m256 v = load_first(s, n);
    if constexpr (Bias) v = _mm256_add_ps(v, bv);
    if (add) v = _mm256_add_ps(v, load_first(add, n));
    store_first(d, v, n);
    return;
  }
  // Whole vectors, the last one ending at n (overlapping the one before: the same values).
  for (int64_t i = 0;; i += 8) {
    if (i + 8 > n) i = n - 8;
    __m256 v = _mm256_loadu_ps(s + i);
    if constexpr (Bias) v = _mm256_add_ps(v, bv);
    if (add) v = _mm256_add_ps(v, _mm256_loadu_ps(add + i));
    _mm256_storeu_ps(d + i, v);
    if (i + 8 == n) break;
  }
}

/// copy_row for `rows` rows of n floats: row r from s + r * lds to d + r * ldd.
inline __attribute__((target("avx2,fma"))) void copy_rows(float* d, int64_t ldd, const float* s,
                                                          int64_t lds, int64_t rows, int64_t n) {
  for (int64_t r = 0; r < rows; ++r) copy_row(d + r * ldd, s + r * lds, n);
}

/// Stores the first n floats of q[0], q[1], ... (n <= 8 * count) to d, plus add where not null,
/// then zero where mask is not null and not > 0 (relu_grad(mask, value)); a last partial vector
/// by halves, not vmaskmovps, which is slow on AMD.
inline __attribute__((target("avx2,fma"))) void store_vectors(float* d, const __m256* q, int count,
                                                              int64_t n, const float* add,
                                                              const float* mask = nullptr) {
  for (int k = 0; k < count && 8 * k < n; ++k) {
    const int64_t left = n - 8 * k;
    __m256 out = add ? _mm256_add_ps(q[k], load_first(add + 8 * k, left)) : q[k];
    if (mask)
      out = _mm256_and_ps(
          out, _mm256_cmp_ps(load_first(mask + 8 * k, left), _mm256_setzero_ps(), _CMP_GT_OQ));
    if (left >= 8)
      _mm256_storeu_ps(d + 8 * k, out);
    else
      store_first(d + 8 * k, out, left);
  }
}

/// q[0] = a[0], b[0], ..., a[3], b[3] and q[1] = a[4], b[4], ..., a[7], b[7] (split_row's
/// inverse for 16 columns).
inline __attribute__((target("avx2,fma"))) void interleave_pairs(__m256 a, __m256 b, __m256 q[2]) {
  const __m256 lo = _mm256_unpacklo_ps(a, b), hi = _mm256_unpackhi_ps(a, b);
  q[0] = _mm256_permute2f128_ps(lo, hi, 0x20);
  q[1] = _mm256_permute2f128_ps(lo, hi, 0x31);
}

/// Stores pairs (a[j], b[j]) (8 tiles' outputs, or a phase row's two halves) to d[2j], d[2j + 1],
/// the first n floats only, plus r[2j], r[2j + 1] where r is not null, masked by mask as
/// store_vectors.
inline __attribute__((target("avx2,fma"))) void store_pairs(float* d, __m256 a, __m256 b, int64_t n,
                                                            const float* r,
                                                            const float* mask = nullptr) {
  __m256 q[2];
  interleave_pairs(a, b, q);
  store_vectors(d, q, 2, n, r, mask);
}

/// The rows of a 4x4 block in each 128-bit half of a, b, c, d, transposed in place (each half
/// separately).
inline __attribute__((target("avx2,fma"))) void transpose_halves(__m256& a, __m256& b, __m256& c,
                                                                 __m256& d) {
  const __m256 t0 = _mm256_unpacklo_ps(a, b), t1 = _mm256_unpackhi_ps(a, b);
  const __m256 t2 = _mm256_unpacklo_ps(c, d), t3 = _mm256_unpackhi_ps(c, d);
  a = _mm256_shuffle_ps(t0, t2, 0x44);
  b = _mm256_shuffle_ps(t0, t2, 0xEE);
  c = _mm256_shuffle_ps(t1, t3, 0x44);
  d = _mm256_shuffle_ps(t1, t3, 0xEE);
}

/// dst[r][k] = src[4k + r] for r < 4 and the columns of a row of W floats, and zeros after them up
/// to whole vectors: each dst[r] gets a multiple of 8 floats, up to 8 past its W / 4 (rounded up)
/// values.
inline __attribute__((target("avx2,fma"))) void split_row4(const float* src, int64_t W,
                                                           float* const dst[4]) {
  // After the transpose, half h of vector r holds columns r, r + 8, r + 16, r + 24 (+ 4 h): the
  // permute puts them in column order.
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int64_t k = 0; k < W; k += 32) {
    __m256 v[4];
    for (int q = 0; q < 4; ++q) v[q] = load_first(src + k + 8 * q, W - k - 8 * q);
    transpose_halves(v[0], v[1], v[2], v[3]);
    for (int r = 0; r < 4; ++r)
      _mm256_storeu_ps(dst[r] + k / 4, _mm256_permutevar8x32_ps(v[r], order));
  }
}

/// q[k] = columns 8k .. 8k + 7 of the row with column 4j + r = v[r][j] (split_row4's inverse):
/// q[0] and q[1] hold tiles 0-3 of 8 four-column tiles, q[2] and q[3] tiles 4-7.
inline __attribute__((target("avx2,fma"))) void interleave_quads(const __m256 v[4], __m256 q[4]) {
  const __m256i order = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
  for (int r = 0; r < 4; ++r) q[r] = _mm256_permutevar8x32_ps(v[r], order);
  // Half h of q[r] now holds v[r][h], v[r][h + 2], v[r][h + 4], v[r][h + 6]; transposed, vector
  // k is columns 8k .. 8k + 7.
  transpose_halves(q[0], q[1], q[2], q[3]);
}

/// d[4j + r] = v[r][j] (split_row4's inverse), the first n floats only, plus add[4j + r] where
/// add is not null.
inline __attribute__((target("avx2,fma"))) void store_quads(float* d, const __m256 v[4], int64_t n,
                                                            const float* add) {
  __m256 q[4];
  interleave_quads(v, q);
  store_vectors(d, q, 4, n, add);
}

}  // namespace hetrain::cpu
