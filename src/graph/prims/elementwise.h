// Elementwise primitives. Each op is one traits class: its scalar formula (inherited from
// backends/scalar_ops.h, shared with the CUDA kernels), name, cost and vjp; Unary<Op> /
// Binary<Op> make it a primitive. Inputs arrive broadcast to one shape.
#pragma once

#include <cmath>

#include "backends/cpu/copy.h"  // copy_strided, contiguous_array
#include "backends/scalar_ops.h"
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

struct NegOp : formulas::Neg {
  static constexpr const char* name = "neg";
  static constexpr double flops = 1;
  static Tensor vjp(const Tensor&, const Tensor&, const Tensor& g) { return neg(g); }
};
struct AbsOp : formulas::Abs {
  static constexpr const char* name = "abs";
  static constexpr double flops = 1;
  static Tensor vjp(const Tensor& x, const Tensor&, const Tensor& g);
};
struct ExpOp : formulas::Exp {
  static constexpr const char* name = "exp";
  static constexpr double flops = 8;
  static Tensor vjp(const Tensor&, const Tensor& y, const Tensor& g) { return g * y; }
};
struct LogOp : formulas::Log {
  static constexpr const char* name = "log";
  static constexpr double flops = 8;
  static Tensor vjp(const Tensor& x, const Tensor&, const Tensor& g) { return g / x; }
};
struct SqrtOp : formulas::Sqrt {
  static constexpr const char* name = "sqrt";
  static constexpr double flops = 4;
  static Tensor vjp(const Tensor&, const Tensor& y, const Tensor& g) { return g / (2.0 * y); }
};
struct RsqrtOp : formulas::Rsqrt {
  static constexpr const char* name = "rsqrt";
  static constexpr double flops = 4;
  static Tensor vjp(const Tensor& x, const Tensor& y, const Tensor& g) {
    return g * (-0.5) * y / x;
  }
};
struct SquareOp : formulas::Square {
  static constexpr const char* name = "square";
  static constexpr double flops = 1;
  static Tensor vjp(const Tensor& x, const Tensor&, const Tensor& g) { return g * 2.0 * x; }
};
struct TanhOp : formulas::Tanh {
  static constexpr const char* name = "tanh";
  static constexpr double flops = 10;
  static Tensor vjp(const Tensor&, const Tensor& y, const Tensor& g) { return g * (1.0 - y * y); }
};
struct SigmoidOp : formulas::Sigmoid {
  static constexpr const char* name = "sigmoid";
  static constexpr double flops = 10;
  static Tensor vjp(const Tensor&, const Tensor& y, const Tensor& g) { return g * y * (1.0 - y); }
};
struct ReluOp : formulas::Relu {
  static constexpr const char* name = "relu";
  static constexpr double flops = 1;
  static Tensor vjp(const Tensor& x, const Tensor&, const Tensor& g);
};
struct GeluErfOp : formulas::GeluErf {
  static constexpr const char* name = "gelu";
  static constexpr double flops = 20;
  static Tensor vjp(const Tensor& x, const Tensor&, const Tensor& g);
};
struct GeluTanhOp : formulas::GeluTanh {
  static constexpr const char* name = "gelu_tanh";
  static constexpr double flops = 20;
  static Tensor vjp(const Tensor& x, const Tensor&, const Tensor& g);
};
struct ErfOp : formulas::Erf {
  static constexpr const char* name = "erf";
  static constexpr double flops = 10;
  static Tensor vjp(const Tensor& x, const Tensor&, const Tensor& g) {
    return g * (2.0 / std::sqrt(M_PI)) * exp(neg(square(x)));
  }
};
struct SiluOp : formulas::Silu {
  static constexpr const char* name = "silu";
  static constexpr double flops = 10;
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

struct AddOp : formulas::Add {
  static constexpr const char* name = "add";
  static Tensor vjp(int, const Tensor&, const Tensor&, const Tensor&, const Tensor& g) { return g; }
};
struct SubOp : formulas::Sub {
  static constexpr const char* name = "sub";
  static Tensor vjp(int i, const Tensor&, const Tensor&, const Tensor&, const Tensor& g) {
    return i == 0 ? g : neg(g);
  }
};
struct MulOp : formulas::Mul {
  static constexpr const char* name = "mul";
  static Tensor vjp(int i, const Tensor& a, const Tensor& b, const Tensor&, const Tensor& g) {
    return i == 0 ? g * b : g * a;
  }
};
struct DivOp : formulas::Div {
  static constexpr const char* name = "div";
  static Tensor vjp(int i, const Tensor& a, const Tensor& b, const Tensor& y, const Tensor& g) {
    return i == 0 ? g / b : neg(g * y / b);
  }
};
struct PowOp : formulas::Pow {
  static constexpr const char* name = "pow";
  static Tensor vjp(int i, const Tensor& a, const Tensor& b, const Tensor& y, const Tensor& g);
};
struct MaximumOp : formulas::Maximum {
  static constexpr const char* name = "maximum";
  static Tensor vjp(int i, const Tensor& a, const Tensor& b, const Tensor&, const Tensor& g);
};
struct MinimumOp : formulas::Minimum {
  static constexpr const char* name = "minimum";
  static Tensor vjp(int i, const Tensor& a, const Tensor& b, const Tensor&, const Tensor& g);
};
/// relu's gradient in one pass: b where a > 0, else 0 (a: relu's input, b: the incoming
/// gradient; torch's threshold_backward). Built only by ReluOp::vjp.
struct ReluGradOp : formulas::ReluGrad {
  static constexpr const char* name = "relu_backward";
  static Tensor vjp(int i, const Tensor& a, const Tensor& b, const Tensor&, const Tensor& g);
};
/// tanh-GELU's gradient in one pass: b * gelu'(a) (a: the input, b: the incoming gradient;
/// torch's gelu_backward with approximate='tanh'). Built only by GeluTanhOp::vjp. With
/// s = sigmoid(2u) = (1 + tanh(u)) / 2 and u = sqrt(2/pi) (a + 0.044715 a^3):
/// gelu'(a) = s + 2 a s (1 - s) u'.
struct GeluTanhGradOp : formulas::GeluTanhGrad {
  static constexpr const char* name = "gelu_tanh_backward";
  static Tensor vjp(int i, const Tensor& a, const Tensor& b, const Tensor&, const Tensor& g);
};
#define HETRAIN_COMPARE_OP(Name, Formula, str)                                           \
  struct Name : formulas::Formula {                                                      \
    static constexpr const char* name = str;                                             \
    static Tensor vjp(int, const Tensor&, const Tensor&, const Tensor&, const Tensor&) { \
      return {};                                                                         \
    }                                                                                    \
  };
HETRAIN_COMPARE_OP(EqualOp, Equal, "equal")
HETRAIN_COMPARE_OP(NotEqualOp, NotEqual, "not_equal")
HETRAIN_COMPARE_OP(LessOp, Less, "less")
HETRAIN_COMPARE_OP(LessEqualOp, LessEqual, "less_equal")
HETRAIN_COMPARE_OP(GreaterOp, Greater, "greater")
HETRAIN_COMPARE_OP(GreaterEqualOp, GreaterEqual, "greater_equal")
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
