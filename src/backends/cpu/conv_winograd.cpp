// Winograd F(2x2, 3x3) and F(4x4, 3x3) convolution on AVX2 + FMA or AVX-512 (see
// conv_winograd.h).
//
// Forward, per m x m output tile: Y = A^T [U ⊙ V] A with U = G g G^T ((m+2) x (m+2), per output
// and input channel) and V = B^T d B (d the tile's (m+2) x (m+2) input patch; patches overlap by
// 2). Summed over input channels this is, for each of the (m+2)^2 positions p of a tile, a GEMM
// M_p = U_p V_p with U_p (O, C) and V_p (C, tiles). The input gradient is the same on the output
// gradient with the kernel rotated 180 degrees, O and C swapped and padding 2 - p. The weight
// gradient is dg = G^T dU G with dU_p = sum over tiles of (A dY A^T)_p V_p^T. Where the output
// (the input, for the input gradient) is 20 wide or more, tiles are 4x4: 36 products per 16
// outputs instead of 16 per 4 (0.56x the GEMM work) and 0.56x the transformed data, at 5-10x the
// rounding error of 2x2 tiles (the transforms scale by up to 8; still ~5e-6 of the output's
// scale). Narrower outputs keep 2x2 tiles, whose tile rows fill more of a vector's 8 lanes,
// except in the forward passes at 13 to 16 wide, where 4x4 tile rows of 4 tiles pair up (see
// tile_size).
//
// The work runs in blocks of whole images, sized so that a block's transformed arrays stay in L2
// as far as one image allows; in a block, tile rows (the tw tiles of an image that share output
// rows) are laid side by side. The input and output transforms are vectorised across 8 tiles of
// a row: each input row is split once into its m column phases (columns mod m), so that the
// m + 2 columns a tile reads are plain unaligned loads. A row's last vector spills into the next
// tile row's columns, which that row overwrites; the arrays have room for the last row's spill.
// Tile rows of 4 tiles (7 or 8 wide at 2x2, 13 to 16 at 4x4) go two to a vector instead, each
// 128-bit half loaded from and stored to its own rows. The
// forward GEMM's register tile is conv_direct.cpp's (fma_tile.h): 4 output channels by 3 vectors
// of tiles at AVX2 (24 tiles) or 4 at AVX-512 (64), one source for both widths. The weight
// gradient transforms the output gradient across 8 channels instead (after 8 x 8 transposes of
// its rows), so that its GEMM has the same shape: 4 input channels by 3 or 4 vectors of output
// channels, summed over a block's tiles in registers.
//
// The transforms and loop drivers are compiled for AVX2 (8 tiles a vector, at every width):
// calling AVX2 kernels once per tile row from baseline (SSE) code made the output transform
// several times slower than the same code called from AVX2 code (forward 16->16 @28x28 went from
// ~45 to ~85 GFLOP/s-equivalent). The GEMMs, once per position, run at the CPU's width
// (tile_dispatch): at AVX-512 the 32- and 64-channel passes took 0.73-0.82x the AVX2 time
// (bench_conv BM_ConvAB/{3,6}/*/6/7, 2 threads, Xeon).
//
// Forward and input gradient: each output element comes from one block, computed in a fixed
// order, so results do not depend on the thread count. Weight gradient: blocks are grouped into a
// fixed number of chunks, each with its own sums, added in chunk order; also independent of the
// thread count.
#include "backends/cpu/conv_winograd.h"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "backends/cpu/compute_buffers.h"
#include "backends/cpu/fma_tile.h"
#include "backends/cpu/row_pairs.h"
#include "hetrain/base/cpu_features.h"
#include "hetrain/base/thread_pool.h"

namespace hetrain::cpu {

namespace {

constexpr int64_t kPos = 16;     // positions of a 2x2 tile's transform, for applies()'s bound
constexpr int64_t kChunks = 16;  // weight-gradient partial sums (more than threads, to balance)

/// A 3x3 stride-1 convolution from C to O channels as m x m output tiles, in blocks of tile rows.
struct Tiling {
  int64_t N, C, O, H, W, ph, pw, Ho, Wo;
  int64_t m;       // output tile size: 2 (F(2x2, 3x3)) or 4 (F(4x4, 3x3)); see tile_size
  int64_t th, tw;  // tile rows and tiles per row of one image
  int64_t lanes;   // tiles a row's transforms compute: tw rounded up to whole vectors
  int64_t L;       // floats in each of a split row's m column phases: room past `lanes` for the
                   // transforms' reads one past it and for split_row's whole vectors
  int64_t rows;    // tile rows per block
  int64_t ld;      // floats between rows of the transformed arrays
  int64_t vp, mp;  // floats between positions of the transformed inputs (C rows), outputs (O)
  int64_t blocks() const { return (N * th + rows - 1) / rows; }
  /// Positions of a transformed (m + 2) x (m + 2) tile.
  int64_t positions() const { return (m + 2) * (m + 2); }
};

/// floats rounded up to an odd number of cache lines.
int64_t odd_lines(int64_t floats) { return (((floats + 15) / 16) | 1) * 16; }

/// m x m output tiles; blocks of about as many tiles as hold positions * (C + O) * tiles floats
/// of transformed inputs and outputs in half of a 512 KiB L2.
Tiling make_tiling(int64_t N, int64_t C, int64_t O, int64_t H, int64_t W, int64_t ph, int64_t pw,
                   int64_t m) {
  Tiling t{N, C, O, H, W, ph, pw, H + 2 * ph - 2, W + 2 * pw - 2, m, 0, 0, 0, 0, 0, 0, 0, 0};
  t.th = (t.Ho + m - 1) / m;
  t.tw = (t.Wo + m - 1) / m;
  const int64_t target_tiles = std::clamp<int64_t>(65536 / t.positions() / (C + O), 24, 512);
  t.lanes = (t.tw + 7) / 8 * 8;
  t.L = t.lanes + 16;
  // Whole images per block, even where one image is over the target (16->16 @28x28: 196 tiles):
  // whole images are read and written in sequential stretches, and blocks of half an image
  // measured ~10% slower there (in a version whose extra bookkeeping may account for part of it).
  const int64_t per_image = t.th * t.tw;
  t.rows = t.th * std::clamp<int64_t>((target_tiles + per_image / 2) / per_image, 1, N);
  // The GEMMs run over whole vectors; the last tile row spills up to (rows - 1) tw + lanes.
  t.ld = std::max((t.rows * t.tw + 7) / 8 * 8, (t.rows - 1) * t.tw + t.lanes);
  // An odd number of cache lines between rows and between positions: the transforms access the
  // 16 or 36 positions of a tile together and the GEMMs up to C rows, which with a stride of an
  // even number of lines share a few L1 sets and evict each other (with 16 channels, 16 lines in
  // two sets: forward 16->16 @28x28 was ~20% slower).
  t.ld = odd_lines(t.ld);
  t.vp = odd_lines(C * t.ld);
  t.mp = odd_lines(O * t.ld);
  return t;
}

/// Whether the transforms take two tile rows per vector: tile rows of 4 tiles (7- and 8-wide
/// outputs at 2x2, 13 to 16 wide at 4x4), which would leave half of a vector's 8 lanes idle.
bool paired(const Tiling& t) { return t.tw == 4; }

/// A block's image rows, one channel at a time, zero-padded and split into their m column phases
/// (columns mod m, L floats each). The caller splits a channel while it transforms the one before:
/// reading a row right after splitting it stalls, as each of the transform's loads spans two of
/// split_row's stores and cannot be forwarded from them (the input transforms of 32->32 @14x14
/// and 64->64 @7x7 took ~20% longer).
class SplitChannels {
 public:
  SplitChannels(float* buf, const Tiling& t)
      : buf_(buf), t_(t), row_(t.m * t.L), half_(t.rows / t.th * t.H * row_) {
    // Column w of the image, padded column q = w + pw, is phase q % m's value q / m.
    for (int64_t r = 0; r < t.m; ++r) dst_[r] = (r + t.pw) % t.m * t.L + (r + t.pw) / t.m;
    // Every split writes the same cells, so the zeros around them stay.
    std::fill(buf_, buf_ + floats(t), 0.0f);
  }
  /// Floats buf must hold: a zero row and two channels of a block's images.
  static int64_t floats(const Tiling& t) { return t.m * t.L * (1 + 2 * t.rows / t.th * t.H); }

  /// Splits channel c of images [n0, n1) of x.
  __attribute__((target("avx2,fma"))) void split(const float* x, int64_t n0, int64_t n1,
                                                 int64_t c) {
    float* dst = half(c);
    for (int64_t n = n0; n < n1; ++n)
      for (int64_t h = 0; h < t_.H; ++h) {
        float* row = dst + ((n - n0) * t_.H + h) * row_;
        const float* src = x + ((n * t_.C + c) * t_.H + h) * t_.W;
        if (t_.m == 2) {
          split_row(src, t_.W, row + dst_[0], row + dst_[1]);
        } else {
          float* const to[4] = {row + dst_[0], row + dst_[1], row + dst_[2], row + dst_[3]};
          split_row4(src, t_.W, to);
        }
      }
  }
  /// Row h (zeros outside the image) of the k-th split image of channel c: its m phases, L
  /// floats apart.
  const float* row(int64_t c, int64_t k, int64_t h) const {
    return h >= 0 && h < t_.H ? half(c) + (k * t_.H + h) * row_ : buf_;
  }

 private:
  float* half(int64_t c) const { return buf_ + row_ + c % 2 * half_; }

  float* buf_;
  const Tiling& t_;
  int64_t row_, half_;
  int64_t dst_[4];  // where column phase r (column mod m) of an image row goes in its split row
};

/// One column of B^T d for F(4x4, 3x3): o = B^T d over 6 values.
__attribute__((target("avx2,fma"), always_inline)) inline void bt6(const __m256 d[6], __m256 o[6]) {
  const __m256 four = _mm256_set1_ps(4.0f), five = _mm256_set1_ps(5.0f);
  o[0] = _mm256_fmadd_ps(four, d[0], _mm256_fnmadd_ps(five, d[2], d[4]));
  const __m256 a = _mm256_fnmadd_ps(four, d[2], d[4]), b = _mm256_fnmadd_ps(four, d[1], d[3]);
  o[1] = _mm256_add_ps(a, b);
  o[2] = _mm256_sub_ps(a, b);
  const __m256 c = _mm256_sub_ps(d[4], d[2]), e = _mm256_sub_ps(d[3], d[1]);
  o[3] = _mm256_add_ps(c, _mm256_add_ps(e, e));
  o[4] = _mm256_sub_ps(c, _mm256_add_ps(e, e));
  o[5] = _mm256_fmadd_ps(four, d[1], _mm256_fnmadd_ps(five, d[3], d[5]));
}

/// 8 floats at lo + off, or with Pair 4 at lo + off and 4 at hi + off.
template <bool Pair>
__attribute__((target("avx2,fma"), always_inline)) inline __m256 load_rows(const float* lo,
                                                                           const float* hi,
                                                                           int64_t off) {
  if constexpr (Pair) return _mm256_loadu2_m128(hi + off, lo + off);
  return _mm256_loadu_ps(lo + off);
}

/// V = B^T d B of F(2x2, 3x3) for 8 tiles, position p to v[p * pstride]: lo[k] is input row k of
/// the tiles, split into even and odd columns L floats apart, from their first even column on.
/// Pair: the 8 tiles are two tile rows of 4, lo's and hi's (each 128-bit half loaded from its
/// own rows).
template <bool Pair>
__attribute__((target("avx2,fma"), always_inline)) inline void input_tiles2(
    const float* const lo[4], const float* const hi[4], int64_t L, float* v, int64_t pstride) {
  // Tile j reads columns 2j .. 2j+3: even[j], odd[j], even[j+1], odd[j+1].
  __m256 h[4][4];
#pragma GCC unroll 4
  for (int k = 0; k < 4; ++k) {
    const __m256 e = load_rows<Pair>(lo[k], hi[k], 0), e1 = load_rows<Pair>(lo[k], hi[k], 1);
    const __m256 o = load_rows<Pair>(lo[k], hi[k], L), o1 = load_rows<Pair>(lo[k], hi[k], L + 1);
    h[k][0] = _mm256_sub_ps(e, e1);
    h[k][1] = _mm256_add_ps(o, e1);
    h[k][2] = _mm256_sub_ps(e1, o);
    h[k][3] = _mm256_sub_ps(o, o1);
  }
#pragma GCC unroll 4
  for (int b = 0; b < 4; ++b) {
    _mm256_storeu_ps(v + (0 + b) * pstride, _mm256_sub_ps(h[0][b], h[2][b]));
    _mm256_storeu_ps(v + (4 + b) * pstride, _mm256_add_ps(h[1][b], h[2][b]));
    _mm256_storeu_ps(v + (8 + b) * pstride, _mm256_sub_ps(h[2][b], h[1][b]));
    _mm256_storeu_ps(v + (12 + b) * pstride, _mm256_sub_ps(h[1][b], h[3][b]));
  }
}

/// V = B^T d B of F(4x4, 3x3) for 8 tiles, position p to v[p * pstride]: lo[k] is input row k of
/// the tiles, split into 4 column phases L floats apart, from the tiles' first column on. Pair:
/// two tile rows of 4, lo's and hi's, as input_tiles2.
template <bool Pair>
__attribute__((target("avx2,fma"), always_inline)) inline void input_tiles4(
    const float* const lo[6], const float* const hi[6], int64_t L, float* v, int64_t pstride) {
  // Tile j reads columns 4j .. 4j+5: phases 0..3 at j, then phases 0 and 1 at j + 1.
  __m256 h[6][6];
  for (int k = 0; k < 6; ++k) {
    const __m256 d[6] = {
        load_rows<Pair>(lo[k], hi[k], 0),     load_rows<Pair>(lo[k], hi[k], L),
        load_rows<Pair>(lo[k], hi[k], 2 * L), load_rows<Pair>(lo[k], hi[k], 3 * L),
        load_rows<Pair>(lo[k], hi[k], 1),     load_rows<Pair>(lo[k], hi[k], L + 1)};
    bt6(d, h[k]);  // h[k][b]: row k of d B
  }
  for (int b = 0; b < 6; ++b) {
    const __m256 col[6] = {h[0][b], h[1][b], h[2][b], h[3][b], h[4][b], h[5][b]};
    __m256 o[6];
    bt6(col, o);
    for (int a = 0; a < 6; ++a) _mm256_storeu_ps(v + (6 * a + b) * pstride, o[a]);
  }
}

/// V = B^T d B for `lanes` tiles of one tile row of one channel; r[k] is input row k of the tiles
/// (M + 2 rows), split into M column phases L floats apart. Position p of tile j goes to
/// v[p * pstride + j].
template <int M>
__attribute__((target("avx2,fma"))) void input_tiles(const float* const r[M + 2], int64_t L,
                                                     int64_t lanes, float* v, int64_t pstride) {
  if constexpr (M == 2) {
    for (int64_t j = 0; j < lanes; j += 8) {
      const float* q[4] = {r[0] + j, r[1] + j, r[2] + j, r[3] + j};
      input_tiles2<false>(q, q, L, v + j, pstride);
    }
  } else {
    // One vector in straight-line code, as output_tiles.
    if (lanes == 8) {
      input_tiles4<false>(r, r, L, v, pstride);
      return;
    }
    for (int64_t j = 0; j < lanes; j += 8) {
      const float* q[6] = {r[0] + j, r[1] + j, r[2] + j, r[3] + j, r[4] + j, r[5] + j};
      input_tiles4<false>(q, q, L, v + j, pstride);
    }
  }
}

/// One row of A^T m for F(4x4, 3x3): z = A^T m over 6 values.
__attribute__((target("avx2,fma"), always_inline)) inline void at6(const __m256 m[6], __m256 z[4]) {
  const __m256 d12 = _mm256_sub_ps(m[1], m[2]), s12 = _mm256_add_ps(m[1], m[2]);
  const __m256 d34 = _mm256_sub_ps(m[3], m[4]), s34 = _mm256_add_ps(m[3], m[4]);
  z[0] = _mm256_add_ps(_mm256_add_ps(m[0], s12), s34);
  z[1] = _mm256_fmadd_ps(_mm256_set1_ps(2.0f), d34, d12);
  z[2] = _mm256_fmadd_ps(_mm256_set1_ps(4.0f), s34, s12);
  z[3] = _mm256_add_ps(_mm256_fmadd_ps(_mm256_set1_ps(8.0f), d34, d12), m[5]);
}

/// Y = A^T M A + bias of F(4x4, 3x3) for 8 tiles from m[p * pstride]: out[a][c] is column c
/// of output row a of each tile.
__attribute__((target("avx2,fma"), always_inline)) inline void output_tiles4(const float* m,
                                                                             int64_t pstride,
                                                                             __m256 bv,
                                                                             __m256 out[4][4]) {
  __m256 z[4][6];  // z[a][b]: A^T M, row a, column b
  for (int b = 0; b < 6; ++b) {
    __m256 col[6], zb[4];
    for (int a = 0; a < 6; ++a) col[a] = _mm256_loadu_ps(m + (6 * a + b) * pstride);
    at6(col, zb);
    for (int a = 0; a < 4; ++a) z[a][b] = zb[a];
  }
  for (int a = 0; a < 4; ++a) {
    at6(z[a], out[a]);
    for (int c = 0; c < 4; ++c) out[a][c] = _mm256_add_ps(out[a][c], bv);
  }
}

/// Tiles j .. j + 7 of a 4x4 tile row: output_tiles4, then rows y[a] (until a null one) from
/// column 4j, plus r[a] where not null.
__attribute__((target("avx2,fma"), always_inline)) inline void output_vector4(
    const float* m, int64_t pstride, __m256 bv, float* const y[4], int64_t Wo,
    const float* const r[4], int64_t j) {
  __m256 out[4][4];
  output_tiles4(m + j, pstride, bv, out);
  for (int a = 0; a < 4 && y[a]; ++a)
    store_quads(y[a] + 4 * j, out[a], Wo - 4 * j, r[a] ? r[a] + 4 * j : nullptr);
}

/// Y = A^T M A + bias of F(2x2, 3x3) for 8 tiles from m[p * pstride]: the even and odd columns
/// of output row 0 (e0, o0) and of row 1 (e1, o1).
__attribute__((target("avx2,fma"), always_inline)) inline void output_tiles2(
    const float* m, int64_t pstride, __m256 bv, __m256& e0, __m256& o0, __m256& e1, __m256& o1) {
  __m256 z0[4], z1[4];
#pragma GCC unroll 4
  for (int b = 0; b < 4; ++b) {
    const __m256 m0 = _mm256_loadu_ps(m + (0 + b) * pstride);
    const __m256 m1 = _mm256_loadu_ps(m + (4 + b) * pstride);
    const __m256 m2 = _mm256_loadu_ps(m + (8 + b) * pstride);
    const __m256 m3 = _mm256_loadu_ps(m + (12 + b) * pstride);
    z0[b] = _mm256_add_ps(_mm256_add_ps(m0, m1), m2);
    z1[b] = _mm256_sub_ps(_mm256_sub_ps(m1, m2), m3);
  }
  e0 = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(z0[0], z0[1]), z0[2]), bv);
  o0 = _mm256_add_ps(_mm256_sub_ps(_mm256_sub_ps(z0[1], z0[2]), z0[3]), bv);
  e1 = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(z1[0], z1[1]), z1[2]), bv);
  o1 = _mm256_add_ps(_mm256_sub_ps(_mm256_sub_ps(z1[1], z1[2]), z1[3]), bv);
}

/// Stores an output row of two tile rows of 4 tiles (e and o: even and odd columns, tile row
/// a in lanes 0-3, b in 4-7): the first n (<= 8) columns of each to da and db (null: not stored),
/// plus ra and rb where not null.
__attribute__((target("avx2,fma"), always_inline)) inline void store_row_pair(
    __m256 e, __m256 o, int64_t n, float* da, const float* ra, float* db, const float* rb) {
  __m256 q[2];  // tile row a's 8 columns, then b's
  interleave_pairs(e, o, q);
  if (da) store_vectors(da, q, 1, n, ra);
  if (db) store_vectors(db, q + 1, 1, n, rb);
}

/// Y = A^T M A (+ bias) for the tw tiles of one tile row of one output channel, from
/// m[p * pstride + j]; writes output rows y[0 .. M) (null past the last row), Wo wide, plus
/// rows r[0 .. M) of the addend where not null.
template <int M>
__attribute__((target("avx2,fma"))) void output_tiles(const float* m, int64_t pstride, int64_t tw,
                                                      float bias, float* const y[M], int64_t Wo,
                                                      const float* const r[M]) {
  if constexpr (M == 2) {
    const __m256 bv = _mm256_set1_ps(bias);
    for (int64_t j = 0; j < tw; j += 8) {
      __m256 e0, o0, e1, o1;
      output_tiles2(m + j, pstride, bv, e0, o0, e1, o1);
      const int64_t n = Wo - 2 * j;
      store_pairs(y[0] + 2 * j, e0, o0, n, r[0] ? r[0] + 2 * j : nullptr);
      if (y[1]) store_pairs(y[1] + 2 * j, e1, o1, n, r[1] ? r[1] + 2 * j : nullptr);
    }
  } else {
    const __m256 bv = _mm256_set1_ps(bias);
    // One vector (up to 32 columns) in straight-line code: a loop would first compute and spill
    // the 36 positions' addresses, a third of this function's time when it runs once.
    if (tw <= 8) {
      output_vector4(m, pstride, bv, y, Wo, r, 0);
      return;
    }
    for (int64_t j = 0; j < tw; j += 8) output_vector4(m, pstride, bv, y, Wo, r, j);
  }
}

/// M_p = U_p V_p for one position over T tiles (a multiple of 8): u packed by
/// transform_weights, v (C rows), m (O rows), rows of v and m ld apart; m[r][t] = sum_c u[c][r] *
/// v[c][t] in register tiles of 4 rows by kTileVecs vectors of tiles.
struct GemmPosition {
  template <Isa I>
  [[gnu::always_inline]] static inline void run(const float* u, const float* v, int64_t ld,
                                                int64_t C, int64_t O, float* m, int64_t T) {
    for_row_blocks(
        O, [&]<int R>(int64_t o0) __attribute__((always_inline)) {
          for_column_tiles<I>(
              T, [&]<class V, int NV>(int64_t t) __attribute__((always_inline)) {
                fma_tile<V, R, NV>([v, ld, t](int64_t c) { return v + c * ld + t; }, u + o0 * C, C,
                                   m + o0 * ld + t, ld);
              });
        });
  }
};
void gemm_position(const float* u, const float* v, int64_t ld, int64_t C, int64_t O, float* m,
                   int64_t T) {
  tile_dispatch<GemmPosition>(u, v, ld, C, O, m, T);
}

/// G of F(m x m, 3x3), m + 2 rows of 3: Lavin and Gray's, interpolating at 0, 1, -1 (and 2, -2
/// for m = 4).
const double (*kernel_transform(int64_t m))[3] {
  static constexpr double G2[4][3] = {{1, 0, 0}, {0.5, 0.5, 0.5}, {0.5, -0.5, 0.5}, {0, 0, 1}};
  static constexpr double G4[6][3] = {{0.25, 0, 0},
                                      {-1.0 / 6, -1.0 / 6, -1.0 / 6},
                                      {-1.0 / 6, 1.0 / 6, -1.0 / 6},
                                      {1.0 / 24, 1.0 / 12, 1.0 / 6},
                                      {1.0 / 24, -1.0 / 12, 1.0 / 6},
                                      {0, 0, 1}};
  return m == 2 ? G2 : G4;
}

/// U = G g G^T for every (o, c) of F(m x m, 3x3), g = weight(o, c, i, j). Position p's (O, C)
/// matrix starts at p * O * C, packed for fma_tile (pack_tile_rows).
template <class Weight>
std::vector<float> transform_weights(int64_t m, int64_t O, int64_t C, Weight weight) {
  const int64_t n = m + 2, P = n * n;
  const double(*G)[3] = kernel_transform(m);
  std::vector<float> full(static_cast<size_t>(P * O * C));  // [p][o][c]
  for (int64_t o = 0; o < O; ++o)
    for (int64_t c = 0; c < C; ++c) {
      double g[3][3], gg[6][3];  // gg = G g
      for (int i = 0; i < 3; ++i)
        for (int j = 0; j < 3; ++j) g[i][j] = weight(o, c, i, j);
      for (int64_t a = 0; a < n; ++a)
        for (int j = 0; j < 3; ++j)
          gg[a][j] = G[a][0] * g[0][j] + G[a][1] * g[1][j] + G[a][2] * g[2][j];
      for (int64_t a = 0; a < n; ++a)
        for (int64_t b = 0; b < n; ++b)
          full[static_cast<size_t>(((n * a + b) * O + o) * C + c)] =
              static_cast<float>(gg[a][0] * G[b][0] + gg[a][1] * G[b][1] + gg[a][2] * G[b][2]);
    }
  std::vector<float> u(full.size());
  for (int64_t p = 0; p < P; ++p) {
    const float* up = full.data() + p * O * C;
    pack_tile_rows(
        O, C, [up, C](int64_t o, int64_t c) { return up[o * C + c]; }, u.data() + p * O * C);
  }
  return u;
}

/// Transforms channels [0, t.C) of tile rows [g0, g1) of x into v (positions * C rows of t.ld);
/// M = t.m.
template <int M>
__attribute__((target("avx2,fma"))) void transform_inputs(const Tiling& t, const float* x,
                                                          int64_t g0, int64_t g1,
                                                          SplitChannels& split, float* v) {
  const int64_t n0 = g0 / t.th, n1 = (g1 - 1) / t.th + 1;
  // The input rows of tile row g of the block's images, channel c.
  auto rows = [&](int64_t c, int64_t g, const float* r[M + 2]) {
    const int64_t n = g / t.th, i = g % t.th;
    for (int64_t k = 0; k < M + 2; ++k) r[k] = split.row(c, n - n0, M * i - t.ph + k);
  };
  split.split(x, n0, n1, 0);
  for (int64_t c = 0; c < t.C; ++c) {
    if (c + 1 < t.C) split.split(x, n0, n1, c + 1);
    float* vc = v + c * t.ld;
    if (paired(t)) {
      // Tile rows g and g + 1 in one vector; past the block's last row, its own rows again
      // (lanes that land in the arrays' slack).
      for (int64_t g = g0; g < g1; g += 2) {
        const float *lo[M + 2], *hi[M + 2];
        rows(c, g, lo);
        rows(c, std::min(g + 1, g1 - 1), hi);
        if constexpr (M == 2)
          input_tiles2<true>(lo, hi, t.L, vc + (g - g0) * 4, t.vp);
        else
          input_tiles4<true>(lo, hi, t.L, vc + (g - g0) * 4, t.vp);
      }
      continue;
    }
    for (int64_t g = g0; g < g1; ++g) {
      const float* r[M + 2];
      rows(c, g, r);
      input_tiles<M>(r, t.L, t.lanes, vc + (g - g0) * t.tw, t.vp);
    }
  }
}

/// Writes tile rows [g0, g1) of y (N, O, Ho, Wo) [+ b] [+ r] from their transformed outputs m;
/// M = t.m.
template <int M>
__attribute__((target("avx2,fma"))) void transform_outputs(const Tiling& t, const float* m,
                                                           int64_t g0, int64_t g1, const float* b,
                                                           float* y, const float* r) {
  // Output rows M i .. M i + M - 1 of tile row g (n, i), channel o, and of the addend (null past
  // the last row, or past the block's tile rows).
  auto rows = [&](int64_t o, int64_t g, float* out[M], const float* add[M]) {
    const int64_t n = g / t.th, i = g % t.th;
    for (int64_t a = 0; a < M; ++a) {
      const int64_t h = M * i + a, off = ((n * t.O + o) * t.Ho + h) * t.Wo;
      const bool in = g < g1 && h < t.Ho;
      out[a] = in ? y + off : nullptr;
      add[a] = in && r ? r + off : nullptr;
    }
  };
  for (int64_t o = 0; o < t.O; ++o) {
    const float* mo = m + o * t.ld;
    if (paired(t)) {
      const __m256 bv = _mm256_set1_ps(b ? b[o] : 0.0f);
      for (int64_t g = g0; g < g1; g += 2) {
        float *ya[M], *yb[M];
        const float *ra[M], *rb[M];
        rows(o, g, ya, ra);
        rows(o, g + 1, yb, rb);
        const float* mg = mo + (g - g0) * 4;
        if constexpr (M == 2) {
          __m256 e0, o0, e1, o1;
          output_tiles2(mg, t.mp, bv, e0, o0, e1, o1);
          store_row_pair(e0, o0, t.Wo, ya[0], ra[0], yb[0], rb[0]);
          store_row_pair(e1, o1, t.Wo, ya[1], ra[1], yb[1], rb[1]);
        } else {
          __m256 out[4][4];
          output_tiles4(mg, t.mp, bv, out);
          for (int a = 0; a < 4; ++a) {
            // Tile row g's 16 columns in q[0..1], g + 1's in q[2..3].
            __m256 q[4];
            interleave_quads(out[a], q);
            if (ya[a]) store_vectors(ya[a], q, 2, t.Wo, ra[a]);
            if (yb[a]) store_vectors(yb[a], q + 2, 2, t.Wo, rb[a]);
          }
        }
      }
      continue;
    }
    for (int64_t g = g0; g < g1; ++g) {
      float* out[M];
      const float* add[M];
      rows(o, g, out, add);
      output_tiles<M>(mo + (g - g0) * t.tw, t.mp, t.tw, b ? b[o] : 0.0f, out, t.Wo, add);
    }
  }
}

/// Prefetches part `k` of `parts` of [p, p + bytes) into L2: spread over a block's GEMMs, this
/// brings in the next block's inputs and this one's output lines, which the transforms would
/// otherwise wait for.
__attribute__((target("avx2,fma"))) void prefetch_part(const void* p, int64_t bytes, int64_t k,
                                                       int64_t parts) {
  const char* c = static_cast<const char*>(p);
  for (int64_t off = bytes * k / parts / 64 * 64; off < bytes * (k + 1) / parts; off += 64)
    _mm_prefetch(c + off, _MM_HINT_T1);
}

/// One block of forward_tiles, with v and m its transformed inputs and outputs; M = t.m.
template <int M>
__attribute__((target("avx2,fma"))) void forward_block(const Tiling& t, const float* x,
                                                       const float* u, const float* b, float* y,
                                                       const float* r, int64_t blk,
                                                       SplitChannels& split, float* v, float* m) {
  const int64_t g0 = blk * t.rows, g1 = std::min(t.N * t.th, g0 + t.rows);
  transform_inputs<M>(t, x, g0, g1, split, v);
  const int64_t T = ((g1 - g0) * t.tw + 7) / 8 * 8;
  const int64_t images = t.rows / t.th, n0 = g0 / t.th, n1 = (g1 - 1) / t.th + 1;
  const int64_t n_next = std::min(t.N, n1 + images);
  constexpr int64_t P = (M + 2) * (M + 2);
  for (int64_t p = 0; p < P; ++p) {
    gemm_position(u + p * t.O * t.C, v + p * t.vp, t.ld, t.C, t.O, m + p * t.mp, T);
    prefetch_part(x + n1 * t.C * t.H * t.W, (n_next - n1) * t.C * t.H * t.W * 4, p, P);
    prefetch_part(y + n0 * t.O * t.Ho * t.Wo, (n1 - n0) * t.O * t.Ho * t.Wo * 4, p, P);
  }
  transform_outputs<M>(t, m, g0, g1, b, y, r);
}

/// y (N, O, Ho, Wo) = conv(x, w) [+ b] [+ r] with u = transform_weights(w).
void forward_tiles(const Tiling& t, const float* x, const std::vector<float>& u, const float* b,
                   float* y, const float* r = nullptr) {
  parallel_for(t.blocks(), 1, [&](int64_t b0, int64_t b1) {
    Array va = workspace({t.positions() * t.vp}, Dtype::f32);
    Array ma = workspace({t.positions() * t.mp}, Dtype::f32);
    Array ra = workspace({SplitChannels::floats(t)}, Dtype::f32);
    float *v = va.data<float>(), *m = ma.data<float>();
    // The GEMMs read up to 7 columns past the tiles that the transforms write, and the output
    // transform past the GEMMs' columns (lanes it drops): zeros, not whatever the allocation
    // held, which could be denormals (slow) or NaNs.
    std::fill(v, v + va.numel(), 0.0f);
    std::fill(m, m + ma.numel(), 0.0f);
    SplitChannels split(ra.data<float>(), t);
    for (int64_t blk = b0; blk < b1; ++blk)
      if (t.m == 4)
        forward_block<4>(t, x, u.data(), b, y, r, blk, split, v, m);
      else
        forward_block<2>(t, x, u.data(), b, y, r, blk, split, v, m);
  });
}

/// Transposes 8 rows of 8 floats in place.
__attribute__((target("avx2,fma"))) void transpose8(__m256 r[8]) {
  __m256 t[8], q[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    q[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
    q[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
    q[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    q[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm256_permute2f128_ps(q[i], q[i + 4], 0x20);
    r[i + 4] = _mm256_permute2f128_ps(q[i], q[i + 4], 0x31);
  }
}

/// One column of A z for F(4x4, 3x3) (A = (A^T)^T, 6 x 4): o = A z over 4 values.
__attribute__((target("avx2,fma"), always_inline)) inline void a6(const __m256 z[4], __m256 o[6]) {
  const __m256 s02 = _mm256_add_ps(z[0], z[2]), s13 = _mm256_add_ps(z[1], z[3]);
  const __m256 q02 = _mm256_fmadd_ps(_mm256_set1_ps(4.0f), z[2], z[0]);
  const __m256 q13 = _mm256_fmadd_ps(_mm256_set1_ps(4.0f), z[3], z[1]);
  o[0] = z[0];
  o[1] = _mm256_add_ps(s02, s13);
  o[2] = _mm256_sub_ps(s02, s13);
  o[3] = _mm256_fmadd_ps(_mm256_set1_ps(2.0f), q13, q02);
  o[4] = _mm256_fnmadd_ps(_mm256_set1_ps(2.0f), q13, q02);
  o[5] = z[3];
}

/// A dY A^T for the tiles of tile row i of image n and output channels [o0, o0 + 8) (zeros past
/// O), transposed: position p of block column tcol + j goes to gt[p * gp + (tcol + j) * ldo +
/// o - o0]. The M gradient rows of 8 channels are transposed 8 columns at a time, so that the
/// transform runs on vectors of 8 channels: a quarter (M = 2) of the transposing that its output
/// would need.
template <int M>
__attribute__((target("avx2,fma"))) void grad_tiles(const Tiling& t, const float* gy, int64_t n,
                                                    int64_t i, int64_t o0, float* gt, int64_t gp,
                                                    int64_t ldo, int64_t tcol) {
  const int64_t count = std::min<int64_t>(8, t.O - o0);
  const float* rows[M][8];
  for (int a = 0; a < M; ++a)
    for (int k = 0; k < 8; ++k)
      rows[a][k] = k < count && M * i + a < t.Ho
                       ? gy + ((n * t.O + o0 + k) * t.Ho + M * i + a) * t.Wo
                       : nullptr;
  const __m256 zero = _mm256_setzero_ps();
  for (int64_t w0 = 0; w0 < M * t.tw; w0 += 8) {
    __m256 y[M][8];
    for (int a = 0; a < M; ++a) {
      for (int k = 0; k < 8; ++k)
        y[a][k] = rows[a][k] ? load_first(rows[a][k] + w0, t.Wo - w0) : zero;
      transpose8(y[a]);  // y[a][w]: column w0 + w of row M i + a, over the 8 channels
    }
    // The 8 columns hold 8 / M tiles.
    for (int64_t jj = 0; jj < std::min<int64_t>(8 / M, t.tw - w0 / M); ++jj) {
      float* g = gt + (tcol + w0 / M + jj) * ldo + o0;
      if constexpr (M == 2) {
        const __m256 e0 = y[0][2 * jj], d0 = y[0][2 * jj + 1];
        const __m256 e1 = y[1][2 * jj], d1 = y[1][2 * jj + 1];
        // Rows of A dY (even and odd column), then the same combination along the row.
        const __m256 ze[4] = {e0, _mm256_add_ps(e0, e1), _mm256_sub_ps(e0, e1),
                              _mm256_sub_ps(zero, e1)};
        const __m256 zo[4] = {d0, _mm256_add_ps(d0, d1), _mm256_sub_ps(d0, d1),
                              _mm256_sub_ps(zero, d1)};
#pragma GCC unroll 4
        for (int a = 0; a < 4; ++a) {
          _mm256_storeu_ps(g + (4 * a + 0) * gp, ze[a]);
          _mm256_storeu_ps(g + (4 * a + 1) * gp, _mm256_add_ps(ze[a], zo[a]));
          _mm256_storeu_ps(g + (4 * a + 2) * gp, _mm256_sub_ps(ze[a], zo[a]));
          _mm256_storeu_ps(g + (4 * a + 3) * gp, _mm256_sub_ps(zero, zo[a]));
        }
      } else {
        __m256 c[6][4];  // A dY: 6 rows of the tile's 4 columns
        for (int b = 0; b < 4; ++b) {
          const __m256 z[4] = {y[0][4 * jj + b], y[1][4 * jj + b], y[2][4 * jj + b],
                               y[3][4 * jj + b]};
          __m256 o[6];
          a6(z, o);
          for (int k = 0; k < 6; ++k) c[k][b] = o[k];
        }
        for (int k = 0; k < 6; ++k) {
          __m256 o[6];
          a6(c[k], o);
          for (int l = 0; l < 6; ++l) _mm256_storeu_ps(g + (6 * k + l) * gp, o[l]);
        }
      }
    }
  }
}

/// du (C, ldo) += v gt for one position: v (C rows of ld), gt (T rows of ldo); du[r][o] += sum_t
/// v[r * ld + t] * gt[t * ldo + o] in register tiles of 4 input channels by kTileVecs vectors of
/// output channels, broadcasting v along the tile's rows.
struct WeightPosition {
  template <Isa I>
  [[gnu::always_inline]] static inline void run(const float* v, int64_t ld, const float* gt,
                                                int64_t ldo, int64_t C, int64_t T, float* du) {
    for_row_blocks(
        C, [&]<int R>(int64_t c0) __attribute__((always_inline)) {
          const float* vr = v + c0 * ld;
          for_column_tiles<I>(
              ldo, [&]<class V, int NV>(int64_t o) __attribute__((always_inline)) {
                fma_tile_at<V, R, NV, true>([gt, ldo, o](int64_t t) { return gt + t * ldo + o; },
                                            [vr, ld](int64_t t, int r) { return vr + r * ld + t; },
                                            T, du + c0 * ldo + o, ldo);
              });
        });
  }
};
void weight_position(const float* v, int64_t ld, const float* gt, int64_t ldo, int64_t C, int64_t T,
                     float* du) {
  tile_dispatch<WeightPosition>(v, ld, gt, ldo, C, T, du);
}

/// du (positions, C, ldo) += one block's sums for the weight gradient, with v its transformed
/// inputs; M = t.m.
template <int M>
__attribute__((target("avx2,fma"))) void weight_block(const Tiling& t, const float* x,
                                                      const float* gy, int64_t blk,
                                                      SplitChannels& split, float* v, float* gt,
                                                      int64_t gp, int64_t ldo, float* du) {
  const int64_t g0 = blk * t.rows, g1 = std::min(t.N * t.th, g0 + t.rows);
  transform_inputs<M>(t, x, g0, g1, split, v);
  for (int64_t o0 = 0; o0 < t.O; o0 += 8)
    for (int64_t n = g0 / t.th; n < g1 / t.th; ++n)
      for (int64_t i = 0; i < t.th; ++i)
        grad_tiles<M>(t, gy, n, i, o0, gt, gp, ldo, (n * t.th + i - g0) * t.tw);
  const int64_t images = t.rows / t.th, n1 = (g1 - 1) / t.th + 1;
  const int64_t n_next = std::min(t.N, n1 + images);
  constexpr int64_t P = (M + 2) * (M + 2);
  for (int64_t p = 0; p < P; ++p) {
    weight_position(v + p * t.vp, t.ld, gt + p * gp, ldo, t.C, (g1 - g0) * t.tw,
                    du + p * t.C * ldo);
    prefetch_part(x + n1 * t.C * t.H * t.W, (n_next - n1) * t.C * t.H * t.W * 4, p, P);
    prefetch_part(gy + n1 * t.O * t.Ho * t.Wo, (n_next - n1) * t.O * t.Ho * t.Wo * 4, p, P);
  }
}

std::atomic<bool>& disabled_flag() {
  static std::atomic<bool> flag{[] {
    const char* v = std::getenv("HETRAIN_CONV_WINOGRAD");
    return v && std::strcmp(v, "0") == 0;
  }()};
  return flag;
}
std::atomic<int64_t> runs{0};

bool applies(const ConvShape& s) {
  if (disabled_flag() || s.N <= 0 || s.C <= 0 || s.O <= 0) return false;
  if (s.kh != 3 || s.kw != 3 || s.sh != 1 || s.sw != 1) return false;
  if (s.ph < 0 || s.ph > 1 || s.pw < 0 || s.pw > 1 || s.Ho < 1 || s.Wo < 1) return false;
  // Blocks hold at least one whole image: past 8 MiB of transformed arrays per image (64 + 64
  // channels past 64x64) they run from L3 or memory, a case not tuned or measured.
  const int64_t tiles = (std::max(s.H, s.Ho) + 1) / 2 * ((std::max(s.W, s.Wo) + 1) / 2);
  if (kPos * (s.C + s.O) * tiles * 4 > (int64_t{8} << 20)) return false;
  const CpuFeatures& f = cpu_features();
  return f.avx2 && f.fma;
}

/// The output tile size for outputs Wo wide (the input's width for the input gradient):
/// F(4x4, 3x3) where a tile row fills most of a vector of 8 tiles (Wo >= 20) and, in the forward
/// passes, where tile rows of 4 tiles pair up in a vector (13 to 16 wide: at 14 wide 0.90-0.97x
/// the time of 2x2 tiles, whose rows fill 7 of 8 lanes); F(2x2, 3x3) otherwise. The weight
/// gradient keeps 2x2 tiles at 13 to 16 wide (4x4 took 1.04-1.09x the time there).
std::atomic<int64_t> forced_tile_size{0};
int64_t tile_size(int64_t Wo, bool weight_gradient) {
  const int64_t forced = forced_tile_size;
  if (forced) return forced;
  return Wo >= 20 || (!weight_gradient && (Wo + 3) / 4 == 4) ? 4 : 2;
}

}  // namespace

void set_winograd_conv_disabled(bool disabled) { disabled_flag() = disabled; }
int64_t winograd_conv_runs() { return runs; }
void set_winograd_tile_size(int64_t m) {
  if (m != 0 && m != 2 && m != 4)
    throw std::invalid_argument("set_winograd_tile_size: " + std::to_string(m) +
                                " is not 0, 2 or 4");
  forced_tile_size = m;
}

bool winograd_conv_forward(const ConvShape& s, const float* x, const float* w, const float* b,
                           float* y) {
  if (!applies(s)) return false;
  const Tiling t = make_tiling(s.N, s.C, s.O, s.H, s.W, s.ph, s.pw, tile_size(s.Wo, false));
  const auto u = transform_weights(t.m, s.O, s.C, [&](int64_t o, int64_t c, int i, int j) {
    return w[((o * s.C + c) * 3 + i) * 3 + j];
  });
  forward_tiles(t, x, u, b, y);
  ++runs;
  return true;
}

bool winograd_conv_backward_data(const ConvShape& s, const float* gy, const float* w, float* dx,
                                 const float* addend) {
  if (!applies(s)) return false;
  // dx = conv(gy, w rotated 180 degrees with O and C swapped), padding 2 - p.
  const Tiling t =
      make_tiling(s.N, s.O, s.C, s.Ho, s.Wo, 2 - s.ph, 2 - s.pw, tile_size(s.W, false));
  const auto u = transform_weights(t.m, s.C, s.O, [&](int64_t c, int64_t o, int i, int j) {
    return w[((o * s.C + c) * 3 + (2 - i)) * 3 + (2 - j)];
  });
  forward_tiles(t, gy, u, nullptr, dx, addend);
  ++runs;
  return true;
}

bool winograd_conv_backward_weights(const ConvShape& s, const float* x, const float* gy,
                                    float* dw) {
  if (!applies(s)) return false;
  const Tiling t = make_tiling(s.N, s.C, s.O, s.H, s.W, s.ph, s.pw, tile_size(s.Wo, true));
  const int64_t P = t.positions();
  const int64_t ldo = (s.O + 7) / 8 * 8, gp = odd_lines(t.ld * ldo), D = P * s.C * ldo;
  // Fewer chunks where their sums would take more than 64 MiB (over ~250 channels each side): a
  // count that depends on the shape only, never on the thread count.
  const int64_t chunks =
      std::clamp<int64_t>((int64_t{16} << 20) / D, 1, std::min(t.blocks(), kChunks));
  const int64_t nb = t.blocks();
  Array partial = workspace({chunks, D}, Dtype::f32);
  parallel_for(chunks, 1, [&](int64_t c0, int64_t c1) {
    Array va = workspace({P * t.vp}, Dtype::f32), ga = workspace({P * gp}, Dtype::f32);
    Array ra = workspace({SplitChannels::floats(t)}, Dtype::f32);
    SplitChannels split(ra.data<float>(), t);
    for (int64_t chunk = c0; chunk < c1; ++chunk) {
      float* du = partial.data<float>() + chunk * D;
      std::fill(du, du + D, 0.0f);
      for (int64_t blk = chunk * nb / chunks; blk < (chunk + 1) * nb / chunks; ++blk)
        if (t.m == 4)
          weight_block<4>(t, x, gy, blk, split, va.data<float>(), ga.data<float>(), gp, ldo, du);
        else
          weight_block<2>(t, x, gy, blk, split, va.data<float>(), ga.data<float>(), gp, ldo, du);
    }
  });
  // dw = G^T dU G per (o, c), dU the chunks' sums added in chunk order. Both steps are split
  // between the threads: the sums over ranges of dU, the transforms over input channels (output
  // channels inside, adjacent in dU).
  float* du = partial.data<float>();
  parallel_for(D, 4096, [&](int64_t i0, int64_t i1) {
    for (int64_t ch = 1; ch < chunks; ++ch) {
      const float* q = du + ch * D;
      for (int64_t i = i0; i < i1; ++i) du[i] += q[i];
    }
  });
  const int64_t n = t.m + 2;
  const double(*G)[3] = kernel_transform(t.m);
  parallel_for(s.C, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c)
      for (int64_t o = 0; o < s.O; ++o) {
        auto at = [&](int64_t k, int64_t b) { return du[((n * k + b) * s.C + c) * ldo + o]; };
        double gd[3][6];  // G^T dU
        for (int a = 0; a < 3; ++a)
          for (int64_t b = 0; b < n; ++b) {
            gd[a][b] = 0;
            for (int64_t k = 0; k < n; ++k) gd[a][b] += G[k][a] * at(k, b);
          }
        float* d = dw + (o * s.C + c) * 9;
        for (int a = 0; a < 3; ++a)
          for (int j = 0; j < 3; ++j) {
            double v = 0;
            for (int64_t b = 0; b < n; ++b) v += gd[a][b] * G[b][j];
            d[a * 3 + j] = static_cast<float>(v);
          }
      }
  });
  ++runs;
  return true;
}

}  // namespace hetrain::cpu
