// The register tile that the direct and the Winograd convolutions multiply with, written once for
// every vector width, and the split of a channel range into blocks of its rows and of a column
// range into tiles. One definition, so a tuning of the tile (rows, vectors, unrolling) reaches
// both kernels and both widths.
//
// The tile is written over GCC's vector extension (F32Vec<I>: 8 floats at AVX2, 16 at AVX-512)
// in always-inline templates without a target of their own, so that each is compiled into the
// target-specific function that calls it: tile_dispatch<K> calls K::run<Isa::avx512> from an
// AVX-512 function or K::run<Isa::avx2> from an AVX2 one (isa.h's run_avx512 / run_avx2), and
// every template and lambda on the way is always_inline (a lambda does not take its enclosing
// function's target: one left out of line would run its vectors at SSE width). `w * x + acc` is
// one FMA per lane: the files that include this header compile with GCC's default
// -ffp-contract=fast (they are not in CMakeLists.txt's -ffp-contract=off list), so each product
// is added with one rounding, in the same order at every width; the conv tests check the forward
// results bit for bit against a scalar std::fma chain at each width.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <utility>

#include "backends/cpu/isa.h"

namespace hetrain::cpu {

template <int Lanes>
struct F32VecOf {
  typedef float type __attribute__((vector_size(4 * Lanes)));
};
/// A vector of f32 as wide as one register at I (AVX2: 8 lanes, AVX-512: 16).
template <Isa I>
using F32Vec = typename F32VecOf<f32_lanes(I)>::type;
/// Lanes of an F32Vec type.
template <class V>
inline constexpr int kLanes = static_cast<int>(sizeof(V) / sizeof(float));

/// v = the kLanes<V> floats at p (no alignment needed).
template <class V>
[[gnu::always_inline]] inline void vload(V& v, const float* p) {
  std::memcpy(&v, p, sizeof v);
}
template <class V>
[[gnu::always_inline]] inline void vstore(float* p, const V& v) {
  std::memcpy(p, &v, sizeof v);
}
/// Rows (output channels) of a register tile at every width, so that weights packed by
/// pack_tile_rows serve both: at AVX2, 4 rows x 3 vectors = 12 accumulators, plus 3 loaded
/// vectors and one broadcast, fill the 16 registers; at AVX-512, 4 x 4 use 21 of 32. Against 4 x 3
/// and 4 x 6 at AVX-512 (bench_conv BM_ConvAB/[1236]/[01]/6/7, Xeon, 2 threads), 4 x 4 was as
/// fast on the Winograd layers and the fastest on the direct 16 -> 32 stride-2 passes (0.68-0.72x
/// the AVX2 time, against 0.72-0.75x and 1.51-1.64x).
inline constexpr int kTileRows = 4;
/// Vectors in a full register tile at I.
template <Isa I>
inline constexpr int kTileVecs = I == Isa::avx512 ? 4 : 3;
/// Columns of the widest register tile at any width.
inline constexpr int64_t kMaxTileColumns = 16 * kTileVecs<Isa::avx512>;

/// out[r * ldo + L v + i] (+)= sum over k < K of *wt(k, r) * src(k)[L v + i], for R rows and NV
/// vectors of L = kLanes<V> floats: src(k) gives the k-th input row, wt(k, r) the address of the
/// value broadcast to row r (both address computations, inlined; the product is vector times
/// scalar, which GCC broadcasts: a vector built from the scalar first was split into 128-bit
/// pieces through the stack where the SLP vectoriser saw four adjacent weights). Accumulate adds
/// the sums to out instead of storing them. Each sum is an FMA chain in k order, the same bits at
/// every width.
template <class V, int R, int NV, bool Accumulate, class Src, class Wt>
[[gnu::always_inline]] inline void fma_tile_at(Src src, Wt wt, int64_t K, float* out, int64_t ldo) {
  constexpr int L = kLanes<V>;
  V acc[R][NV];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[r][v] = V{};
  for (int64_t k = 0; k < K; ++k) {
    const float* s = src(k);
    V xv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) vload(xv[v], s + L * v);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const float w = *wt(k, r);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[r][v] = w * xv[v] + acc[r][v];
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      float* d = out + r * ldo + L * v;
      if constexpr (Accumulate) {
        V o;
        vload(o, d);
        vstore(d, o + acc[r][v]);
      } else {
        vstore(d, acc[r][v]);
      }
    }
}

/// fma_tile_at with the broadcast values packed by pack_tile_rows: w[k * R + r]; stores out.
template <class V, int R, int NV, class Src>
[[gnu::always_inline]] inline void fma_tile(Src src, const float* w, int64_t K, float* out,
                                            int64_t ldo) {
  fma_tile_at<V, R, NV, false>(
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

/// f.template operator()<B>(i) with B = n as a compile-time constant, for n in [1, Max].
template <int Max, class F>
[[gnu::always_inline]] inline void with_count(int64_t n, int64_t i, F&& f) {
  if constexpr (Max > 1) {
    if (n < Max) return with_count<Max - 1>(n, i, std::forward<F>(f));
  }
  f.template operator()<Max>(i);
}

/// Calls f.template operator()<B>(i) for i = 0, Max, 2 Max, ... < n with B = min(Max, n - i):
/// the block's size as a compile-time constant, the last block possibly shorter.
template <int Max, class F>
[[gnu::always_inline]] inline void for_blocks(int64_t n, F&& f) {
  for (int64_t i = 0; i < n; i += Max) with_count<Max>(std::min<int64_t>(Max, n - i), i, f);
}

/// for_blocks over rows in blocks of kTileRows.
template <class F>
[[gnu::always_inline]] inline void for_row_blocks(int64_t n, F&& f) {
  for_blocks<kTileRows>(n, std::forward<F>(f));
}

/// Calls f.template operator()<V, NV>(j) over columns [0, n) (a multiple of 8) in register tiles
/// of NV vectors V: kTileVecs<I> vectors of F32Vec<I> where it can. At AVX2 a remainder of one
/// vector ends in two tiles of two vectors instead (a one-vector tile has too few accumulators to
/// hide the FMA latency); at AVX-512 the remainder takes one tile of its whole 16-lane vectors
/// and, where 8 columns are left, one AVX2-width vector.
template <Isa I, class F>
[[gnu::always_inline]] inline void for_column_tiles(int64_t n, F&& f) {
  using V = F32Vec<I>;
  constexpr int L = kLanes<V>, NV = kTileVecs<I>;
  int64_t j = 0;
  if constexpr (I == Isa::avx512) {
    for (; j + L * NV <= n; j += L * NV) f.template operator()<V, NV>(j);
    if (const int64_t rest = (n - j) / L; rest > 0) {
      with_count<NV - 1>(
          rest, j, [&]<int B>(int64_t i) __attribute__((always_inline)) {
            f.template operator()<V, B>(i);
          });
      j += rest * L;
    }
    if (j < n) f.template operator()<F32Vec<Isa::avx2>, 1>(j);
  } else {
    const int64_t full = n % (L * NV) == L && n > L ? n - 4 * L : n;
    for (; j + L * NV <= full; j += L * NV) f.template operator()<V, NV>(j);
    for (; j + 2 * L <= n; j += 2 * L) f.template operator()<V, 2>(j);
    if (j < n) f.template operator()<V, 1>(j);
  }
}

/// K::run<I>(a...) at the width of the conv tiles: AVX-512 where vector_isa() is (as
/// HETRAIN_CPU_ISA or set_vector_isa lower it), else AVX2 + FMA, which the kernels' applies()
/// require of the CPU.
template <class K, class... A>
void tile_dispatch(A&&... a) {
  if (vector_isa() == Isa::avx512)
    run_avx512<K>(std::forward<A>(a)...);
  else
    run_avx2<K>(std::forward<A>(a)...);
}

}  // namespace hetrain::cpu
