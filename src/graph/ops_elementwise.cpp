// Elementwise op builders and the vjps that need other ops.
#include <cmath>

#include "graph/prims/elementwise.h"
#include "hetrain/graph/ops.h"

namespace hetrain {

namespace {

template <class P>
const std::shared_ptr<Primitive>& stateless() {
  static const std::shared_ptr<Primitive> p = std::make_shared<P>();
  return p;
}

/// Casts to dt and broadcasts to shape, each only when needed.
Tensor conform(const Tensor& t, Dtype dt, const Shape& shape) {
  Tensor r = t.dtype() == dt ? t : cast(t, dt);
  return r.shape() == shape ? r : broadcast_to(r, shape);
}

template <class Op>
Tensor unary(const Tensor& x) {
  if (!x.defined()) fail("[", Op::name, "] undefined input");
  return make_node1(stateless<Unary<Op>>(), {x});
}

template <class Op>
Tensor binary(const Tensor& a, const Tensor& b) {
  if (!a.defined() || !b.defined()) fail("[", Op::name, "] undefined input");
  Dtype dt = promote_types(a.dtype(), b.dtype());
  if (Op::float_only && !is_floating(dt)) dt = Dtype::f32;
  Shape s = a.shape() == b.shape() ? a.shape() : broadcast_shapes(a.shape(), b.shape(), Op::name);
  return make_node1(stateless<Binary<Op>>(), {conform(a, dt, s), conform(b, dt, s)});
}

/// A scalar operand takes the tensor's dtype unless that would drop a fraction.
Tensor scalar_for(const Tensor& t, double v) {
  Dtype dt = t.dtype();
  if (!is_floating(dt) && v != std::floor(v)) dt = Dtype::f32;
  if (dt == Dtype::boolean) dt = Dtype::i64;
  return scalar(v, dt);
}

}  // namespace

Tensor add(const Tensor& a, const Tensor& b) { return binary<AddOp>(a, b); }
Tensor sub(const Tensor& a, const Tensor& b) { return binary<SubOp>(a, b); }
Tensor mul(const Tensor& a, const Tensor& b) { return binary<MulOp>(a, b); }
Tensor div(const Tensor& a, const Tensor& b) {
  // True division, as torch.div: integers divide as floats.
  if (!is_floating(a.dtype()) && !is_floating(b.dtype()))
    return binary<DivOp>(cast(a, Dtype::f32), cast(b, Dtype::f32));
  return binary<DivOp>(a, b);
}
Tensor pow(const Tensor& a, const Tensor& b) { return binary<PowOp>(a, b); }
Tensor pow(const Tensor& a, double e) {
  if (e == 2.0) return square(a);
  if (e == 1.0) return a;
  return binary<PowOp>(a, scalar_for(a, e));
}
Tensor maximum(const Tensor& a, const Tensor& b) { return binary<MaximumOp>(a, b); }
Tensor minimum(const Tensor& a, const Tensor& b) { return binary<MinimumOp>(a, b); }
Tensor equal(const Tensor& a, const Tensor& b) { return binary<EqualOp>(a, b); }
Tensor not_equal(const Tensor& a, const Tensor& b) { return binary<NotEqualOp>(a, b); }
Tensor less(const Tensor& a, const Tensor& b) { return binary<LessOp>(a, b); }
Tensor less_equal(const Tensor& a, const Tensor& b) { return binary<LessEqualOp>(a, b); }
Tensor greater(const Tensor& a, const Tensor& b) { return binary<GreaterOp>(a, b); }
Tensor greater_equal(const Tensor& a, const Tensor& b) { return binary<GreaterEqualOp>(a, b); }

Tensor neg(const Tensor& x) { return unary<NegOp>(x); }
Tensor abs(const Tensor& x) { return unary<AbsOp>(x); }
Tensor exp(const Tensor& x) { return unary<ExpOp>(x); }
Tensor log(const Tensor& x) { return unary<LogOp>(x); }
Tensor sqrt(const Tensor& x) { return unary<SqrtOp>(x); }
Tensor rsqrt(const Tensor& x) { return unary<RsqrtOp>(x); }
Tensor square(const Tensor& x) { return unary<SquareOp>(x); }
Tensor tanh(const Tensor& x) { return unary<TanhOp>(x); }
Tensor sigmoid(const Tensor& x) { return unary<SigmoidOp>(x); }
Tensor relu(const Tensor& x) { return unary<ReluOp>(x); }
Tensor silu(const Tensor& x) { return unary<SiluOp>(x); }
Tensor gelu(const Tensor& x, const std::string& approximate) {
  if (approximate == "none") return unary<GeluErfOp>(x);
  if (approximate == "tanh") return unary<GeluTanhOp>(x);
  fail("[gelu] approximate must be 'none' or 'tanh', got '", approximate, "'");
}

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  if (cond.dtype() != Dtype::boolean)
    fail("[where] condition must be bool, got ", dtype_name(cond.dtype()));
  Dtype dt = promote_types(a.dtype(), b.dtype());
  Shape s =
      broadcast_shapes(broadcast_shapes(cond.shape(), a.shape(), "where"), b.shape(), "where");
  return make_node1(stateless<Where>(),
                    {conform(cond, Dtype::boolean, s), conform(a, dt, s), conform(b, dt, s)});
}

Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
Tensor operator-(const Tensor& a) { return neg(a); }
Tensor operator+(const Tensor& a, double b) { return add(a, scalar_for(a, b)); }
Tensor operator-(const Tensor& a, double b) { return sub(a, scalar_for(a, b)); }
Tensor operator*(const Tensor& a, double b) { return mul(a, scalar_for(a, b)); }
Tensor operator/(const Tensor& a, double b) { return div(a, scalar_for(a, b)); }
Tensor operator+(double a, const Tensor& b) { return add(scalar_for(b, a), b); }
Tensor operator-(double a, const Tensor& b) { return sub(scalar_for(b, a), b); }
Tensor operator*(double a, const Tensor& b) { return mul(scalar_for(b, a), b); }
Tensor operator/(double a, const Tensor& b) { return div(scalar_for(b, a), b); }

// ---- vjps that need more than one line ----------------------------------------------------

Tensor AbsOp::vjp(const Tensor& x, const Tensor&, const Tensor& g) {
  // sign(x), with 0 at 0 as PyTorch.
  Tensor zero = scalar(0.0, x.dtype());
  Tensor sign = cast(greater(x, zero), x.dtype()) - cast(less(x, zero), x.dtype());
  return g * sign;
}
Tensor ReluOp::vjp(const Tensor& x, const Tensor&, const Tensor& g) { return relu_grad(x, g); }
Tensor relu_grad(const Tensor& x, const Tensor& g) { return binary<ReluGradOp>(x, g); }
Tensor ReluGradOp::vjp(int i, const Tensor& a, const Tensor&, const Tensor&, const Tensor& g) {
  // Linear in the gradient b; piecewise constant in a.
  return i == 0 ? zeros_like(a) : binary<ReluGradOp>(a, g);
}
Tensor GeluErfOp::vjp(const Tensor& x, const Tensor&, const Tensor& g) {
  // d/dx x*Phi(x) = Phi(x) + x*phi(x)
  Tensor cdf = 0.5 * (1.0 + unary<ErfOp>(x * M_SQRT1_2));
  Tensor pdf = exp(-0.5 * square(x)) * (1.0 / std::sqrt(2.0 * M_PI));
  return g * (cdf + x * pdf);
}
Tensor GeluTanhOp::vjp(const Tensor& x, const Tensor&, const Tensor& g) {
  return binary<GeluTanhGradOp>(x, g);
}
Tensor GeluTanhGradOp::vjp(int i, const Tensor& a, const Tensor& b, const Tensor&,
                           const Tensor& g) {
  // Linear in b; in a, b * gelu''(a) with t = tanh(u), u = k (a + c a^3):
  // gelu'' = (1 - t^2) (u' + a (u'' - 2 t u'^2) / 2), u' = k (1 + 3 c a^2), u'' = 6 k c a.
  if (i == 1) return binary<GeluTanhGradOp>(a, g);
  const double k = std::sqrt(2.0 / M_PI), c = 0.044715;
  Tensor a2 = square(a);
  Tensor t = tanh(k * (a + c * a * a2));
  Tensor du = k * (1.0 + 3 * c * a2);
  Tensor d2 = (1.0 - square(t)) * (du + 0.5 * a * (6 * k * c * a - 2.0 * t * square(du)));
  return g * b * d2;
}
Tensor SiluOp::vjp(const Tensor& x, const Tensor&, const Tensor& g) {
  Tensor s = sigmoid(x);
  return g * (s * (1.0 + x * (1.0 - s)));
}
Tensor PowOp::vjp(int i, const Tensor& a, const Tensor& b, const Tensor& y, const Tensor& g) {
  if (i == 0) return g * b * pow(a, b - 1.0);
  // d/db a^b = a^b ln a; PyTorch gives 0 where a == 0 and b >= 0.
  Tensor zero = scalar(0.0, a.dtype());
  Tensor safe = where(equal(a, zero), ones_like(a), a);
  return g * y * log(safe);
}
Tensor MaximumOp::vjp(int i, const Tensor& a, const Tensor& b, const Tensor&, const Tensor& g) {
  // Ties split the gradient evenly, as PyTorch.
  Tensor gt = cast(i == 0 ? greater(a, b) : greater(b, a), g.dtype());
  Tensor eq = cast(equal(a, b), g.dtype());
  return g * (gt + 0.5 * eq);
}
Tensor MinimumOp::vjp(int i, const Tensor& a, const Tensor& b, const Tensor&, const Tensor& g) {
  Tensor lt = cast(i == 0 ? less(a, b) : less(b, a), g.dtype());
  Tensor eq = cast(equal(a, b), g.dtype());
  return g * (lt + 0.5 * eq);
}

std::vector<TensorMeta> Where::infer(const std::vector<TensorMeta>& in) const { return {in[1]}; }
std::vector<Tensor> Where::vjp(const std::vector<Tensor>& x, const std::vector<Tensor>&,
                               const std::vector<Tensor>& g,
                               const std::vector<int>& argnums) const {
  std::vector<Tensor> r;
  Tensor z = zeros({}, g[0].dtype());
  for (int a : argnums) {
    if (a == 1)
      r.push_back(where(x[0], g[0], z));
    else if (a == 2)
      r.push_back(where(x[0], z, g[0]));
    else
      r.push_back({});
  }
  return r;
}

}  // namespace hetrain
