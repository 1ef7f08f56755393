// Fused optimizer kernels: one pass over a parameter and its state.
#include <cmath>

#include "graph/prims/elementwise.h"
#include "graph/prims/optim.h"
#include "hetrain/base/dispatch.h"
#include "hetrain/base/thread_pool.h"

namespace hetrain {

namespace {
template <class T, class C, bool kDecay>
void adamw_loop(int64_t lo, int64_t hi, const T* __restrict p, const T* __restrict g,
                const T* __restrict m, const T* __restrict v, T* __restrict po, T* __restrict mo,
                T* __restrict vo, C b1, C b2, C one_b1, C one_b2, C keep, C inv_sqrt_bc2, C eps,
                C step) {
  for (int64_t i = lo; i < hi; ++i) {
    const C gi = to_compute(g[i]);
    const C mi = to_compute(m[i]) * b1 + gi * one_b1;
    const C vi = to_compute(v[i]) * b2 + (gi * gi) * one_b2;
    const C pi = kDecay ? to_compute(p[i]) * keep : to_compute(p[i]);
    const C denom = std::sqrt(vi) * inv_sqrt_bc2 + eps;
    po[i] = from_compute<T>(pi - (mi / denom) * step);
    mo[i] = from_compute<T>(mi);
    vo[i] = from_compute<T>(vi);
  }
}
}  // namespace

void AdamWUpdate::eval_cpu(const std::vector<const Array*>& in,
                           const std::vector<Array*>& out) const {
  Array x[4];
  for (size_t i = 0; i < 4; ++i) x[i] = contiguous_array(*in[i]);
  for (Array* o : out) o->allocate();
  const int64_t n = x[0].numel();
  dispatch_float(x[0].dtype, "adamw_update", [&]<class T>() {
    // The composite update's order of operations, with its scalars rounded to the compute
    // type (f32 for the 16-bit formats, whose results are rounded once at the end).
    using C = compute_t<T>;
    const C b1 = static_cast<C>(a_.beta1), b2 = static_cast<C>(a_.beta2);
    const C one_b1 = static_cast<C>(1.0 - a_.beta1), one_b2 = static_cast<C>(1.0 - a_.beta2);
    const bool decay = a_.weight_decay != 0;
    const C keep = static_cast<C>(1.0 - a_.lr * a_.weight_decay);
    const C inv_sqrt_bc2 = static_cast<C>(1.0 / std::sqrt(a_.bias_correction2));
    const C eps = static_cast<C>(a_.eps), step = static_cast<C>(a_.lr / a_.bias_correction1);
    const T* p = x[0].data<T>();
    const T* g = x[1].data<T>();
    const T* m = x[2].data<T>();
    const T* v = x[3].data<T>();
    T* po = out[0]->data<T>();
    T* mo = out[1]->data<T>();
    T* vo = out[2]->data<T>();
    parallel_for(n, 1 << 14, [=](int64_t lo, int64_t hi) {
      // By value: stores through the outputs then cannot alias the scalars, so it vectorises.
      if (decay)
        adamw_loop<T, C, true>(lo, hi, p, g, m, v, po, mo, vo, b1, b2, one_b1, one_b2, keep,
                               inv_sqrt_bc2, eps, step);
      else
        adamw_loop<T, C, false>(lo, hi, p, g, m, v, po, mo, vo, b1, b2, one_b1, one_b2, keep,
                                inv_sqrt_bc2, eps, step);
    });
  });
}

}  // namespace hetrain
