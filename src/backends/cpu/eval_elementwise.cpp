// CPU kernels for elementwise primitives: unary, binary, where, cast/copy, concat,
// slice_scatter.
#if defined(__GNUC__) && !defined(__clang__)
// Lets GCC if-convert the float selects in the vexp-based loops below, so they vectorise.
#pragma GCC optimize("no-trapping-math")
#endif
#include <cstring>

#include "backends/cpu/isa.h"
#include "backends/cpu/strided.h"
#include "backends/cpu/vec.h"
#include "backends/cpu/vec_math.h"
#include "graph/prims/elementwise.h"
#include "graph/prims/views.h"
#include "hetrain/base/dispatch.h"

namespace hetrain {

using cpu::for_each_run;
using cpu::kElementwiseGrain;

namespace {
// Contiguous f32 loops for transcendental ops, written over the branch-free cpu::vexp so the
// compiler vectorises them (std::tanh/std::exp are scalar library calls). Ops without an
// entry use Op::f.
template <class Op>
struct FastF32 {
  static constexpr bool has = false;
  // Declared only: clang 14 looks f up in the discarded `if constexpr (has && ...)` branches.
  static float f(float);
};
[[gnu::always_inline]] inline float fast_tanh(float x) {
  const float t = 1.0f - 2.0f / (cpu::vexp(2.0f * x) + 1.0f);
  // Near 0 the formula cancels; the odd series is exact there to f32 precision.
  const float x2 = x * x;
  const float series = x * (1.0f - x2 * (1.0f / 3.0f - x2 * (2.0f / 15.0f)));
  return std::abs(x) < 0.0625f ? series : t;
}
[[gnu::always_inline]] inline float fast_sigmoid(float x) { return 1.0f / (1.0f + cpu::vexp(-x)); }
template <>
struct FastF32<ExpOp> {
  static constexpr bool has = true;
  [[gnu::always_inline]] static float f(float x) { return cpu::vexp(x); }
};
template <>
struct FastF32<TanhOp> {
  static constexpr bool has = true;
  [[gnu::always_inline]] static float f(float x) { return fast_tanh(x); }
};
template <>
struct FastF32<SigmoidOp> {
  static constexpr bool has = true;
  [[gnu::always_inline]] static float f(float x) { return fast_sigmoid(x); }
};
template <>
struct FastF32<SiluOp> {
  static constexpr bool has = true;
  [[gnu::always_inline]] static float f(float x) { return x * fast_sigmoid(x); }
};
/// tanh-GELU's 2u in base 2: 2 sqrt(2/pi) log2(e), so e^(-2u) = 2^(-kGelu2 (x + 0.044715 x^3)).
constexpr float kGelu2 = 2.302208198144325f;
template <>
struct FastF32<GeluTanhOp> {
  static constexpr bool has = true;
  // 0.5 (1 + tanh(u)) = sigmoid(2u) = 1 / (1 + e^(-2u)): no cancellation for large negative x.
  // Below x = -20 the value is -0 (as x e^(-2u) is, far under f32's range) and -inf gives NaN as
  // -inf * 0 does; the clamped exp (2^127 at most) would otherwise give -inf there.
  [[gnu::always_inline]] static float f(float x) {
    const float e = cpu::vexp2_clamped(-kGelu2 * (x + 0.044715f * x * x * x));
    return x < -20.0f ? x * 0.0f : x / (1.0f + e);
  }
};
// The same for binary ops, used where both operands are contiguous f32.
template <class Op>
struct FastF32Binary {
  static constexpr bool has = false;
  static float f(float, float);  // declared only, as FastF32::f
};
template <>
struct FastF32Binary<GeluTanhGradOp> {
  static constexpr bool has = true;
  // As GeluTanhGradOp::f: sigmoid(2u) + 2 a sigmoid(2u) sigmoid(-2u) du, from e = e^(-2|u|).
  // Beyond |a| = 20 the derivative is 1 or 0 to f32 precision; +-inf give b and NaN (0 * inf)
  // there as they did through the full exp, not the clamped exp's finite leftovers.
  [[gnu::always_inline]] static float f(float a, float b) {
    const float k = 0.7978845608028654f, c = 0.044715f;
    const float t = a + c * a * a * a, du = k * (1.0f + 3.0f * c * a * a);
    const float e = cpu::vexp2_clamped(-kGelu2 * std::abs(t)), p = 1.0f / (1.0f + e), q = e * p;
    const float g = b * ((t >= 0.0f ? p : q) + 2.0f * a * p * q * du);
    return std::abs(a) > 20.0f ? (a > 0.0f ? b : b * (a * 0.0f)) : g;
  }
};
/// The op's own formula as a map kernel's F (in the compute type; O the stored result type).
template <class Op, class O>
struct OpF {
  template <class C>
  [[gnu::always_inline]] static auto f(C a) {
    return Op::f(a);
  }
  template <class C>
  [[gnu::always_inline]] static auto f(C a, C b) {
    return Op::f(a, b);
  }
};
/// o[i] = F::f(a[i]) over a contiguous run of any dtype, loaded into and stored from the compute
/// type; one source for every vector width (f16/bf16 conversions are branch-free, so they
/// vectorise with the op).
template <class F, class T>
struct MapRun {
  template <cpu::Isa>
  [[gnu::always_inline]] static inline void run(const T* a, T* o, int64_t n) {
    for (int64_t i = 0; i < n; ++i) cpu::store_compute(o + i, F::f(cpu::load_compute(a + i)));
  }
};
/// Which operand of a binary run is a broadcast scalar (stride 0), if any.
enum class ZipKind { both, a_scalar, b_scalar };
/// o[i] = F::f(a[i], b[i]) over a run where each operand is contiguous or one scalar; every
/// vector width.
template <class F, class T, class O>
struct ZipRun {
  template <cpu::Isa>
  [[gnu::always_inline]] static inline void run(const T* a, const T* b, O* o, int64_t n,
                                                ZipKind kind) {
    if (kind == ZipKind::both) {
      for (int64_t i = 0; i < n; ++i)
        cpu::store_compute(o + i, F::f(cpu::load_compute(a + i), cpu::load_compute(b + i)));
    } else if (kind == ZipKind::b_scalar) {
      const auto s = cpu::load_compute(b);
      for (int64_t i = 0; i < n; ++i) cpu::store_compute(o + i, F::f(cpu::load_compute(a + i), s));
    } else {
      const auto s = cpu::load_compute(a);
      for (int64_t i = 0; i < n; ++i) cpu::store_compute(o + i, F::f(s, cpu::load_compute(b + i)));
    }
  }
};
}  // namespace

template <class Op>
void Unary<Op>::eval_cpu(const std::vector<const Array*>& in,
                         const std::vector<Array*>& out) const {
  const Array& x = *in[0];
  Array& y = *out[0];
  if (!y.has_data()) y.allocate();
  auto body = [&]<class T>() {
    const T* xp = x.data<T>();
    T* yp = y.data<T>();
    for_each_run<2>(
        x.shape, {&y.strides, &x.strides}, kElementwiseGrain,
        [&](const std::array<int64_t, 2>& pos, const std::array<int64_t, 2>& step, int64_t len) {
          T* o = yp + pos[0];
          const T* a = xp + pos[1];
          // Ops with a branch-free f32 form run it for every f32-computing dtype and layout,
          // the others their formula; contiguous runs through one kernel source for every
          // vector width (-ffp-contract=off: an element's bits depend on its value only).
          // Strided runs are staged through a small contiguous buffer. (std::tanh there cost
          // more than the GEMMs of a bf16 GPT step.)
          using F = std::conditional_t<FastF32<Op>::has && std::is_same_v<compute_t<T>, float>,
                                       FastF32<Op>, OpF<Op, T>>;
          if (step[1] == 1) {
            cpu::isa_dispatch<MapRun<F, T>>(a, o, len);
            return;
          }
          constexpr int64_t kStage = 256;
          T buf[kStage];
          for (int64_t i0 = 0; i0 < len; i0 += kStage) {
            const int64_t m = std::min(kStage, len - i0);
            for (int64_t i = 0; i < m; ++i) buf[i] = a[(i0 + i) * step[1]];
            cpu::isa_dispatch<MapRun<F, T>>(buf, o + i0, m);
          }
        });
  };
  if constexpr (Op::float_only)
    dispatch_float(x.dtype, Op::name, body);
  else
    dispatch_numeric(x.dtype, Op::name, body);
}

template class Unary<NegOp>;
template class Unary<AbsOp>;
template class Unary<ExpOp>;
template class Unary<LogOp>;
template class Unary<SqrtOp>;
template class Unary<RsqrtOp>;
template class Unary<SquareOp>;
template class Unary<TanhOp>;
template class Unary<SigmoidOp>;
template class Unary<ReluOp>;
template class Unary<GeluErfOp>;
template class Unary<GeluTanhOp>;
template class Unary<ErfOp>;
template class Unary<SiluOp>;

template <class Op>
void Binary<Op>::eval_cpu(const std::vector<const Array*>& in,
                          const std::vector<Array*>& out) const {
  const Array &a = *in[0], &b = *in[1];
  Array& y = *out[0];
  if (!y.has_data()) y.allocate();
  auto body = [&]<class T>() {
    using O = std::conditional_t<Op::is_compare, bool, T>;
    const T* ap = a.data<T>();
    const T* bp = b.data<T>();
    O* yp = y.data<O>();
    for_each_run<3>(
        a.shape, {&y.strides, &a.strides, &b.strides}, kElementwiseGrain,
        [&](const std::array<int64_t, 3>& pos, const std::array<int64_t, 3>& step, int64_t len) {
          O* o = yp + pos[0];
          const T* x0 = ap + pos[1];
          const T* x1 = bp + pos[2];
          // Contiguous or scalar operands: one kernel source for every vector width. The
          // branch-free f32 form, where the op has one, on fully contiguous runs.
          using Fast = FastF32Binary<Op>;
          if constexpr (Fast::has && std::is_same_v<compute_t<T>, float> && std::is_same_v<O, T>) {
            if (step[0] == 1 && step[1] == 1 && step[2] == 1) {
              cpu::isa_dispatch<ZipRun<Fast, T, O>>(x0, x1, o, len, ZipKind::both);
              return;
            }
          }
          if (step[1] == 1 && step[2] == 1) {
            cpu::isa_dispatch<ZipRun<OpF<Op, O>, T, O>>(x0, x1, o, len, ZipKind::both);
          } else if (step[1] == 1 && step[2] == 0) {
            cpu::isa_dispatch<ZipRun<OpF<Op, O>, T, O>>(x0, x1, o, len, ZipKind::b_scalar);
          } else if (step[1] == 0 && step[2] == 1) {
            cpu::isa_dispatch<ZipRun<OpF<Op, O>, T, O>>(x0, x1, o, len, ZipKind::a_scalar);
          } else {
            for (int64_t i = 0; i < len; ++i)
              o[i] =
                  from_compute<O>(Op::f(to_compute(x0[i * step[1]]), to_compute(x1[i * step[2]])));
          }
        });
  };
  if constexpr (Op::float_only)
    dispatch_float(a.dtype, Op::name, body);
  else if constexpr (Op::is_compare)
    dispatch_all(a.dtype, Op::name, body);
  else
    dispatch_numeric(a.dtype, Op::name, body);
}

template class Binary<AddOp>;
template class Binary<SubOp>;
template class Binary<MulOp>;
template class Binary<DivOp>;
template class Binary<PowOp>;
template class Binary<MaximumOp>;
template class Binary<MinimumOp>;
template class Binary<ReluGradOp>;
template class Binary<GeluTanhGradOp>;
template class Binary<EqualOp>;
template class Binary<NotEqualOp>;
template class Binary<LessOp>;
template class Binary<LessEqualOp>;
template class Binary<GreaterOp>;
template class Binary<GreaterEqualOp>;

void Where::eval_cpu(const std::vector<const Array*>& in, const std::vector<Array*>& out) const {
  const Array &c = *in[0], &a = *in[1], &b = *in[2];
  Array& y = *out[0];
  if (!y.has_data()) y.allocate();
  dispatch_all(a.dtype, "where", [&]<class T>() {
    const bool* cp = c.data<bool>();
    const T* ap = a.data<T>();
    const T* bp = b.data<T>();
    T* yp = y.data<T>();
    for_each_run<4>(
        a.shape, {&y.strides, &c.strides, &a.strides, &b.strides}, kElementwiseGrain,
        [&](const std::array<int64_t, 4>& pos, const std::array<int64_t, 4>& step, int64_t len) {
          for (int64_t i = 0; i < len; ++i)
            yp[pos[0] + i] =
                cp[pos[1] + i * step[1]] ? ap[pos[2] + i * step[2]] : bp[pos[3] + i * step[3]];
        });
  });
}

void Cast::eval_cpu(const std::vector<const Array*>& in, const std::vector<Array*>& out) const {
  if (!out[0]->has_data()) out[0]->allocate();
  copy_strided(*in[0], *out[0]);
}

void Concat::eval_cpu(const std::vector<const Array*>& in, const std::vector<Array*>& out) const {
  Array& y = *out[0];
  y.allocate();
  int64_t start = 0;
  for (const Array* x : in) {
    // Write x into the matching slab of y through a strided view.
    Array dst;
    dst.shape = x->shape;
    dst.dtype = y.dtype;
    dst.view_of(y, y.strides, y.offset + start * y.strides[static_cast<size_t>(axis_)]);
    copy_strided(*x, dst);
    start += x->shape[static_cast<size_t>(axis_)];
  }
}

void SliceScatter::eval_cpu(const std::vector<const Array*>& in,
                            const std::vector<Array*>& out) const {
  Array& y = *out[0];
  y.allocate();
  std::memset(y.raw(), 0, y.nbytes());
  Array dst;
  dst.shape = in[0]->shape;
  dst.dtype = y.dtype;
  Strides st = y.strides;
  int64_t off = y.offset + start_ * st[static_cast<size_t>(axis_)];
  st[static_cast<size_t>(axis_)] *= step_;
  dst.view_of(y, st, off);
  copy_strided(*in[0], dst);
}

}  // namespace hetrain
