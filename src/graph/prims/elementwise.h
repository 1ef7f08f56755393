// Elementwise primitives. Each op is one traits class with its name, scalar function and
// vjp; Unary<Op> / Binary<Op> make it a primitive. Inputs arrive broadcast to one shape.
#pragma once

#include <cmath>

#include "backends/cpu/copy.h"  // copy_strided, contiguous_array
#include "hetrain/graph/ops.h"
#include "hetrain/graph/primitive.h"

namespace hetrain {

template <class Op>
class Unary final : public Primitive {
 public:
  const char* name() const override { return Op::name; }
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override {
    if (Op::float_only && !is_floating(in[0].dtype))
      fail("[", Op::name, "] needs a floating-point tensor, got ", dtype_name(in[0].dtype));
    return {in[0]};
  }
  Cost cost(const std::vector<TensorMeta>& in, const std::vector<TensorMeta>& out) const override {
    Cost c = Primitive::cost(in, out);
    c.flops *= Op::flops;
    return c;
  }
  void eval_cpu(const std::vector<const Array*>& in, const std::vector<Array*>& out) const override;
  bool is_elementwise() const override { return true; }
#if HETRAIN_HAVE_CUDA
  void eval_cuda(const std::vector<const Array*>& in,
                 const std::vector<Array*>& out) const override;
  bool has_kernel(DeviceKind) const override { return true; }
#endif
  std::vector<Tensor> vjp(const std::vector<Tensor>& x, const std::vector<Tensor>& y,
                          const std::vector<Tensor>& g, const std::vector<int>&) const override {
    return {Op::vjp(x[0], y[0], g[0])};
  }
};

struct NegOp {
  static constexpr const char* name = "neg";
  static constexpr bool float_only = false;
  static constexpr double flops = 1;
  template <class C>
  static C f(C x) {
    return -x;
  }
  static Tensor vjp(const Tensor&, const Tensor&, const Tensor& g) { return neg(g); }
};
struct AbsOp {
  static constexpr const char* name = "abs";
  static constexpr bool float_only = false;
  static constexpr double flops = 1;
  template <class C>
  static C f(C x) {
    return x < 0 ? -x : x;
  }
  static Tensor vjp(const Tensor& x, const Tensor&, const Tensor& g);
};
struct ExpOp {
  static constexpr const char* name = "exp";
  static constexpr bool float_only = true;
  static constexpr double flops = 8;
  template <class C>
  static C f(C x) {
    return std::exp(x);
  }
  static Tensor vjp(const Tensor&, const Tensor& y, const Tensor& g) { return g * y; }
};
struct LogOp {
  static constexpr const char* name = "log";
  static constexpr bool float_only = true;
  static constexpr double flops = 8;
  template <class C>
  static C f(C x) {
    return std::log(x);
  }
  static Tensor vjp(const Tensor& x, const Tensor&, const Tensor& g) { return g / x; }
};
struct SqrtOp {
  static constexpr const char* name = "sqrt";
  static constexpr bool float_only = true;
  static constexpr double flops = 4;
  template <class C>
  static C f(C x) {
    return std::sqrt(x);
  }
  static Tensor vjp(const Tensor&, const Tensor& y, const Tensor& g) { return g / (2.0 * y); }
};
struct RsqrtOp {
  static constexpr const char* name = "rsqrt";
  static constexpr bool float_only = true;
  static constexpr double flops = 4;
  template <class C>
  static C f(C x) {
    return C(1) / std::sqrt(x);
  }
  static Tensor vjp(const Tensor& x, const Tensor& y, const Tensor& g) {
    return g * (-0.5) * y / x;
  }
};
struct SquareOp {
  static constexpr const char* name = "square";
  static constexpr bool float_only = false;
  static constexpr double flops = 1;
  template <class C>
  static C f(C x) {
    return x * x;
  }
  static Tensor vjp(const Tensor& x, const Tensor&, const Tensor& g) { return g * 2.0 * x; }
};
struct TanhOp {
  static constexpr const char* name = "tanh";
  static constexpr bool float_only = true;
  static constexpr double flops = 10;
  template <class C>
  static C f(C x) {
    return std::tanh(x);
  }
  static Tensor vjp(const Tensor&, const Tensor& y, const Tensor& g) { return g * (1.0 - y * y); }
};
struct SigmoidOp {
  static constexpr const char* name = "sigmoid";
  static constexpr bool float_only = true;
  static constexpr double flops = 10;
  template <class C>
  static C f(C x) {
    // Stable for large |x|.
    if (x >= 0) return C(1) / (C(1) + std::exp(-x));
    C e = std::exp(x);
    return e / (C(1) + e);
  }
  static Tensor vjp(const Tensor&, const Tensor& y, const Tensor& g) { return g * y * (1.0 - y); }
};
struct ReluOp {
  static constexpr const char* name = "relu";
  static constexpr bool float_only = false;
  static constexpr double flops = 1;
  template <class C>
  static C f(C x) {
    return x > C(0) ? x : C(0);
  }
  static Tensor vjp(const Tensor& x, const Tensor&, const Tensor& g);
};
struct GeluErfOp {
  static constexpr const char* name = "gelu";
  static constexpr bool float_only = true;
  static constexpr double flops = 20;
  template <class C>
  static C f(C x) {
    return C(0.5) * x * (C(1) + std::erf(x * C(0.70710678118654752440)));
  }
  static Tensor vjp(const Tensor& x, const Tensor&, const Tensor& g);
};
struct GeluTanhOp {
  static constexpr const char* name = "gelu_tanh";
  static constexpr bool float_only = true;
  static constexpr double flops = 20;
  template <class C>
  static C f(C x) {
    const C k = C(0.79788456080286535588);  // sqrt(2/pi)
    return C(0.5) * x * (C(1) + std::tanh(k * (x + C(0.044715) * x * x * x)));
  }
  static Tensor vjp(const Tensor& x, const Tensor&, const Tensor& g);
};
struct ErfOp {
  static constexpr const char* name = "erf";
  static constexpr bool float_only = true;
  static constexpr double flops = 10;
  template <class C>
  static C f(C x) {
    return std::erf(x);
  }
  static Tensor vjp(const Tensor& x, const Tensor&, const Tensor& g) {
    return g * (2.0 / std::sqrt(M_PI)) * exp(neg(square(x)));
  }
};
struct SiluOp {
  static constexpr const char* name = "silu";
  static constexpr bool float_only = true;
  static constexpr double flops = 10;
  template <class C>
  static C f(C x) {
    return x * SigmoidOp::f(x);
  }
  static Tensor vjp(const Tensor& x, const Tensor&, const Tensor& g);
};

template <class Op>
class Binary final : public Primitive {
 public:
  const char* name() const override { return Op::name; }
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override {
    if (in[0].shape != in[1].shape || in[0].dtype != in[1].dtype)
      fail("[", Op::name, "] internal: operands not broadcast/promoted");
    if (Op::float_only && !is_floating(in[0].dtype))
      fail("[", Op::name, "] needs floating-point tensors, got ", dtype_name(in[0].dtype));
    if (in[0].dtype == Dtype::boolean && !Op::is_compare)
      fail("[", Op::name, "] does not support bool tensors");
    return {{in[0].shape, Op::is_compare ? Dtype::boolean : in[0].dtype}};
  }
  void eval_cpu(const std::vector<const Array*>& in, const std::vector<Array*>& out) const override;
  bool is_elementwise() const override { return true; }
#if HETRAIN_HAVE_CUDA
  void eval_cuda(const std::vector<const Array*>& in,
                 const std::vector<Array*>& out) const override;
  bool has_kernel(DeviceKind) const override { return true; }
#endif
  std::vector<Tensor> vjp(const std::vector<Tensor>& x, const std::vector<Tensor>& y,
                          const std::vector<Tensor>& g,
                          const std::vector<int>& argnums) const override {
    std::vector<Tensor> r;
    for (int a : argnums) r.push_back(Op::vjp(a, x[0], x[1], y[0], g[0]));
    return r;
  }
};

struct AddOp {
  static constexpr const char* name = "add";
  static constexpr bool float_only = false, is_compare = false;
  template <class C>
  static C f(C a, C b) {
    return a + b;
  }
  static Tensor vjp(int, const Tensor&, const Tensor&, const Tensor&, const Tensor& g) { return g; }
};
struct SubOp {
  static constexpr const char* name = "sub";
  static constexpr bool float_only = false, is_compare = false;
  template <class C>
  static C f(C a, C b) {
    return a - b;
  }
  static Tensor vjp(int i, const Tensor&, const Tensor&, const Tensor&, const Tensor& g) {
    return i == 0 ? g : neg(g);
  }
};
struct MulOp {
  static constexpr const char* name = "mul";
  static constexpr bool float_only = false, is_compare = false;
  template <class C>
  static C f(C a, C b) {
    return a * b;
  }
  static Tensor vjp(int i, const Tensor& a, const Tensor& b, const Tensor&, const Tensor& g) {
    return i == 0 ? g * b : g * a;
  }
};
struct DivOp {
  static constexpr const char* name = "div";
  static constexpr bool float_only = false, is_compare = false;
  template <class C>
  static C f(C a, C b) {
    if constexpr (std::is_integral_v<C>) {
      // Integer division by zero is a user error PyTorch raises; give 0 rather than trap.
      return b == 0 ? C(0) : a / b;
    } else {
      return a / b;
    }
  }
  static Tensor vjp(int i, const Tensor& a, const Tensor& b, const Tensor& y, const Tensor& g) {
    return i == 0 ? g / b : neg(g * y / b);
  }
};
struct PowOp {
  static constexpr const char* name = "pow";
  static constexpr bool float_only = true, is_compare = false;
  template <class C>
  static C f(C a, C b) {
    return std::pow(a, b);
  }
  static Tensor vjp(int i, const Tensor& a, const Tensor& b, const Tensor& y, const Tensor& g);
};
struct MaximumOp {
  static constexpr const char* name = "maximum";
  static constexpr bool float_only = false, is_compare = false;
  template <class C>
  static C f(C a, C b) {
    return a >= b ? a : b;
  }
  static Tensor vjp(int i, const Tensor& a, const Tensor& b, const Tensor&, const Tensor& g);
};
struct MinimumOp {
  static constexpr const char* name = "minimum";
  static constexpr bool float_only = false, is_compare = false;
  template <class C>
  static C f(C a, C b) {
    return a <= b ? a : b;
  }
  static Tensor vjp(int i, const Tensor& a, const Tensor& b, const Tensor&, const Tensor& g);
};
/// relu's gradient in one pass: b where a > 0, else 0 (a: relu's input, b: the incoming
/// gradient; torch's threshold_backward). Built only by ReluOp::vjp.
struct ReluGradOp {
  static constexpr const char* name = "relu_backward";
  static constexpr bool float_only = false, is_compare = false;
  template <class C>
  static C f(C a, C b) {
    return a > C(0) ? b : C(0);
  }
  static Tensor vjp(int i, const Tensor& a, const Tensor& b, const Tensor&, const Tensor& g);
};
/// tanh-GELU's gradient in one pass: b * gelu'(a) (a: the input, b: the incoming gradient;
/// torch's gelu_backward with approximate='tanh'). Built only by GeluTanhOp::vjp. With
/// s = sigmoid(2u) = (1 + tanh(u)) / 2 and u = sqrt(2/pi) (a + 0.044715 a^3):
/// gelu'(a) = s + 2 a s (1 - s) u'.
struct GeluTanhGradOp {
  static constexpr const char* name = "gelu_tanh_backward";
  static constexpr bool float_only = true, is_compare = false;
  template <class C>
  static C f(C a, C b) {
    const C k = C(0.79788456080286535588), c = C(0.044715);
    const C u = k * (a + c * a * a * a), du = k * (C(1) + C(3) * c * a * a);
    // With e = exp(-2|u|) <= 1, p = 1 / (1 + e) and q = e p, {s, 1 - s} = {p, q}: nothing
    // overflows or cancels, and s (1 - s) = p q.
    const C e = std::exp(C(-2) * (u < 0 ? -u : u)), p = C(1) / (C(1) + e), q = e * p;
    return b * ((u >= 0 ? p : q) + C(2) * a * p * q * du);
  }
  static Tensor vjp(int i, const Tensor& a, const Tensor& b, const Tensor&, const Tensor& g);
};
#define HETRAIN_COMPARE_OP(Name, str, expr)                                              \
  struct Name {                                                                          \
    static constexpr const char* name = str;                                             \
    static constexpr bool float_only = false, is_compare = true;                         \
    template <class C>                                                                   \
    static bool f(C a, C b) {                                                            \
      return expr;                                                                       \
    }                                                                                    \
    static Tensor vjp(int, const Tensor&, const Tensor&, const Tensor&, const Tensor&) { \
      return {};                                                                         \
    }                                                                                    \
  };
HETRAIN_COMPARE_OP(EqualOp, "equal", a == b)
HETRAIN_COMPARE_OP(NotEqualOp, "not_equal", a != b)
HETRAIN_COMPARE_OP(LessOp, "less", a < b)
HETRAIN_COMPARE_OP(LessEqualOp, "less_equal", a <= b)
HETRAIN_COMPARE_OP(GreaterOp, "greater", a > b)
HETRAIN_COMPARE_OP(GreaterEqualOp, "greater_equal", a >= b)
#undef HETRAIN_COMPARE_OP

/// cond ? a : b over equal shapes.
class Where final : public Primitive {
 public:
  const char* name() const override { return "where"; }
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override;
  void eval_cpu(const std::vector<const Array*>& in, const std::vector<Array*>& out) const override;
  bool is_elementwise() const override { return true; }
#if HETRAIN_HAVE_CUDA
  void eval_cuda(const std::vector<const Array*>& in,
                 const std::vector<Array*>& out) const override;
  bool has_kernel(DeviceKind) const override { return true; }
#endif
  std::vector<Tensor> vjp(const std::vector<Tensor>& x, const std::vector<Tensor>& y,
                          const std::vector<Tensor>& g,
                          const std::vector<int>& argnums) const override;
};

/// Converts dtype (round to nearest even into f16/bf16); also a contiguous copy.
class Cast final : public Primitive {
 public:
  explicit Cast(Dtype to) : to_(to) {}
  const char* name() const override { return "cast"; }
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override {
    return {{in[0].shape, to_}};
  }
  Cost cost(const std::vector<TensorMeta>& in, const std::vector<TensorMeta>& out) const override {
    Cost c = Primitive::cost(in, out);
    c.flops = 0;
    return c;
  }
  void eval_cpu(const std::vector<const Array*>& in, const std::vector<Array*>& out) const override;
  bool is_elementwise() const override { return true; }
#if HETRAIN_HAVE_CUDA
  void eval_cuda(const std::vector<const Array*>& in,
                 const std::vector<Array*>& out) const override;
  bool has_kernel(DeviceKind) const override { return true; }
#endif
  std::vector<Tensor> vjp(const std::vector<Tensor>& x, const std::vector<Tensor>&,
                          const std::vector<Tensor>& g, const std::vector<int>&) const override {
    return {cast(g[0], x[0].dtype())};
  }
  std::string attrs() const override { return "to=" + std::string(dtype_name(to_)); }

 private:
  Dtype to_;
};

/// g where x > 0, else 0 (ReluGradOp): the gradient through a relu, from its input or, as
/// relu(x) > 0 exactly where x > 0, from its output.
Tensor relu_grad(const Tensor& x, const Tensor& g);

}  // namespace hetrain
