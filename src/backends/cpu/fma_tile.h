// The AVX2 register tile that the direct and the Winograd convolutions multiply with, and the
// split of a channel range into blocks of its rows. One definition, so a tuning of the tile
// (rows, vectors, unrolling) reaches both.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>

namespace hetrain::cpu {

/// Rows (output channels) of a register tile: 4 rows x 3 vectors = 12 accumulators, plus 3
/// loaded vectors and one broadcast, fill AVX2's 16 registers.
inline constexpr int kTileRows = 4;
/// Vectors of 8 columns in a full register tile.
inline constexpr int kTileVecs = 3;

/// out[r * ldo + 8 v + i] (+)= sum over k < K of *wt(k, r) * src(k)[8 v + i], for R rows and
/// NV vectors of 8 floats: src(k) gives the k-th input row, wt(k, r) the address of the value
/// broadcast to row r (both address computations, inlined). Accumulate adds the sums to out
/// instead of storing them.
template <int R, int NV, bool Accumulate, class Src, class Wt>
__attribute__((target("avx2,fma"), always_inline)) inline void fma_tile_at(Src src, Wt wt,
                                                                           int64_t K, float* out,
                                                                           int64_t ldo) {
  __m256 acc[R][NV];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 3
    for (int v = 0; v < NV; ++v) acc[r][v] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K; ++k) {
    const float* s = src(k);
    __m256 xv[NV];
#pragma GCC unroll 3
    for (int v = 0; v < NV; ++v) xv[v] = _mm256_loadu_ps(s + 8 * v);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const __m256 wv = _mm256_broadcast_ss(wt(k, r));
#pragma GCC unroll 3
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm256_fmadd_ps(wv, xv[v], acc[r][v]);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 3
    for (int v = 0; v < NV; ++v) {
      float* d = out + r * ldo + 8 * v;
      _mm256_storeu_ps(d, Accumulate ? _mm256_add_ps(_mm256_loadu_ps(d), acc[r][v]) : acc[r][v]);
    }
}

/// fma_tile_at with the broadcast values packed by pack_tile_rows: w[k * R + r]; stores out.
template <int R, int NV, class Src>
__attribute__((target("avx2,fma"), always_inline)) inline void fma_tile(Src src, const float* w,
                                                                        int64_t K, float* out,
                                                                        int64_t ldo) {
  fma_tile_at<R, NV, false>(
      src, [w](int64_t k, int r) { return w + k * R + r; }, K, out, ldo);
}

/// The weights of rows [0, n) laid out for fma_tile: per block of kTileRows rows starting at r0,
/// [k][r] = weight(r0 + r, k) for its R = min(kTileRows, n - r0) rows, at dst + r0 * K.
template <class Weight>
void pack_tile_rows(int64_t n, int64_t K, Weight weight, float* dst) {
  for (int64_t r0 = 0; r0 < n; r0 += kTileRows) {
    const int64_t R = std::min<int64_t>(kTileRows, n - r0);
    float* blk = dst + r0 * K;
    for (int64_t k = 0; k < K; ++k)
      for (int64_t r = 0; r < R; ++r) blk[k * R + r] = weight(r0 + r, k);
  }
}

/// Calls f.template operator()<R>(r0) for r0 = 0, kTileRows, ... < n with R = min(kTileRows,
/// n - r0): the tile's row count as a compile-time constant, the last block possibly shorter.
template <class F>
inline void for_row_blocks(int64_t n, F&& f) {
  for (int64_t r0 = 0; r0 < n; r0 += kTileRows) {
    switch (std::min<int64_t>(kTileRows, n - r0)) {
      case 4:
        f.template operator()<4>(r0);
        break;
      case 3:
        f.template operator()<3>(r0);
        break;
      case 2:
        f.template operator()<2>(r0);
        break;
      default:
        f.template operator()<1>(r0);
        break;
    }
  }
}

/// Calls f.template operator()<NV>(j) over columns [0, n) (a multiple of 8) in register tiles of
/// NV vectors: kTileVecs where it can. A remainder of one vector ends in two tiles of two vectors
/// instead: a one-vector tile has too few accumulators to hide the FMA latency.
template <class F>
__attribute__((target("avx2,fma"), always_inline)) inline void for_column_tiles(int64_t n, F&& f) {
  int64_t j = 0;
  const int64_t full = n % 24 == 8 && n > 8 ? n - 32 : n;
  for (; j + 8 * kTileVecs <= full; j += 8 * kTileVecs) f.template operator()<kTileVecs>(j);
  for (; j + 16 <= n; j += 16) f.template operator()<2>(j);
  if (j < n) f.template operator()<1>(j);
}

}  // namespace hetrain::cpu
