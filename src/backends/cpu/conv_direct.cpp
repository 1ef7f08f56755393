// Direct stride-1 and stride-2 convolution on AVX2 + FMA or AVX-512 (see conv_direct.h).
//
// Each image is copied once into a zero-padded buffer, one plane per channel. On that buffer a
// stride-1 convolution is a GEMM whose second operand is read in place: with q = oh * Wp + ow an
// output position on the padded-width grid (Wp = W + 2 pw; the columns ow >= Wo are computed and
// thrown away), out[o][q] = sum_k w[o][k] * in[off[k] + q], where k runs over (c, i, j) and
// off[k] = c * plane + i * Wp + j. Stride 2 is the same GEMM on the padded image split into four
// phase planes, P_ab[r][t] = padded[2r + a][2t + b] (Wq = ceil(Wp / 2) wide): tap (i, j) of
// output (oh, ow) reads P_(i%2)(j%2)[oh + i/2][ow + j/2], so off[k] = c * cstride +
// (2 (i%2) + j%2) * plane + (i/2) * Wq + j/2 and q = oh * Wq + ow. Its input gradient is, for each
// phase (a, b) of the padded input, a stride-1 correlation of the output gradient with the taps
// i%2 = a, j%2 = b (flipped), written back to that phase's pixels. The register tile (fma_tile.h,
// one source for both widths) is 4 output channels by 3 vectors of consecutive grid positions at
// AVX2 (24 positions, 12 accumulators) or 4 at AVX-512 (64, 16), shorter at a grid's end; each
// step loads the vectors of input and broadcasts four weights. At AVX-512 it took 0.68-0.74x the
// AVX2 time on fashion-cnn's 16 -> 32 stride-2 forward and input gradient (bench_conv
// BM_ConvAB/2/*/6/7, 2 threads, Xeon). At stride 1 the input gradient
// is the same kernel on the padded output gradient with the kernel flipped and transposed; at
// either stride it can add another tensor (Conv2dBackwardInput's addend) as it writes dx. The
// weight gradient is dw[o][k] = sum_q g[o][q] * in[off[k] + q] over every image, with g the
// output gradient on the same grid (zero in the thrown-away columns), vectorised along q with
// 4 x 3 (o, k) tiles of vector partial sums, at AVX2 width on every CPU (see its caller).
//
// A second stride-2 convolution of the same input whose taps are some of the first's (a ResNet
// shortcut's 1x1 beside its 3x3: SecondConv) reads the same phase planes: its tap (i, j) is the
// first's tap (i + ph - ph2, j + pw - pw2). The forward and the weight gradient run its GEMM on
// the planes the first split x into (its output gradient copied beside the first's), and the
// input gradient adds its taps to the phases' GEMMs. In a downsampling block of fashion-cnn
// (16 -> 32 channels, 28x28) this took the pair's forward to 0.79-0.86x and its weight gradients
// to 0.74-0.87x of the two convolutions' time one after the other (bench_conv BM_ConvPair).
//
// Every output element is computed by one thread in a fixed order, so forward and input-gradient
// results do not depend on the thread count; the weight gradient adds per-thread partial sums in
// thread order, like the other paths.
#include "backends/cpu/conv_direct.h"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

#include "backends/cpu/compute_buffers.h"
#include "backends/cpu/fma_tile.h"
#include "backends/cpu/row_pairs.h"
#include "hetrain/base/cpu_features.h"
#include "hetrain/base/thread_pool.h"

namespace hetrain::cpu {

namespace {

/// Floats of each weight-gradient sum's partial sums: one per lane at AVX2 width, which the
/// weight gradient runs at.
constexpr int64_t kAccLanes = 8;

/// A stride-1 or stride-2 convolution of one padded image.
struct Grid {
  int64_t C, O;  // input and output channels
  int64_t H, W;  // input, unpadded
  int64_t ph, pw, kh, kw, s;
  int64_t Hq, Wq;  // rows and columns of each phase plane (stride 1: the padded image)
  int64_t Ho, Wo;  // output
  int64_t phases() const { return s * s; }
  int64_t K() const { return C * kh * kw; }
  /// Floats of one image's phase plane; the grid position of output (oh, ow) is oh * Wq + ow.
  int64_t image() const { return Hq * Wq; }
  /// The largest tap offset within a phase plane: how far past its last grid position a
  /// stretch of positions reads.
  int64_t reach() const { return ((kh - 1) / s) * Wq + (kw - 1) / s; }
  /// Floats a phase plane needs after its image: split_row writes whole vectors, up to 8
  /// floats past a row's last column (zeros).
  static constexpr int64_t kSpill = 8;
};

Grid make_grid(int64_t C, int64_t O, int64_t H, int64_t W, int64_t kh, int64_t kw, int64_t ph,
               int64_t pw, int64_t s = 1) {
  Grid g{C, O, H, W, ph, pw, kh, kw, s, 0, 0, 0, 0};
  const int64_t Hp = H + 2 * ph, Wp = W + 2 * pw;
  g.Hq = (Hp + s - 1) / s;
  g.Wq = (Wp + s - 1) / s;
  g.Ho = (Hp - kh) / s + 1;
  g.Wo = (Wp - kw) / s + 1;
  return g;
}

/// x[2u] = lo[u] and x[2u + 1] = hi[u] for the W values of x (split_row's inverse), plus r where
/// r is not null, zero where m is not null and not > 0.
__attribute__((target("avx2,fma"))) void merge_row(const float* lo, const float* hi, int64_t W,
                                                   float* x, const float* r, const float* m) {
  for (int64_t u = 0; 2 * u < W; u += 8)
    store_pairs(x + 2 * u, load_first(lo + u, (W + 1) / 2 - u), load_first(hi + u, W / 2 - u),
                W - 2 * u, r ? r + 2 * u : nullptr, m ? m + 2 * u : nullptr);
}

/// Copies `planes` planes of rows x cols floats, contiguous at s, to d: planes ldp apart, rows
/// ldr apart (an image's output gradient onto the padded grids).
__attribute__((target("avx2,fma"))) void copy_planes(float* d, int64_t ldp, int64_t ldr,
                                                     const float* s, int64_t planes, int64_t rows,
                                                     int64_t cols) {
  for (int64_t p = 0; p < planes; ++p)
    copy_rows(d + p * ldp, ldr, s + p * rows * cols, cols, rows, cols);
}

/// Copies one image x (C, H, W) into its zero-padded phase planes of g.image() floats: channels
/// cstride apart, a channel's phases pstride apart. At stride 2 the caller zeroes the planes once:
/// every image writes the same cells (its pixels and split_row's zeros), so the padding stays.
__attribute__((target("avx2,fma"))) void pad_image(const float* x, const Grid& g, float* xp,
                                                   int64_t cstride, int64_t pstride) {
  for (int64_t c = 0; c < g.C; ++c) {
    const float* xc = x + c * g.H * g.W;
    if (g.s == 1) {
      float* p = xp + c * cstride;
      std::fill(p, p + g.ph * g.Wq, 0.0f);
      for (int64_t h = 0; h < g.H; ++h) {
        float* row = p + (g.ph + h) * g.Wq;
        std::fill(row, row + g.pw, 0.0f);
        copy_row(row + g.pw, xc + h * g.W, g.W);
        std::fill(row + g.pw + g.W, row + g.Wq, 0.0f);
      }
      std::fill(p + (g.ph + g.H) * g.Wq, p + g.image(), 0.0f);
      continue;
    }
    // Stride 2: each row of x goes to the phase of its padded row, its columns alternately to
    // the two column phases. Only the row phases some tap reads (a < kh) are written.
    for (int64_t h = 0; h < g.H; ++h) {
      const int64_t a = (h + g.ph) % 2, r = (h + g.ph) / 2;
      if (a >= g.kh) continue;
      const float* xr = xc + h * g.W;
      // Padded column w + pw: phase (w + pw) % 2, column (w + pw) / 2. The zeros split_row
      // writes past a row land on the next row of its phase, before that row is written, or in
      // the plane's kSpill floats.
      split_row(xr, g.W, xp + c * cstride + (a * 2 + g.pw % 2) * pstride + r * g.Wq + g.pw / 2,
                xp + c * cstride + (a * 2 + 1 - g.pw % 2) * pstride + r * g.Wq + (g.pw + 1) / 2);
    }
  }
}

/// off[k] for k = (c, i, j) of a kh x kw kernel whose tap (i, j) is the grid's tap (i + di,
/// j + dj): where tap k of grid position 0 reads, channels cstride apart and a channel's phase
/// planes pstride apart.
std::vector<int32_t> tap_offsets(const Grid& g, int64_t cstride, int64_t pstride, int64_t kh,
                                 int64_t kw, int64_t di, int64_t dj) {
  std::vector<int32_t> off(static_cast<size_t>(g.C * kh * kw));
  size_t k = 0;
  for (int64_t c = 0; c < g.C; ++c)
    for (int64_t i = di; i < di + kh; ++i)
      for (int64_t j = dj; j < dj + kw; ++j)
        off[k++] = static_cast<int32_t>(c * cstride + ((i % g.s) * g.s + j % g.s) * pstride +
                                        (i / g.s) * g.Wq + j / g.s);
  return off;
}
std::vector<int32_t> tap_offsets(const Grid& g, int64_t cstride, int64_t pstride) {
  return tap_offsets(g, cstride, pstride, g.kh, g.kw, 0, 0);
}

/// Whether t is a second convolution the stride-2 kernels take beside s (see SecondConv): stride
/// 2 both ways, the same input and output sizes, and t's window inside s's.
bool pairs(const ConvShape& s, const ConvShape& t) {
  return s.sh == 2 && s.sw == 2 && t.sh == 2 && t.sw == 2 && t.N == s.N && t.C == s.C &&
         t.H == s.H && t.W == s.W && t.Ho == s.Ho && t.Wo == s.Wo && s.ph - t.ph >= 0 &&
         s.pw - t.pw >= 0 && s.ph - t.ph + t.kh <= s.kh && s.pw - t.pw + t.kw <= s.kw;
}

/// Weights (O, K) packed for fma_tile (pack_tile_rows).
template <class Weight>
std::vector<float> pack_weights(int64_t O, int64_t K, Weight weight) {
  std::vector<float> p(static_cast<size_t>(O * K));
  pack_tile_rows(O, K, weight, p.data());
  return p;
}
/// w (O, K) row-major, packed for fma_tile.
std::vector<float> pack_weights(int64_t O, int64_t K, const float* w) {
  return pack_weights(O, K, [w, K](int64_t o, int64_t k) { return w[o * K + k]; });
}

/// Where the taps of a second convolution t (pairs(s, t)) read on the grid g of s: its tap (i, j)
/// is s's tap (i + s.ph - t.ph, j + s.pw - t.pw).
std::vector<int32_t> second_taps(const Grid& g, const ConvShape& t, int64_t cstride,
                                 int64_t pstride) {
  return tap_offsets(g, cstride, pstride, t.kh, t.kw, g.ph - t.ph, g.pw - t.pw);
}

/// A second convolution t on forward_images' grid (pairs(s, t)): its weights packed for fma_tile
/// and its output y (N, O2, Ho, Wo).
struct GridSecond {
  const ConvShape& t;
  std::vector<float> wpk;
  float* y;
};

/// out[r * Q + q] = sum_k w(r, k) * in[off[k] + q] for R rows and q in [0, Q), Q a multiple of 8;
/// w packed by pack_tile_rows. Column tiles outside, row blocks inside: a tile's stretch of input
/// (every tap's 24 or 64 positions) stays in L1 for all the row blocks (the 16 -> 32 stride-2
/// forward took 0.97x the time of rows outside, interleaved in one process).
struct ForwardGrid {
  template <Isa I>
  [[gnu::always_inline]] static inline void run(const float* in, const int32_t* off, int64_t K,
                                                const float* w, int64_t R, float* out, int64_t Q) {
    for_column_tiles<I>(
        Q, [&]<class V, int NV>(int64_t q) __attribute__((always_inline)) {
          for_row_blocks(
              R, [&]<int RB>(int64_t r0) __attribute__((always_inline)) {
                fma_tile<V, RB, NV>([in, off, q](int64_t k) { return in + q + off[k]; }, w + r0 * K,
                                    K, out + r0 * Q + q, Q);
              });
        });
  }
};
void forward_grid(const float* in, const int32_t* off, int64_t K, const float* w, int64_t R,
                  float* out, int64_t Q) {
  tile_dispatch<ForwardGrid>(in, off, K, w, R, out, Q);
}

/// One image's output y (O, Ho, Wo) from its grid yb (O rows of Q), plus b and r where not null.
__attribute__((target("avx2,fma"))) void copy_out(const Grid& g, int64_t O, const float* yb,
                                                  int64_t Q, const float* b, const float* r,
                                                  float* y) {
  for (int64_t o = 0; o < O; ++o)
    for (int64_t oh = 0; oh < g.Ho; ++oh) {
      const int64_t row = (o * g.Ho + oh) * g.Wo;
      const float* a = r ? r + row : nullptr;
      if (b)
        copy_row<true>(y + row, yb + o * Q + oh * g.Wq, g.Wo, a, b[o]);
      else
        copy_row(y + row, yb + o * Q + oh * g.Wq, g.Wo, a);
    }
}

/// Runs the forward kernel over n images: x (n, C, H, W) -> y (n, O, Ho, Wo) [+ b] [+ r], one
/// image's grid positions (rounded up to whole vectors) at a time. (Laying small images side by
/// side, as the weight gradient does, made a 7x7-output stride-2 forward no faster, in a version
/// that walked row blocks outside: the group's input fell out of L1 between them.) With second,
/// its output too, from the same phase planes.
void forward_images(const Grid& g, const float* x, const std::vector<float>& wpk, const float* b,
                    float* y, int64_t n, const float* r = nullptr,
                    const GridSecond* second = nullptr) {
  const int64_t Q = (g.Ho * g.Wq + 7) / 8 * 8;
  const int64_t pstride = std::max(Q + g.reach(), g.image() + Grid::kSpill);
  const int64_t cstride = g.phases() * pstride;
  const int64_t K = g.K(), O2 = second ? second->t.O : 0, out = g.Ho * g.Wo;
  const std::vector<int32_t> off = tap_offsets(g, cstride, pstride);
  const std::vector<int32_t> off2 = second ? second_taps(g, second->t, cstride, pstride) : off;
  const int64_t K2 = static_cast<int64_t>(off2.size());
  parallel_for(n, 1, [&](int64_t n0, int64_t n1) {
    Array xp = workspace({g.C * cstride}, Dtype::f32), yq = workspace({(g.O + O2) * Q}, Dtype::f32);
    float *xb = xp.data<float>(), *yb = yq.data<float>(), *yb2 = yb + g.O * Q;
    // Past the image, the last tile reads values that only thrown-away positions use.
    std::fill(xb, xb + xp.numel(), 0.0f);
    for (int64_t i = n0; i < n1; ++i) {
      pad_image(x + i * g.C * g.H * g.W, g, xb, cstride, pstride);
      forward_grid(xb, off.data(), K, wpk.data(), g.O, yb, Q);
      copy_out(g, g.O, yb, Q, b, r ? r + i * g.O * out : nullptr, y + i * g.O * out);
      if (!second) continue;
      forward_grid(xb, off2.data(), K2, second->wpk.data(), O2, yb2, Q);
      copy_out(g, O2, yb2, Q, nullptr, nullptr, second->y + i * O2 * out);
    }
  });
}

/// acc[r][j] (the first kLanes<V> of its kAccLanes partial sums; lane i sums the q = i mod
/// lanes) += sum_q g[r * ldg + q] * in[off[j] + q] for q in [0, Q), Q a multiple of the lanes.
template <class V, int R, int J>
[[gnu::always_inline]] inline void weight_tile(const float* gq, int64_t ldg, int64_t Q,
                                               const float* in, const int32_t* off, float* acc,
                                               int64_t K) {
  constexpr int L = kLanes<V>;
  V a[R][J];
  const float* src[J];
#pragma GCC unroll 3
  for (int j = 0; j < J; ++j) src[j] = in + off[j];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 3
    for (int j = 0; j < J; ++j) vload(a[r][j], acc + (r * K + j) * kAccLanes);
  for (int64_t q = 0; q < Q; q += L) {
    V xv[J];
#pragma GCC unroll 3
    for (int j = 0; j < J; ++j) vload(xv[j], src[j] + q);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      V gv;
      vload(gv, gq + r * ldg + q);
#pragma GCC unroll 3
      for (int j = 0; j < J; ++j) a[r][j] = gv * xv[j] + a[r][j];
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 3
    for (int j = 0; j < J; ++j) vstore(acc + (r * K + j) * kAccLanes, a[r][j]);
}

/// The weight-gradient sums of rows [0, O) of g (ld apart) with the K taps off, into acc (K
/// sums of kAccLanes per row): register tiles of 4 rows by 3 taps. Q is a multiple of 8, so this
/// runs at AVX2 width (see its caller).
struct WeightRows {
  template <Isa I>
  [[gnu::always_inline]] static inline void run(const float* gq, int64_t ld, int64_t O, int64_t Q,
                                                const float* in, const int32_t* off, float* acc,
                                                int64_t K) {
    for_row_blocks(
        O, [&]<int R>(int64_t o0) __attribute__((always_inline)) {
          for_blocks<3>(
              K, [&]<int J>(int64_t k) __attribute__((always_inline)) {
                weight_tile<F32Vec<I>, R, J>(gq + o0 * ld, ld, Q, in, off + k,
                                             acc + (o0 * K + k) * kAccLanes, K);
              });
        });
  }
};

std::atomic<bool>& disabled_flag() {
  static std::atomic<bool> flag{[] {
    const char* v = std::getenv("HETRAIN_CONV_DIRECT");
    return v && std::strcmp(v, "0") == 0;
  }()};
  return flag;
}
std::atomic<int64_t> runs{0};

/// Whether the direct kernels take the convolution: the forward pass (forward) or either gradient.
bool applies(const ConvShape& s, bool forward) {
  if (disabled_flag() || s.N <= 0 || s.sh != s.sw || s.sh < 1 || s.sh > 2) return false;
  // A 1x1 stride-1 convolution is one GEMM per image; at stride 2 (a ResNet shortcut) the
  // copy into phase planes reads x once and writes a quarter of it.
  if (s.kh * s.kw < 2 && s.sh == 1) return false;
  if (s.ph < 0 || s.pw < 0 || s.ph > s.kh - 1 || s.pw > s.kw - 1) return false;
  // Narrow images waste too much on the padded grid's thrown-away columns: (kw - 1) of every
  // W + 2 pw. On fashion-cnn's 7x7 64-channel conv oneDNN was 1.2-1.5x faster in each pass;
  // at 14 wide and above the direct kernels were as fast or faster (bench_conv, 2 threads).
  // Stride 2 to a 7x7 output (32 -> 64 channels from 14x14; one column in 8 thrown away): the
  // forward took 0.81x (1 thread) and 0.83x (2 threads) of oneDNN's time once forward_grid
  // walked column tiles outside row blocks; the input and weight gradients 1.01-1.17x, so they
  // stay with oneDNN, as does the 1x1 shortcut (1.15x and 0.96x of the im2col path's forward).
  const bool narrow_forward = forward && s.sh == 2 && s.kh * s.kw > 1;
  if (std::min(s.Wo, s.W) < (narrow_forward ? 7 : 12)) return false;
  const CpuFeatures& f = cpu_features();
  if (!f.avx2 || !f.fma) return false;
  // Offsets are 32-bit: every plane of the larger side must fit, as up to four phase planes of a
  // group of small images (up to 4096 positions and one image) with a tile and the taps' reach
  // of slack.
  const Grid g = make_grid(std::max(s.C, s.O), 1, std::max(s.H, s.Ho), std::max(s.W, s.Wo), s.kh,
                           s.kw, s.kh - 1, s.kw - 1);
  return g.C * 4 * (g.image() + 4096 + g.reach() + 2 * kMaxTileColumns + 8) <
         std::numeric_limits<int32_t>::max();
}

/// One image's dx (C, H, W) from its four phase grids (C rows of Qr each, rows Wg apart), plus
/// addend where not null, zero where mask is not null and not > 0. dx row h is padded row h + ph:
/// phase row (h + ph) % 2, grid row (h + ph) / 2; its columns alternate between the two column
/// phases, starting with phase pw % 2.
__attribute__((target("avx2,fma"))) void merge_phases(const ConvShape& s, const float* op,
                                                      int64_t Qr, int64_t Wg, float* dx,
                                                      const float* addend, const float* mask) {
  for (int64_t c = 0; c < s.C; ++c)
    for (int64_t h = 0; h < s.H; ++h) {
      const int64_t a = (h + s.ph) % 2, r = (h + s.ph) / 2;
      const float* lo = op + (a * 2 + s.pw % 2) * s.C * Qr + c * Qr + r * Wg + s.pw / 2;
      const float* hi = op + (a * 2 + 1 - s.pw % 2) * s.C * Qr + c * Qr + r * Wg + (s.pw + 1) / 2;
      const int64_t row = (c * s.H + h) * s.W;
      merge_row(lo, hi, s.W, dx + row, addend ? addend + row : nullptr,
                mask ? mask + row : nullptr);
    }
}

/// The input gradient of a stride-2 convolution. Phase (a, b) of the padded input, pixels
/// (2r + a, 2t + b), takes the taps with i%2 = a and j%2 = b: dx_ab[c][r][t] = sum over o and
/// those taps of w[o][c][i][j] * gy[o][r - i/2][t - j/2], a stride-1 correlation on the output
/// gradient padded with (kh-1)/2 zero rows above and (kw-1)/2 zero columns left, on a grid of
/// the phase's Hq rows of Wg = (kw-1)/2 + Wq positions. A phase without taps (a 1x1 kernel's
/// three odd phases) gets zeros. With second, its output gradient's planes follow gy's and its
/// taps join the phases as the taps of this kernel that read the same pixels.
void strided_backward_data(const ConvShape& s, const float* gy, const float* w, float* dx,
                           const float* addend, const SecondConv* second, const float* mask) {
  const Grid g = make_grid(s.C, s.O, s.H, s.W, s.kh, s.kw, s.ph, s.pw, s.sh);
  const int64_t st = g.s, pt = (s.kh - 1) / st, pl = (s.kw - 1) / st, Wg = pl + g.Wq;
  const int64_t Qr = (g.Hq * Wg + 7) / 8 * 8;
  const int64_t plane = pt * Wg + pl + Qr;  // >= (pt + Hq) rows: every row the taps read
  // The second convolution's output gradient takes O2 more planes after gy's; its tap (i, j)
  // reads what this kernel's tap (i + ph - ph2, j + pw - pw2) reads.
  const int64_t O2 = second ? second->s.O : 0;
  struct Conv {
    const float* w;
    int64_t O, kh, kw;
    int64_t di, dj;  // its tap (i, j) as this kernel's tap (i + di, j + dj)
    int64_t o0;      // the plane of its first channel
  };
  std::vector<Conv> convs{{w, s.O, s.kh, s.kw, 0, 0, 0}};
  if (second) {
    const ConvShape& t = second->s;
    convs.push_back({second->w, t.O, t.kh, t.kw, s.ph - t.ph, s.pw - t.pw, s.O});
  }
  struct Phase {
    int64_t a, b, K;
    std::vector<int32_t> off;
    std::vector<float> wpk;
  };
  std::vector<Phase> phases;
  for (int64_t a = 0; a < st; ++a)
    for (int64_t b = 0; b < st; ++b) {
      // Rows k of the phase's GEMM, per convolution its channels outer and its taps in this
      // phase inner: where the row reads the padded gradient, and its weight for input channel
      // c at wk[k].first + c * wk[k].second.
      Phase p{a, b, 0, {}, {}};
      std::vector<std::pair<const float*, int64_t>> wk;
      for (const Conv& cv : convs)
        for (int64_t o = 0; o < cv.O; ++o)
          for (int64_t i = 0; i < cv.kh; ++i)
            for (int64_t j = 0; j < cv.kw; ++j) {
              const int64_t ti = i + cv.di, tj = j + cv.dj;  // as this kernel's tap
              if (ti % st != a || tj % st != b) continue;
              p.off.push_back(
                  static_cast<int32_t>((cv.o0 + o) * plane + (pt - ti / st) * Wg + (pl - tj / st)));
              wk.emplace_back(cv.w + (o * s.C * cv.kh + i) * cv.kw + j, cv.kh * cv.kw);
            }
      p.K = static_cast<int64_t>(p.off.size());
      if (p.K > 0)
        p.wpk = pack_weights(s.C, p.K, [&](int64_t c, int64_t k) {
          const auto [w0, cstep] = wk[static_cast<size_t>(k)];
          return w0[c * cstep];
        });
      phases.push_back(std::move(p));
    }
  parallel_for(s.N, 1, [&](int64_t n0, int64_t n1) {
    Array gpad = workspace({(s.O + O2) * plane}, Dtype::f32);
    Array out = workspace({4, s.C * Qr}, Dtype::f32);  // one grid per phase
    float *gp = gpad.data<float>(), *op = out.data<float>();
    std::fill(gp, gp + gpad.numel(), 0.0f);  // the copies below overwrite only gy's own cells
    for (int64_t n = n0; n < n1; ++n) {
      const int64_t out = s.Ho * s.Wo;  // the second's planes follow gy's
      copy_planes(gp + pt * Wg + pl, plane, Wg, gy + n * s.O * out, s.O, s.Ho, s.Wo);
      if (second)
        copy_planes(gp + s.O * plane + pt * Wg + pl, plane, Wg, second->gy + n * O2 * out, O2, s.Ho,
                    s.Wo);
      for (const Phase& p : phases) {
        float* grid = op + (p.a * st + p.b) * s.C * Qr;
        if (p.K == 0) {
          std::fill(grid, grid + s.C * Qr, 0.0f);
          continue;
        }
        forward_grid(gp, p.off.data(), p.K, p.wpk.data(), s.C, grid, Qr);
      }
      const int64_t image = n * s.C * s.H * s.W;
      merge_phases(s, op, Qr, Wg, dx + image, addend ? addend + image : nullptr,
                   mask ? mask + image : nullptr);
    }
  });
}

}  // namespace

void set_direct_conv_disabled(bool disabled) { disabled_flag() = disabled; }
int64_t direct_conv_runs() { return runs; }

bool direct_conv_forward(const ConvShape& s, const float* x, const float* w, const float* b,
                         float* y, const SecondConv* second) {
  if (!applies(s, true) || (second && !pairs(s, second->s))) return false;
  const Grid g = make_grid(s.C, s.O, s.H, s.W, s.kh, s.kw, s.ph, s.pw, s.sh);
  const auto wpk = pack_weights(s.O, g.K(), w);
  if (!second) {
    forward_images(g, x, wpk, b, y, s.N);
    ++runs;
    return true;
  }
  const ConvShape& t = second->s;
  const GridSecond g2{t, pack_weights(t.O, t.C * t.kh * t.kw, second->w), second->out};
  forward_images(g, x, wpk, b, y, s.N, nullptr, &g2);
  runs += 2;
  return true;
}

bool direct_conv_backward_data(const ConvShape& s, const float* gy, const float* w, float* dx,
                               const float* addend, const SecondConv* second, const float* mask) {
  if (second) {
    ConvShape both = s;  // its output gradient planes, all O + O2 of them, within 32-bit offsets
    both.O += second->s.O;
    if (!applies(both, false) || !pairs(s, second->s)) return false;
    strided_backward_data(s, gy, w, dx, addend, second, mask);
    runs += 2;
    return true;
  }
  if (!applies(s, false) || (mask && s.sh == 1)) return false;
  if (s.sh != 1) {
    strided_backward_data(s, gy, w, dx, addend, nullptr, mask);
    ++runs;
    return true;
  }
  // dx = conv(gy, w flipped in space, O and C swapped), padding k - 1 - p.
  const Grid g = make_grid(s.O, s.C, s.Ho, s.Wo, s.kh, s.kw, s.kh - 1 - s.ph, s.kw - 1 - s.pw);
  const int64_t K = g.K(), khw = s.kh * s.kw;
  const auto wpk = pack_weights(s.C, K, [&](int64_t c, int64_t k) {
    const int64_t o = k / khw, i = (k % khw) / s.kw, j = k % s.kw;
    return w[((o * s.C + c) * s.kh + (s.kh - 1 - i)) * s.kw + (s.kw - 1 - j)];
  });
  forward_images(g, gy, wpk, nullptr, dx, s.N, addend);
  ++runs;
  return true;
}

bool direct_conv_backward_weights(const ConvShape& s, const float* x, const float* gy, float* dw,
                                  const SecondConv* second) {
  if (!applies(s, false) || (second && !pairs(s, second->s))) return false;
  const Grid g = make_grid(s.C, s.O, s.H, s.W, s.kh, s.kw, s.ph, s.pw, s.sh);
  // With a second convolution, its output gradient's rows follow gy's on the same grid and its
  // taps read the same phase planes; its sums follow this one's in the accumulators.
  const int64_t K = g.K(), O2 = second ? second->s.O : 0;
  const int64_t K2 = second ? second->s.C * second->s.kh * second->s.kw : 0;
  const int64_t sums = s.O * K + O2 * K2;
  // Images are laid side by side, `group` at a time, S floats apart, so that each tile's sums run
  // over a long stretch of positions: small images (7x7) would otherwise spend more time loading
  // and storing the tile's partial sums than multiplying.
  const int64_t S = (g.image() + Grid::kSpill + 7) / 8 * 8;
  const int64_t group = std::clamp<int64_t>(4096 / S, 1, s.N);
  const int64_t ld = group * S;  // floats between phase planes (x) and between rows (g)
  const int64_t cstride = g.phases() * ld;
  const std::vector<int32_t> off = tap_offsets(g, cstride, ld);
  const std::vector<int32_t> off2 =
      second ? second_taps(g, second->s, cstride, ld) : std::vector<int32_t>();
  const int64_t chunks = std::min<int64_t>(s.N, num_threads());
  const int64_t out = s.Ho * s.Wo;
  Array partial = workspace({chunks, sums}, Dtype::f32);
  parallel_for(chunks, 1, [&](int64_t cb, int64_t ce) {
    // x gets one more plane of slack: the last position's taps read past the last image.
    Array xp = workspace({g.C * cstride + S}, Dtype::f32);
    Array gq = workspace({(s.O + O2) * ld}, Dtype::f32);
    Array acc = workspace({sums * kAccLanes}, Dtype::f32);
    float *xb = xp.data<float>(), *gb = gq.data<float>(), *a = acc.data<float>();
    for (int64_t c = cb; c < ce; ++c) {
      // Zeros between and after the images' planes and in the grid's thrown-away columns; the
      // copies below overwrite only the images' own cells.
      std::fill(xb, xb + xp.numel(), 0.0f);
      std::fill(gb, gb + gq.numel(), 0.0f);
      std::fill(a, a + acc.numel(), 0.0f);
      const int64_t n_end = (c + 1) * s.N / chunks;
      for (int64_t n0 = c * s.N / chunks; n0 < n_end; n0 += group) {
        const int64_t count = std::min(group, n_end - n0);
        for (int64_t i = 0; i < count; ++i) {
          pad_image(x + (n0 + i) * s.C * s.H * s.W, g, xb + i * S, cstride, ld);
          copy_planes(gb + i * S, ld, g.Wq, gy + (n0 + i) * s.O * out, s.O, s.Ho, s.Wo);
          if (second)
            copy_planes(gb + s.O * ld + i * S, ld, g.Wq, second->gy + (n0 + i) * O2 * out, O2, s.Ho,
                        s.Wo);
        }
        const int64_t Q = count * S;
        // At AVX2 width on every CPU: at AVX-512 the 16 -> 32 stride-2 weight gradient of
        // fashion-cnn took 1.12x the time (bench_conv BM_ConvAB/2/2/6/7, Xeon, 2 threads), and
        // 1.68x with 4 x 6 tiles; its unaligned tap loads cross a cache line twice as often.
        run_avx2<WeightRows>(gb, ld, s.O, Q, xb, off.data(), a, K);
        if (second)
          run_avx2<WeightRows>(gb + s.O * ld, ld, O2, Q, xb, off2.data(), a + s.O * K * kAccLanes,
                               K2);
      }
      float* sum = partial.data<float>() + c * sums;
      for (int64_t i = 0; i < sums; ++i) {
        const float* v = a + i * kAccLanes;
        sum[i] = ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
      }
    }
  });
  // The chunks' sums added in chunk order, into dw and the second's dw.
  const float* p = partial.data<float>();
  for (int64_t i = 0; i < sums; ++i) {
    float v = p[i];
    for (int64_t c = 1; c < chunks; ++c) v += p[c * sums + i];
    (i < s.O * K ? dw[i] : second->out[i - s.O * K]) = v;
  }
  runs += second ? 2 : 1;
  return true;
}

}  // namespace hetrain::cpu
