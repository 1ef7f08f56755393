// Direct stride-1 convolution on AVX2 + FMA (see conv_direct.h).
//
// Each image is copied once into a zero-padded buffer, one plane per channel. On that buffer a
// stride-1 convolution is a GEMM whose second operand is read in place: with q = oh * Wp + ow an
// output position on the padded-width grid (Wp = W + 2 pw; the columns ow >= Wo are computed and
// thrown away), out[o][q] = sum_k w[o][k] * in[off[k] + q], where k runs over (c, i, j) and
// off[k] = c * plane + i * Wp + j. The register tile is 4 output channels by 24 consecutive grid
// positions (12 accumulators); each step loads three vectors of input and broadcasts four weights.
// The input gradient is the same kernel on the padded output gradient with the kernel flipped and
// transposed. The weight gradient is dw[o][k] = sum_q g[o][q] * in[off[k] + q] over every image,
// with g the output gradient on the same grid (zero in the thrown-away columns), vectorised
// along q with 4 x 3 (o, k) tiles of vector partial sums.
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
#include "hetrain/base/cpu_features.h"
#include "hetrain/base/thread_pool.h"

namespace hetrain::cpu {

namespace {

constexpr int kVecs = 3;  // 8-float vectors of grid positions per tile
constexpr int64_t kTile = 8 * kVecs;

/// A stride-1 convolution of one padded image.
struct Grid {
  int64_t C, O;  // input and output channels
  int64_t H, W;  // input, unpadded
  int64_t ph, pw, kh, kw;
  int64_t Wp, Ho, Wo;  // padded input width; output
  int64_t Qr;          // grid positions computed: Ho * Wp rounded up to whole tiles
  int64_t plane;       // floats per padded input channel, with the slack the last tile reads
  int64_t K() const { return C * kh * kw; }
};

Grid make_grid(int64_t C, int64_t O, int64_t H, int64_t W, int64_t kh, int64_t kw, int64_t ph,
               int64_t pw) {
  Grid g{C, O, H, W, ph, pw, kh, kw, W + 2 * pw, 0, 0, 0, 0};
  g.Ho = H + 2 * ph - kh + 1;
  g.Wo = g.Wp - kw + 1;
  g.Qr = (g.Ho * g.Wp + kTile - 1) / kTile * kTile;
  // The last tile reads up to off[K-1] + Qr - 1 in the last plane; >= (H + 2 ph) * Wp.
  g.plane = (kh - 1) * g.Wp + (kw - 1) + g.Qr;
  return g;
}

/// Copies one image x (C, H, W) into C zero-padded planes of g.plane floats, cstride apart.
void pad_image(const float* x, const Grid& g, float* xp, int64_t cstride) {
  for (int64_t c = 0; c < g.C; ++c) {
    float* p = xp + c * cstride;
    const float* xc = x + c * g.H * g.W;
    std::fill(p, p + g.ph * g.Wp, 0.0f);
    for (int64_t h = 0; h < g.H; ++h) {
      float* row = p + (g.ph + h) * g.Wp;
      std::fill(row, row + g.pw, 0.0f);
      std::memcpy(row + g.pw, xc + h * g.W, static_cast<size_t>(g.W) * sizeof(float));
      std::fill(row + g.pw + g.W, row + g.Wp, 0.0f);
    }
    std::fill(p + (g.ph + g.H) * g.Wp, p + g.plane, 0.0f);
  }
}

/// off[k] for k = (c, i, j): where tap k of grid position 0 reads, planes cstride apart.
std::vector<int32_t> tap_offsets(const Grid& g, int64_t cstride) {
  std::vector<int32_t> off(static_cast<size_t>(g.K()));
  size_t k = 0;
  for (int64_t c = 0; c < g.C; ++c)
    for (int64_t i = 0; i < g.kh; ++i)
      for (int64_t j = 0; j < g.kw; ++j)
        off[k++] = static_cast<int32_t>(c * cstride + i * g.Wp + j);
  return off;
}

/// Weights (O, K) packed for fma_tile (pack_tile_rows).
template <class Weight>
std::vector<float> pack_weights(int64_t O, int64_t K, Weight weight) {
  std::vector<float> p(static_cast<size_t>(O * K));
  pack_tile_rows(O, K, weight, p.data());
  return p;
}

/// out[r][q] = sum_k w[k][r] * in[off[k] + q] for R rows and q in [0, Qr).
template <int R>
__attribute__((target("avx2,fma"))) void forward_rows(const float* in, const int32_t* off,
                                                      int64_t K, const float* w, float* out,
                                                      int64_t Qr) {
  for (int64_t q = 0; q < Qr; q += kTile)
    fma_tile<R, kVecs>([base = in + q, off](int64_t k) { return base + off[k]; }, w, K, out + q,
                       Qr);
}

/// yq (O, Qr) for one padded image.
void forward_image(const float* xp, const Grid& g, const std::vector<int32_t>& off,
                   const std::vector<float>& wpk, float* yq) {
  const int64_t K = g.K();
  for_row_blocks(g.O, [&]<int R>(int64_t o0) {
    forward_rows<R>(xp, off.data(), K, wpk.data() + o0 * K, yq + o0 * g.Qr, g.Qr);
  });
}

/// Runs the forward kernel over n images: x (n, C, H, W) -> y (n, O, Ho, Wo) [+ b].
void forward_images(const Grid& g, const float* x, const std::vector<float>& wpk, const float* b,
                    float* y, int64_t n) {
  const std::vector<int32_t> off = tap_offsets(g, g.plane);
  parallel_for(n, 1, [&](int64_t n0, int64_t n1) {
    Array xp = workspace({g.C * g.plane}, Dtype::f32), yq = workspace({g.O * g.Qr}, Dtype::f32);
    for (int64_t i = n0; i < n1; ++i) {
      pad_image(x + i * g.C * g.H * g.W, g, xp.data<float>(), g.plane);
      forward_image(xp.data<float>(), g, off, wpk, yq.data<float>());
      float* yi = y + i * g.O * g.Ho * g.Wo;
      for (int64_t o = 0; o < g.O; ++o) {
        const float bias = b ? b[o] : 0.0f;
        const float* src = yq.data<float>() + o * g.Qr;
        float* dst = yi + o * g.Ho * g.Wo;
        for (int64_t oh = 0; oh < g.Ho; ++oh) {
          const float* s = src + oh * g.Wp;
          float* d = dst + oh * g.Wo;
          if (b)
            for (int64_t ow = 0; ow < g.Wo; ++ow) d[ow] = s[ow] + bias;
          else
            std::memcpy(d, s, static_cast<size_t>(g.Wo) * sizeof(float));
        }
      }
    }
  });
}

/// acc[r][j] (8 partial sums each) += sum_q g[r * ldg + q] * in[off[j] + q] for q in [0, Q).
template <int R, int J>
__attribute__((target("avx2,fma"))) void weight_tile(const float* gq, int64_t ldg, int64_t Q,
                                                     const float* in, const int32_t* off,
                                                     float* acc, int64_t K) {
  __m256 a[R][J];
  const float* src[J];
#pragma GCC unroll 3
  for (int j = 0; j < J; ++j) src[j] = in + off[j];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 3
    for (int j = 0; j < J; ++j) a[r][j] = _mm256_loadu_ps(acc + (r * K + j) * 8);
  for (int64_t q = 0; q < Q; q += 8) {
    __m256 xv[J];
#pragma GCC unroll 3
    for (int j = 0; j < J; ++j) xv[j] = _mm256_loadu_ps(src[j] + q);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const __m256 gv = _mm256_loadu_ps(gq + r * ldg + q);
#pragma GCC unroll 3
      for (int j = 0; j < J; ++j) a[r][j] = _mm256_fmadd_ps(gv, xv[j], a[r][j]);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 3
    for (int j = 0; j < J; ++j) _mm256_storeu_ps(acc + (r * K + j) * 8, a[r][j]);
}

template <int R>
void weight_rows(const float* gq, int64_t ldg, int64_t Q, const float* in, const int32_t* off,
                 float* acc, int64_t K) {
  int64_t k = 0;
  for (; k + 3 <= K; k += 3) weight_tile<R, 3>(gq, ldg, Q, in, off + k, acc + k * 8, K);
  if (K - k == 2) weight_tile<R, 2>(gq, ldg, Q, in, off + k, acc + k * 8, K);
  if (K - k == 1) weight_tile<R, 1>(gq, ldg, Q, in, off + k, acc + k * 8, K);
}

std::atomic<bool>& disabled_flag() {
  static std::atomic<bool> flag{[] {
    const char* v = std::getenv("HETRAIN_CONV_DIRECT");
    return v && std::strcmp(v, "0") == 0;
  }()};
  return flag;
}
std::atomic<int64_t> runs{0};

bool applies(const ConvShape& s) {
  if (disabled_flag() || s.N <= 0 || s.sh != 1 || s.sw != 1 || s.kh * s.kw < 2) return false;
  if (s.ph < 0 || s.pw < 0 || s.ph > s.kh - 1 || s.pw > s.kw - 1) return false;
  // Narrow images waste too much on the padded grid's thrown-away columns: (kw - 1) of every
  // W + 2 pw. On fashion-cnn's 7x7 64-channel conv oneDNN was 1.2-1.5x faster in each pass;
  // at 14 wide and above the direct kernels were as fast or faster (bench_conv, 2 threads).
  if (std::min(s.Wo, s.W) < 12) return false;
  const CpuFeatures& f = cpu_features();
  if (!f.avx2 || !f.fma) return false;
  // Offsets are 32-bit: every plane of the larger side (and a group of small images) must fit.
  const Grid g = make_grid(std::max(s.C, s.O), 1, std::max(s.H, s.Ho), std::max(s.W, s.Wo), s.kh,
                           s.kw, s.kh - 1, s.kw - 1);
  return g.C * (g.plane + 4096 + 8) < std::numeric_limits<int32_t>::max();
}

}  // namespace

void set_direct_conv_disabled(bool disabled) { disabled_flag() = disabled; }
int64_t direct_conv_runs() { return runs; }

bool direct_conv_forward(const ConvShape& s, const float* x, const float* w, const float* b,
                         float* y) {
  if (!applies(s)) return false;
  const Grid g = make_grid(s.C, s.O, s.H, s.W, s.kh, s.kw, s.ph, s.pw);
  const int64_t K = g.K();
  const auto wpk = pack_weights(s.O, K, [&](int64_t o, int64_t k) { return w[o * K + k]; });
  forward_images(g, x, wpk, b, y, s.N);
  ++runs;
  return true;
}

bool direct_conv_backward_data(const ConvShape& s, const float* gy, const float* w, float* dx) {
  if (!applies(s)) return false;
  // dx = conv(gy, w flipped in space, O and C swapped), padding k - 1 - p.
  const Grid g = make_grid(s.O, s.C, s.Ho, s.Wo, s.kh, s.kw, s.kh - 1 - s.ph, s.kw - 1 - s.pw);
  const int64_t K = g.K(), khw = s.kh * s.kw;
  const auto wpk = pack_weights(s.C, K, [&](int64_t c, int64_t k) {
    const int64_t o = k / khw, i = (k % khw) / s.kw, j = k % s.kw;
    return w[((o * s.C + c) * s.kh + (s.kh - 1 - i)) * s.kw + (s.kw - 1 - j)];
  });
  forward_images(g, gy, wpk, nullptr, dx, s.N);
  ++runs;
  return true;
}

bool direct_conv_backward_weights(const ConvShape& s, const float* x, const float* gy, float* dw) {
  if (!applies(s)) return false;
  const Grid g = make_grid(s.C, s.O, s.H, s.W, s.kh, s.kw, s.ph, s.pw);
  const int64_t K = g.K();
  // Images are laid side by side, `group` at a time, S floats apart, so that each tile's sums run
  // over a long stretch of positions: small images (7x7) would otherwise spend more time loading
  // and storing the tile's partial sums than multiplying.
  const int64_t S = (g.plane + 7) / 8 * 8;
  const int64_t group = std::clamp<int64_t>(4096 / S, 1, s.N);
  const int64_t ld = group * S;  // floats between channels (x) and between rows (g)
  const std::vector<int32_t> off = tap_offsets(g, ld);
  const int64_t chunks = std::min<int64_t>(s.N, num_threads());
  Array partial = workspace({chunks, s.O * K}, Dtype::f32);
  parallel_for(chunks, 1, [&](int64_t cb, int64_t ce) {
    // x gets one more plane of slack: the last position's taps read past the last image.
    Array xp = workspace({g.C * ld + S}, Dtype::f32), gq = workspace({g.O * ld}, Dtype::f32);
    Array acc = workspace({s.O * K * 8}, Dtype::f32);
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
          pad_image(x + (n0 + i) * s.C * s.H * s.W, g, xb + i * S, ld);
          const float* gn = gy + (n0 + i) * s.O * s.Ho * s.Wo;
          for (int64_t o = 0; o < s.O; ++o)
            for (int64_t oh = 0; oh < s.Ho; ++oh)
              std::memcpy(gb + o * ld + i * S + oh * g.Wp, gn + (o * s.Ho + oh) * s.Wo,
                          static_cast<size_t>(s.Wo) * sizeof(float));
        }
        const int64_t Q = count * S;
        for_row_blocks(s.O, [&]<int R>(int64_t o0) {
          weight_rows<R>(gb + o0 * ld, ld, Q, xb, off.data(), a + o0 * K * 8, K);
        });
      }
      float* out = partial.data<float>() + c * s.O * K;
      for (int64_t i = 0; i < s.O * K; ++i) {
        const float* v = a + i * 8;
        out[i] = ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
      }
    }
  });
  const float* p = partial.data<float>();
  std::copy(p, p + s.O * K, dw);
  for (int64_t c = 1; c < chunks; ++c)
    for (int64_t i = 0; i < s.O * K; ++i) dw[i] += p[c * s.O * K + i];
  ++runs;
  return true;
}

}  // namespace hetrain::cpu
