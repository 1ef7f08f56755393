// CPU kernels for the fused batch_norm2d forward and backward. Channels are split over the thread
// pool (each channel's sums are one thread's, so results do not depend on the thread count); per
// (n, c) plane sums use eight partial sums in the compute type and planes are added in f64; the
// forward's statistics read each plane from memory once (its second pass hits L1).
#include "graph/prims/norm2d.h"

#include <xmmintrin.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

#include "backends/cpu/vec_math.h"
#include "graph/prims/elementwise.h"
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
void plane_sums(const T* g, const T* x, int64_t n, C mu, const BnAffine<C>& aff, double& sg,
                double& sgx) {
  C a[8] = {}, b[8] = {};
  const C scale = aff.scale, shift = aff.shift;
  int64_t i = 0;
  if constexpr (std::is_same_v<T, float>) {
    // The loop below in SSE vectors (GCC kept it scalar, with the sums spilled to the stack:
    // half of the backward's time): lanes of a0 / a1 are a[0..3] / a[4..7], the same sums in the
    // same order, so the results are the same.
    __m128 a0 = _mm_setzero_ps(), a1 = a0, b0 = a0, b1 = a0;
    const __m128 m = _mm_set1_ps(mu), sc = _mm_set1_ps(scale), sh = _mm_set1_ps(shift);
    for (; i + 8 <= n; i += 8) {
      const __m128 x0 = _mm_loadu_ps(x + i), x1 = _mm_loadu_ps(x + i + 4);
      __m128 g0 = _mm_loadu_ps(g + i), g1 = _mm_loadu_ps(g + i + 4);
      if constexpr (Relu) {
        g0 = _mm_and_ps(g0, _mm_cmpgt_ps(_mm_add_ps(_mm_mul_ps(x0, sc), sh), _mm_setzero_ps()));
        g1 = _mm_and_ps(g1, _mm_cmpgt_ps(_mm_add_ps(_mm_mul_ps(x1, sc), sh), _mm_setzero_ps()));
      }
      a0 = _mm_add_ps(a0, g0), a1 = _mm_add_ps(a1, g1);
      b0 = _mm_add_ps(b0, _mm_mul_ps(g0, _mm_sub_ps(x0, m)));
      b1 = _mm_add_ps(b1, _mm_mul_ps(g1, _mm_sub_ps(x1, m)));
    }
    _mm_storeu_ps(a, a0), _mm_storeu_ps(a + 4, a1), _mm_storeu_ps(b, b0), _mm_storeu_ps(b + 4, b1);
  }
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
  sg += ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
  sgx += ((b[0] + b[1]) + (b[2] + b[3])) + ((b[4] + b[5]) + (b[6] + b[7]));
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

}  // namespace

void BatchNorm2d::eval_cpu(const std::vector<const Array*>& in,
                           const std::vector<Array*>& out) const {
  Array x = contiguous_array(*in[0]), w = contiguous_array(*in[1]), b = contiguous_array(*in[2]);
  Array res = residual_ ? contiguous_array(*in[3]) : Array();
  Array &y = *out[0], &mean = *out[1], &var = *out[2];
  y.allocate();
  mean.allocate();
  var.allocate();
  const int64_t N = x.shape[0], C = x.shape[1], HW = x.shape[2] * x.shape[3];
  const double M = static_cast<double>(N * HW);
  dispatch_float(x.dtype, name(), [&]<class T>() {
    using A = compute_t<T>;
    const T *xp = x.data<T>(), *wp = w.data<T>(), *bp = b.data<T>();
    const T* rp = residual_ ? res.data<T>() : nullptr;
    T* yp = y.data<T>();
    A *mp = mean.data<A>(), *vp = var.data<A>();
    parallel_for(C, 1, [&](int64_t cb, int64_t ce) {
      std::vector<std::pair<A, A>> plane(static_cast<size_t>(N));  // mean, squared deviations
      for (int64_t c = cb; c < ce; ++c) {
        // Each plane's mean and squared deviations from it while the plane is in L1 (one read
        // of x from memory for the statistics), then the planes merged in f64 (Chan et al.):
        // sum of squares = sum over planes of (plane's + HW * (plane mean - mean)^2). The plane
        // mean is rounded to the compute type; the cross term that rounding leaves is dropped,
        // an error of that type's precision.
        double s = 0;
        for (int64_t n = 0; n < N; ++n) {
          const T* xr = xp + (n * C + c) * HW;
          const A sp = row_sum(xr, HW, [](A v) { return v; });
          const A mp_n = sp / static_cast<A>(HW);
          plane[static_cast<size_t>(n)] = {
              mp_n, row_sum(xr, HW, [mp_n](A v) { return (v - mp_n) * (v - mp_n); })};
          s += static_cast<double>(sp);
        }
        const A mu = static_cast<A>(s / M);
        double ss = 0;
        for (const auto& [pm, pq] : plane) {
          const double d = static_cast<double>(pm) - s / M;
          ss += static_cast<double>(pq) + static_cast<double>(HW) * d * d;
        }
        const double v = ss / M;
        mp[c] = mu;
        vp[c] = static_cast<A>(v);
        const BnAffine<A> a(static_cast<double>(to_compute(wp[c])), to_compute(bp[c]), mu, vp[c],
                            eps_);
        for (int64_t n = 0; n < N; ++n) {
          const int64_t off = (n * C + c) * HW;
          const T* r = rp ? rp + off : nullptr;
          if (relu_)
            apply_plane<true>(xp + off, r, yp + off, HW, a);
          else
            apply_plane<false>(xp + off, r, yp + off, HW, a);
        }
      }
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
  const int64_t N = x.shape[0], C = x.shape[1], HW = x.shape[2] * x.shape[3];
  const double M = static_cast<double>(N * HW);
  dispatch_float(x.dtype, name(), [&]<class T>() {
    using A = compute_t<T>;
    const T *xp = x.data<T>(), *gp = g.data<T>(), *wp = w.data<T>(), *bp = b.data<T>();
    const A *mp = mean.data<A>(), *vp = var.data<A>();
    T *dxp = dx.data<T>(), *dwp = dw.data<T>(), *dbp = db.data<T>();
    // One channel's sums, then its dx; Relu masks g where the forward's relu was off.
    auto channel = [&]<bool Relu>(int64_t c) {
      const A mu = mp[c];
      const double invstd = 1.0 / std::sqrt(static_cast<double>(vp[c]) + eps_);
      const BnAffine<A> a(static_cast<double>(to_compute(wp[c])), to_compute(bp[c]), mu, vp[c],
                          eps_);
      double sg = 0, sgx = 0;
      for (int64_t n = 0; n < N; ++n)
        plane_sums<Relu>(gp + (n * C + c) * HW, xp + (n * C + c) * HW, HW, mu, a, sg, sgx);
      dbp[c] = from_compute<T>(static_cast<A>(sg));
      dwp[c] = from_compute<T>(static_cast<A>(sgx * invstd));
      // dx = w * invstd * (g - sg / M - (x - mu) * invstd^2 * sgx / M)
      const A k = static_cast<A>(to_compute(wp[c]) * invstd);
      const A gmean = static_cast<A>(sg / M);
      const A proj = static_cast<A>(sgx * invstd * invstd / M);
      for (int64_t n = 0; n < N; ++n) {
        const T* xr = xp + (n * C + c) * HW;
        const T* gr = gp + (n * C + c) * HW;
        T* dxr = dxp + (n * C + c) * HW;
        for (int64_t i = 0; i < HW; ++i) {
          const A xv = to_compute(xr[i]);
          const A gv = masked<Relu>(to_compute(gr[i]), xv, a.scale, a.shift);
          dxr[i] = from_compute<T>(k * (gv - gmean - (xv - mu) * proj));
        }
      }
    };
    parallel_for(C, 1, [&](int64_t cb, int64_t ce) {
      for (int64_t c = cb; c < ce; ++c) {
        if (relu_)
          channel.template operator()<true>(c);
        else
          channel.template operator()<false>(c);
      }
    });
  });
}

}  // namespace hetrain
