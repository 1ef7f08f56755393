// CPU kernels for the fused batch_norm2d forward and backward. Each runs two passes over the
// (n, c) planes in memory order, split over the thread pool by planes: the first computes every
// plane's sums (eight partial sums in the compute type; the forward's two sums of a plane read it
// from memory once, the second hits L1), a per-channel step adds the planes in n order in f64,
// and the second pass writes the output. Planes' sums are stored, so results do not depend on the
// thread count or on how the planes are split. (Before, each thread walked its channels and read
// every channel's N planes, C * H * W floats apart: the prefetchers restarted on each 3 KB plane,
// and a 16-channel 28x28 batch norm and relu forward and backward ran at 6-8 GB/s in a
// fashion-cnn step.) The plane loops are one source built for every vector width
// (cpu::isa_dispatch); their eight partial sums are fixed in the source and nothing is contracted
// into an FMA (-ffp-contract=off), so the results are the same bits at every width.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

#include "backends/cpu/isa.h"
#include "backends/cpu/vec_math.h"
#include "graph/prims/elementwise.h"
#include "graph/prims/norm2d.h"
#include "hetrain/base/dispatch.h"
#include "hetrain/base/thread_pool.h"

namespace hetrain {

using cpu::row_sum;

namespace {

/// g, or 0 where the forward's relu was off (its pre-activation x * scale + shift <= 0). A bit
/// mask rather than `? g : 0`, which GCC leaves as a branch per element; unlike g * (pre > 0), an
/// infinite g where the relu was off still gives 0, as torch's threshold_backward.
template <bool Relu, class C>
[[gnu::always_inline]] inline C masked(C g, C x, C scale, C shift) {
  if constexpr (Relu) {
    using U = std::conditional_t<sizeof(C) == 8, uint64_t, uint32_t>;
    const U keep = U(0) - static_cast<U>(x * scale + shift > C(0));
    return std::bit_cast<C>(std::bit_cast<U>(g) & keep);
  }
  return g;
}

/// sum(g') and sum(g' * (x - mu)) over n elements, g' = g masked by the relu when Relu.
template <bool Relu, class T, class C>
[[gnu::always_inline]] inline void plane_sums(const T* g, const T* x, int64_t n, C mu,
                                              const BnAffine<C>& aff, C& sg, C& sgx) {
  cpu::Lanes8<C> a = {}, b = {};
  const C scale = aff.scale, shift = aff.shift;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const cpu::Load8<T> xs(x + i), gs(g + i);
    C ga[8], gb[8];
    for (int j = 0; j < 8; ++j) {
      const C xv = xs[j];
      const C gv = masked<Relu>(gs[j], xv, scale, shift);
      ga[j] = gv;
      gb[j] = gv * (xv - mu);
    }
    cpu::add8(a, ga);
    cpu::add8(b, gb);
  }
  for (; i < n; ++i) {
    const C xv = cpu::load_compute(x + i);
    const C gv = masked<Relu>(cpu::load_compute(g + i), xv, scale, shift);
    a[0] += gv;
    b[0] += gv * (xv - mu);
  }
  sg = cpu::total8(a);
  sgx = cpu::total8(b);
}

/// The backward's per-channel constants: dx = k * (g' - gmean - (x - mu) * proj).
template <class A>
struct BnGrad {
  A mu, k, gmean, proj;
};

/// dx = k * (g' - gmean - (x - mu) * proj) over n elements, g' = g masked by the relu when Relu.
template <bool Relu, class T, class C>
[[gnu::always_inline]] inline void dx_plane(const T* g, const T* x, T* dx, int64_t n,
                                            const BnAffine<C>& a, const BnGrad<C>& d) {
  for (int64_t i = 0; i < n; ++i) {
    const C xv = cpu::load_compute(x + i);
    const C gv = masked<Relu>(cpu::load_compute(g + i), xv, a.scale, a.shift);
    dx[i] = from_compute<T>(d.k * (gv - d.gmean - (xv - d.mu) * d.proj));
  }
}

/// y = x * scale + shift (+ r) over n elements, relu of it when Relu.
template <bool Relu, class T, class C>
[[gnu::always_inline]] inline void apply_plane(const T* x, const T* r, T* y, int64_t n,
                                               const BnAffine<C>& a) {
  for (int64_t i = 0; i < n; ++i) {
    C v = cpu::load_compute(x + i) * a.scale + a.shift;
    if (r) v += cpu::load_compute(r + i);  // loop-invariant: GCC unswitches the loop on it
    y[i] = from_compute<T>(Relu ? std::max(v, C(0)) : v);
  }
}

// ---- the plane loops over planes [p0, p1), one source for every vector width -----------------

/// Each plane's sum, and its squared deviations from its own mean (sum / n rounded to A).
template <class T>
struct PlaneStats {
  template <cpu::Isa>
  [[gnu::always_inline]] static inline void run(const T* xp, int64_t n, int64_t p0, int64_t p1,
                                                compute_t<T>* psum, compute_t<T>* psq) {
    using A = compute_t<T>;
    for (int64_t p = p0; p < p1; ++p) {
      const T* xr = xp + p * n;
      psum[p] = row_sum(xr, n, [](A v) { return v; });
      const A m = psum[p] / static_cast<A>(n);
      psq[p] = row_sum(xr, n, [m](A v) { return (v - m) * (v - m); });
    }
  }
};

/// y = x * scale + shift (+ r), relu of it when Relu, for planes [p0, p1) (channel p % C).
template <class T, bool Relu>
struct ApplyPlanes {
  template <cpu::Isa>
  [[gnu::always_inline]] static inline void run(const T* xp, const T* rp, T* yp,
                                                const BnAffine<compute_t<T>>* aff, int64_t C,
                                                int64_t n, int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p)
      apply_plane<Relu>(xp + p * n, rp ? rp + p * n : nullptr, yp + p * n, n, aff[p % C]);
  }
};

/// sum(g') and sum(g' * (x - mu)) of planes [p0, p1).
template <class T, bool Relu>
struct PlaneSums {
  template <cpu::Isa>
  [[gnu::always_inline]] static inline void run(const T* gp, const T* xp, const compute_t<T>* mp,
                                                const BnAffine<compute_t<T>>* aff, int64_t C,
                                                int64_t n, int64_t p0, int64_t p1,
                                                compute_t<T>* psg, compute_t<T>* psgx) {
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t c = p % C;
      plane_sums<Relu>(gp + p * n, xp + p * n, n, mp[c], aff[c], psg[p], psgx[p]);
    }
  }
};

/// dx of planes [p0, p1).
template <class T, bool Relu>
struct DxPlanes {
  template <cpu::Isa>
  [[gnu::always_inline]] static inline void run(const T* gp, const T* xp, T* dxp,
                                                const BnAffine<compute_t<T>>* aff,
                                                const BnGrad<compute_t<T>>* d, int64_t C, int64_t n,
                                                int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t c = p % C;
      dx_plane<Relu>(gp + p * n, xp + p * n, dxp + p * n, n, aff[c], d[c]);
    }
  }
};

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
    const int64_t grain = cpu::row_grain(HW);
    // Each plane's sum and squared deviations from its mean, sum / HW rounded to the compute
    // type (one read of x from memory; the second sum hits L1).
    std::vector<A> psum(static_cast<size_t>(P)), psq(psum.size());
    parallel_for(P, grain, [&](int64_t p0, int64_t p1) {
      cpu::isa_dispatch<PlaneStats<T>>(xp, HW, p0, p1, psum.data(), psq.data());
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
      aff.emplace_back(static_cast<double>(cpu::load_compute(wp + c)), cpu::load_compute(bp + c),
                       mp[c], vp[c], eps_);
    }
    with_relu(relu_, [&]<bool Relu>() {
      parallel_for(P, grain, [&](int64_t p0, int64_t p1) {
        cpu::isa_dispatch<ApplyPlanes<T, Relu>>(xp, rp, yp, aff.data(), C, HW, p0, p1);
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
    const int64_t grain = cpu::row_grain(HW);
    std::vector<BnAffine<A>> aff;
    aff.reserve(static_cast<size_t>(C));
    for (int64_t c = 0; c < C; ++c)
      aff.emplace_back(static_cast<double>(cpu::load_compute(wp + c)), cpu::load_compute(bp + c),
                       mp[c], vp[c], eps_);
    std::vector<A> psg(static_cast<size_t>(P)), psgx(psg.size());
    std::vector<BnGrad<A>> d(static_cast<size_t>(C));
    with_relu(relu_, [&]<bool Relu>() {
      // Each plane's sum(g') and sum(g' * (x - mu)), g' masked by the relu when Relu.
      parallel_for(P, grain, [&](int64_t p0, int64_t p1) {
        cpu::isa_dispatch<PlaneSums<T, Relu>>(gp, xp, mp, aff.data(), C, HW, p0, p1, psg.data(),
                                              psgx.data());
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
        d[c] = {mp[c], static_cast<A>(cpu::load_compute(wp + c) * invstd), static_cast<A>(sg / M),
                static_cast<A>(sgx * invstd * invstd / M)};
      }
      parallel_for(P, grain, [&](int64_t p0, int64_t p1) {
        cpu::isa_dispatch<DxPlanes<T, Relu>>(gp, xp, dxp, aff.data(), d.data(), C, HW, p0, p1);
      });
    });
  });
}

}  // namespace hetrain
