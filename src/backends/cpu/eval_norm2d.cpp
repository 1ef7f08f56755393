// CPU kernels for the fused batch_norm2d forward and backward. Each runs two passes over the
// (n, c) planes in memory order, split over the thread pool by planes: the first computes every
// plane's sums (eight partial sums in the compute type; the forward's two sums of a plane read it
// from memory once, the second hits L1), a per-channel step adds the planes in n order in f64,
// and the second pass writes the output. Planes' sums are stored, so results do not depend on the
// thread count or on how the planes are split. (Before, each thread walked its channels and read
// every channel's N planes, C * H * W floats apart: the prefetchers restarted on each 3 KB plane,
// and a 16-channel 28x28 batch norm and relu forward and backward ran at 6-8 GB/s in a
// fashion-cnn step.) On f32 with AVX2 the plane loops run in 8-float vectors that hold the same
// eight partial sums and round the same way (no FMA): results are the same bits on any CPU.
#include <immintrin.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

#include "backends/cpu/vec_math.h"
#include "graph/prims/elementwise.h"
#include "graph/prims/norm2d.h"
#include "hetrain/base/cpu_features.h"
#include "hetrain/base/dispatch.h"
#include "hetrain/base/thread_pool.h"

namespace hetrain {

using cpu::row_sum;

namespace {

/// g, or 0 where the forward's relu was off (its pre-activation x * scale + shift <= 0). A bit
/// mask rather than `? g : 0`, which GCC leaves as a branch per element; unlike g * (pre > 0), an
/// infinite g where the relu was off still gives 0, as torch's threshold_backward.
template <bool Relu, class C>
inline C masked(C g, C x, C scale, C shift) {
  if constexpr (Relu) {
    using U = std::conditional_t<sizeof(C) == 8, uint64_t, uint32_t>;
    const U keep = U(0) - static_cast<U>(x * scale + shift > C(0));
    return std::bit_cast<C>(std::bit_cast<U>(g) & keep);
  }
  return g;
}

/// sum(g') and sum(g' * (x - mu)) over n elements, g' = g masked by the relu when Relu.
template <bool Relu, class T, class C>
void plane_sums(const T* g, const T* x, int64_t n, C mu, const BnAffine<C>& aff, C& sg, C& sgx) {
  C a[8] = {}, b[8] = {};
  const C scale = aff.scale, shift = aff.shift;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) {
      const C xv = to_compute(x[i + j]);
      const C gv = masked<Relu>(to_compute(g[i + j]), xv, scale, shift);
      a[j] += gv;
      b[j] += gv * (xv - mu);
    }
  for (; i < n; ++i) {
    const C xv = to_compute(x[i]);
    const C gv = masked<Relu>(to_compute(g[i]), xv, scale, shift);
    a[0] += gv;
    b[0] += gv * (xv - mu);
  }
  sg = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
  sgx = ((b[0] + b[1]) + (b[2] + b[3])) + ((b[4] + b[5]) + (b[6] + b[7]));
}

/// The backward's per-channel constants: dx = k * (g' - gmean - (x - mu) * proj).
template <class A>
struct BnGrad {
  A mu, k, gmean, proj;
};

/// dx = k * (g' - gmean - (x - mu) * proj) over n elements, g' = g masked by the relu when Relu.
template <bool Relu, class T, class C>
void dx_plane(const T* g, const T* x, T* dx, int64_t n, const BnAffine<C>& a, const BnGrad<C>& d) {
  for (int64_t i = 0; i < n; ++i) {
    const C xv = to_compute(x[i]);
    const C gv = masked<Relu>(to_compute(g[i]), xv, a.scale, a.shift);
    dx[i] = from_compute<T>(d.k * (gv - d.gmean - (xv - d.mu) * d.proj));
  }
}

/// y = x * scale + shift (+ r) over n elements, relu of it when Relu.
template <bool Relu, class T, class C>
void apply_plane(const T* x, const T* r, T* y, int64_t n, const BnAffine<C>& a) {
  for (int64_t i = 0; i < n; ++i) {
    C v = to_compute(x[i]) * a.scale + a.shift;
    if (r) v += to_compute(r[i]);  // loop-invariant: GCC unswitches the loop on it
    y[i] = from_compute<T>(Relu ? std::max(v, C(0)) : v);
  }
}

// ---- f32 plane loops in AVX2 vectors: the generic loops' eight partial sums are a vector's eight
// lanes, and every operation rounds as the generic code's (no FMA), so the results are the same.

/// float[8] of a vector's lanes added as the generic loops add their eight sums, after the
/// scalar tail (into lane 0).
inline float lane_total(float (&a)[8]) {
  return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
}

/// A plane's sum, and its squared deviations from its own mean, sum / n rounded to f32.
__attribute__((target("avx2"))) void plane_stats_avx2(const float* x, int64_t n, float& sum,
                                                      float& sq) {
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) acc = _mm256_add_ps(acc, _mm256_loadu_ps(x + i));
  float a[8];
  _mm256_storeu_ps(a, acc);
  for (; i < n; ++i) a[0] += x[i];
  sum = lane_total(a);
  const float mean = sum / static_cast<float>(n);
  const __m256 m = _mm256_set1_ps(mean);
  acc = _mm256_setzero_ps();
  for (i = 0; i + 8 <= n; i += 8) {
    const __m256 d = _mm256_sub_ps(_mm256_loadu_ps(x + i), m);
    acc = _mm256_add_ps(acc, _mm256_mul_ps(d, d));
  }
  _mm256_storeu_ps(a, acc);
  for (; i < n; ++i) a[0] += (x[i] - mean) * (x[i] - mean);
  sq = lane_total(a);
}

template <bool Relu>
__attribute__((target("avx2"))) void apply_plane_avx2(const float* x, const float* r, float* y,
                                                      int64_t n, float scale, float shift) {
  const __m256 sc = _mm256_set1_ps(scale), sh = _mm256_set1_ps(shift), zero = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 v = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), sc), sh);
    if (r) v = _mm256_add_ps(v, _mm256_loadu_ps(r + i));
    // max(0, v) keeps a NaN v, as std::max(v, 0) does.
    _mm256_storeu_ps(y + i, Relu ? _mm256_max_ps(zero, v) : v);
  }
  for (; i < n; ++i) {
    float v = x[i] * scale + shift;
    if (r) v += r[i];
    y[i] = Relu ? std::max(v, 0.0f) : v;
  }
}

/// g where the forward's pre-activation x * scale + shift was > 0, else 0.
template <bool Relu>
__attribute__((target("avx2"))) inline __m256 masked_avx2(__m256 g, __m256 x, __m256 sc,
                                                          __m256 sh) {
  if constexpr (Relu)
    return _mm256_and_ps(
        g, _mm256_cmp_ps(_mm256_add_ps(_mm256_mul_ps(x, sc), sh), _mm256_setzero_ps(), _CMP_GT_OQ));
  return g;
}

template <bool Relu>
__attribute__((target("avx2"))) void plane_sums_avx2(const float* g, const float* x, int64_t n,
                                                     float mu, const BnAffine<float>& aff,
                                                     float& sg, float& sgx) {
  const __m256 m = _mm256_set1_ps(mu), sc = _mm256_set1_ps(aff.scale),
               sh = _mm256_set1_ps(aff.shift);
  __m256 a = _mm256_setzero_ps(), b = a;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 xv = _mm256_loadu_ps(x + i);
    const __m256 gv = masked_avx2<Relu>(_mm256_loadu_ps(g + i), xv, sc, sh);
    a = _mm256_add_ps(a, gv);
    b = _mm256_add_ps(b, _mm256_mul_ps(gv, _mm256_sub_ps(xv, m)));
  }
  float as[8], bs[8];
  _mm256_storeu_ps(as, a), _mm256_storeu_ps(bs, b);
  for (; i < n; ++i) {
    const float gv = masked<Relu>(g[i], x[i], aff.scale, aff.shift);
    as[0] += gv;
    bs[0] += gv * (x[i] - mu);
  }
  sg = lane_total(as), sgx = lane_total(bs);
}

template <bool Relu>
__attribute__((target("avx2"))) void dx_plane_avx2(const float* g, const float* x, float* dx,
                                                   int64_t n, const BnAffine<float>& aff,
                                                   const BnGrad<float>& d) {
  const __m256 sc = _mm256_set1_ps(aff.scale), sh = _mm256_set1_ps(aff.shift);
  const __m256 mu = _mm256_set1_ps(d.mu), k = _mm256_set1_ps(d.k), gmean = _mm256_set1_ps(d.gmean),
               proj = _mm256_set1_ps(d.proj);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 xv = _mm256_loadu_ps(x + i);
    const __m256 gv = masked_avx2<Relu>(_mm256_loadu_ps(g + i), xv, sc, sh);
    const __m256 t =
        _mm256_sub_ps(_mm256_sub_ps(gv, gmean), _mm256_mul_ps(_mm256_sub_ps(xv, mu), proj));
    _mm256_storeu_ps(dx + i, _mm256_mul_ps(k, t));
  }
  for (; i < n; ++i) {
    const float gv = masked<Relu>(g[i], x[i], aff.scale, aff.shift);
    dx[i] = d.k * (gv - d.gmean - (x[i] - d.mu) * d.proj);
  }
}

/// Whether T's plane loops take the AVX2 kernels above.
template <class T>
bool plane_avx2() {
  if constexpr (std::is_same_v<T, float>) {
    static const bool yes = cpu_features().avx2;
    return yes;
  }
  return false;
}

/// f.template operator()<true>() when relu, else <false>: the plane loops with the mask or
/// without it compiled in.
template <class F>
void with_relu(bool relu, F&& f) {
  if (relu)
    f.template operator()<true>();
  else
    f.template operator()<false>();
}

}  // namespace

void BatchNorm2d::eval_cpu(const std::vector<const Array*>& in,
                           const std::vector<Array*>& out) const {
  Array x = contiguous_array(*in[0]), w = contiguous_array(*in[1]), b = contiguous_array(*in[2]);
  Array res = residual_ ? contiguous_array(*in[3]) : Array();
  Array &y = *out[0], &mean = *out[1], &var = *out[2];
  y.allocate();
  mean.allocate();
  var.allocate();
  const int64_t N = x.shape[0], C = x.shape[1], HW = x.shape[2] * x.shape[3], P = N * C;
  const double M = static_cast<double>(N * HW);
  dispatch_float(x.dtype, name(), [&]<class T>() {
    using A = compute_t<T>;
    const T *xp = x.data<T>(), *wp = w.data<T>(), *bp = b.data<T>();
    const T* rp = residual_ ? res.data<T>() : nullptr;
    T* yp = y.data<T>();
    A *mp = mean.data<A>(), *vp = var.data<A>();
    const bool avx2 = plane_avx2<T>();
    const int64_t grain = cpu::row_grain(HW);
    // Each plane's sum and squared deviations from its mean, sum / HW rounded to the compute
    // type (one read of x from memory; the second sum hits L1).
    std::vector<A> psum(static_cast<size_t>(P)), psq(psum.size());
    parallel_for(P, grain, [&](int64_t p0, int64_t p1) {
      for (int64_t p = p0; p < p1; ++p) {
        const T* xr = xp + p * HW;
        if constexpr (std::is_same_v<T, float>) {
          if (avx2) {
            plane_stats_avx2(xr, HW, psum[p], psq[p]);
            continue;
          }
        }
        psum[p] = row_sum(xr, HW, [](A v) { return v; });
        const A m = psum[p] / static_cast<A>(HW);
        psq[p] = row_sum(xr, HW, [m](A v) { return (v - m) * (v - m); });
      }
    });
    // Per channel, the planes merged in f64 in n order (Chan et al.): sum of squares = sum over
    // planes of (plane's + HW * (plane mean - mean)^2). The cross term the plane mean's rounding
    // leaves is dropped, an error of the compute type's precision.
    std::vector<BnAffine<A>> aff;
    aff.reserve(static_cast<size_t>(C));
    for (int64_t c = 0; c < C; ++c) {
      double s = 0;
      for (int64_t n = 0; n < N; ++n) s += static_cast<double>(psum[n * C + c]);
      double ss = 0;
      for (int64_t n = 0; n < N; ++n) {
        const A plane_mean = psum[n * C + c] / static_cast<A>(HW);
        const double d = static_cast<double>(plane_mean) - s / M;
        ss += static_cast<double>(psq[n * C + c]) + static_cast<double>(HW) * d * d;
      }
      mp[c] = static_cast<A>(s / M);
      vp[c] = static_cast<A>(ss / M);
      aff.emplace_back(static_cast<double>(to_compute(wp[c])), to_compute(bp[c]), mp[c], vp[c],
                       eps_);
    }
    with_relu(relu_, [&]<bool Relu>() {
      parallel_for(P, grain, [&](int64_t p0, int64_t p1) {
        for (int64_t p = p0; p < p1; ++p) {
          const BnAffine<A>& a = aff[static_cast<size_t>(p % C)];
          const T *xr = xp + p * HW, *r = rp ? rp + p * HW : nullptr;
          T* yr = yp + p * HW;
          if constexpr (std::is_same_v<T, float>) {
            if (avx2) {
              apply_plane_avx2<Relu>(xr, r, yr, HW, a.scale, a.shift);
              continue;
            }
          }
          apply_plane<Relu>(xr, r, yr, HW, a);
        }
      });
    });
  });
}

void BatchNorm2dBackward::eval_cpu(const std::vector<const Array*>& in,
                                   const std::vector<Array*>& out) const {
  Array x = contiguous_array(*in[0]), mean = contiguous_array(*in[1]);
  Array var = contiguous_array(*in[2]), g = contiguous_array(*in[3]);
  Array w = contiguous_array(*in[4]), b = contiguous_array(*in[5]);
  Array &dx = *out[0], &dw = *out[1], &db = *out[2];
  dx.allocate();
  dw.allocate();
  db.allocate();
  const int64_t N = x.shape[0], C = x.shape[1], HW = x.shape[2] * x.shape[3], P = N * C;
  const double M = static_cast<double>(N * HW);
  dispatch_float(x.dtype, name(), [&]<class T>() {
    using A = compute_t<T>;
    const T *xp = x.data<T>(), *gp = g.data<T>(), *wp = w.data<T>(), *bp = b.data<T>();
    const A *mp = mean.data<A>(), *vp = var.data<A>();
    T *dxp = dx.data<T>(), *dwp = dw.data<T>(), *dbp = db.data<T>();
    const bool avx2 = plane_avx2<T>();
    const int64_t grain = cpu::row_grain(HW);
    std::vector<BnAffine<A>> aff;
    aff.reserve(static_cast<size_t>(C));
    for (int64_t c = 0; c < C; ++c)
      aff.emplace_back(static_cast<double>(to_compute(wp[c])), to_compute(bp[c]), mp[c], vp[c],
                       eps_);
    std::vector<A> psg(static_cast<size_t>(P)), psgx(psg.size());
    std::vector<BnGrad<A>> d(static_cast<size_t>(C));
    with_relu(relu_, [&]<bool Relu>() {
      // Each plane's sum(g') and sum(g' * (x - mu)), g' masked by the relu when Relu.
      parallel_for(P, grain, [&](int64_t p0, int64_t p1) {
        for (int64_t p = p0; p < p1; ++p) {
          const int64_t c = p % C;
          const BnAffine<A>& a = aff[static_cast<size_t>(c)];
          const T *gr = gp + p * HW, *xr = xp + p * HW;
          if constexpr (std::is_same_v<T, float>) {
            if (avx2) {
              plane_sums_avx2<Relu>(gr, xr, HW, mp[c], a, psg[p], psgx[p]);
              continue;
            }
          }
          plane_sums<Relu>(gr, xr, HW, mp[c], a, psg[p], psgx[p]);
        }
      });
      // Per channel, the planes' sums added in n order in f64; then the weight and bias gradients
      // and dx = w * invstd * (g' - sg / M - (x - mu) * invstd^2 * sgx / M).
      for (int64_t c = 0; c < C; ++c) {
        double sg = 0, sgx = 0;
        for (int64_t n = 0; n < N; ++n)
          sg += static_cast<double>(psg[n * C + c]), sgx += static_cast<double>(psgx[n * C + c]);
        const double invstd = 1.0 / std::sqrt(static_cast<double>(vp[c]) + eps_);
        dbp[c] = from_compute<T>(static_cast<A>(sg));
        dwp[c] = from_compute<T>(static_cast<A>(sgx * invstd));
        d[c] = {mp[c], static_cast<A>(to_compute(wp[c]) * invstd), static_cast<A>(sg / M),
                static_cast<A>(sgx * invstd * invstd / M)};
      }
      parallel_for(P, grain, [&](int64_t p0, int64_t p1) {
        for (int64_t p = p0; p < p1; ++p) {
          const int64_t c = p % C;
          const BnAffine<A>& a = aff[static_cast<size_t>(c)];
          const BnGrad<A>& k = d[static_cast<size_t>(c)];
          const T *gr = gp + p * HW, *xr = xp + p * HW;
          T* dxr = dxp + p * HW;
          if constexpr (std::is_same_v<T, float>) {
            if (avx2) {
              dx_plane_avx2<Relu>(gr, xr, dxr, HW, a, k);
              continue;
            }
          }
          dx_plane<Relu>(gr, xr, dxr, HW, a, k);
        }
      });
    });
  });
}

}  // namespace hetrain
