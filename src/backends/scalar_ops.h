// The scalar formula of every elementwise op, written once and compiled for the host (the CPU
// kernels and their reference loops) and for the device (the CUDA kernels). The graph's op
// traits (graph/prims/elementwise.h) derive from these structs and add name, cost and vjp.
//
// The lists below are the only place an op is enumerated: the ids the CUDA kernels switch on
// and those switches are generated from them, so an op in a list has its CUDA case by
// construction, and a graph op whose formula is not in a list has no id: naming it in the
// CUDA glue (unary_id / binary_id) is a compile error, not a silent pass-through.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#if defined(__CUDACC__)
#define HETRAIN_HD __host__ __device__ __forceinline__
#else
#define HETRAIN_HD inline
#endif

// libm on the host; on the device CUDA's math library, whose global overloads take float and
// double (expf and exp, ...).
#if defined(__CUDA_ARCH__)
#define HETRAIN_LIBM(fn) ::fn
#else
#define HETRAIN_LIBM(fn) std::fn
#endif

namespace hetrain::formulas {

// --- unary: f(x) in the compute type (f32 for f16/bf16); float_only ops never see integers.
struct Neg {
  static constexpr bool float_only = false;
  template <class C>
  HETRAIN_HD static C f(C x) {
    return -x;
  }
};
struct Abs {
  static constexpr bool float_only = false;
  template <class C>
  HETRAIN_HD static C f(C x) {
    return x < C(0) ? -x : x;
  }
};
struct Exp {
  static constexpr bool float_only = true;
  template <class C>
  HETRAIN_HD static C f(C x) {
    return HETRAIN_LIBM(exp)(x);
  }
};
struct Log {
  static constexpr bool float_only = true;
  template <class C>
  HETRAIN_HD static C f(C x) {
    return HETRAIN_LIBM(log)(x);
  }
};
struct Sqrt {
  static constexpr bool float_only = true;
  template <class C>
  HETRAIN_HD static C f(C x) {
    return HETRAIN_LIBM(sqrt)(x);
  }
};
struct Rsqrt {
  static constexpr bool float_only = true;
  template <class C>
  HETRAIN_HD static C f(C x) {
    return C(1) / HETRAIN_LIBM(sqrt)(x);
  }
};
struct Square {
  static constexpr bool float_only = false;
  template <class C>
  HETRAIN_HD static C f(C x) {
    return x * x;
  }
};
struct Tanh {
  static constexpr bool float_only = true;
  template <class C>
  HETRAIN_HD static C f(C x) {
    return HETRAIN_LIBM(tanh)(x);
  }
};
struct Sigmoid {
  static constexpr bool float_only = true;
  template <class C>
  HETRAIN_HD static C f(C x) {
    // Stable for large |x|: exp of a non-positive number only.
    if (x >= C(0)) return C(1) / (C(1) + HETRAIN_LIBM(exp)(-x));
    const C e = HETRAIN_LIBM(exp)(x);
    return e / (C(1) + e);
  }
};
struct Relu {
  static constexpr bool float_only = false;
  template <class C>
  HETRAIN_HD static C f(C x) {
    return x > C(0) ? x : C(0);
  }
};
struct GeluErf {
  static constexpr bool float_only = true;
  template <class C>
  HETRAIN_HD static C f(C x) {
    return C(0.5) * x * (C(1) + HETRAIN_LIBM(erf)(x * C(0.70710678118654752440)));
  }
};
struct GeluTanh {
  static constexpr bool float_only = true;
  template <class C>
  HETRAIN_HD static C f(C x) {
    const C k = C(0.79788456080286535588);  // sqrt(2/pi)
    return C(0.5) * x * (C(1) + HETRAIN_LIBM(tanh)(k * (x + C(0.044715) * x * x * x)));
  }
};
struct Erf {
  static constexpr bool float_only = true;
  template <class C>
  HETRAIN_HD static C f(C x) {
    return HETRAIN_LIBM(erf)(x);
  }
};
struct Silu {
  static constexpr bool float_only = true;
  template <class C>
  HETRAIN_HD static C f(C x) {
    return x * Sigmoid::f(x);
  }
};

// --- binary: f(a, b) in the compute type; comparisons return bool.
struct Add {
  static constexpr bool float_only = false, is_compare = false;
  template <class C>
  HETRAIN_HD static C f(C a, C b) {
    return a + b;
  }
};
struct Sub {
  static constexpr bool float_only = false, is_compare = false;
  template <class C>
  HETRAIN_HD static C f(C a, C b) {
    return a - b;
  }
};
struct Mul {
  static constexpr bool float_only = false, is_compare = false;
  template <class C>
  HETRAIN_HD static C f(C a, C b) {
    return a * b;
  }
};
struct Div {
  static constexpr bool float_only = false, is_compare = false;
  template <class C>
  HETRAIN_HD static C f(C a, C b) {
    if constexpr (std::is_integral_v<C>) {
      // Integer division by zero is a user error PyTorch raises; give 0 rather than trap.
      return b == C(0) ? C(0) : a / b;
    } else {
      return a / b;
    }
  }
};
struct Pow {
  static constexpr bool float_only = true, is_compare = false;
  template <class C>
  HETRAIN_HD static C f(C a, C b) {
    return HETRAIN_LIBM(pow)(a, b);
  }
};
struct Maximum {
  static constexpr bool float_only = false, is_compare = false;
  template <class C>
  HETRAIN_HD static C f(C a, C b) {
    return a >= b ? a : b;
  }
};
struct Minimum {
  static constexpr bool float_only = false, is_compare = false;
  template <class C>
  HETRAIN_HD static C f(C a, C b) {
    return a <= b ? a : b;
  }
};
/// relu's gradient: b where a > 0, else 0 (a: relu's input, b: the incoming gradient).
struct ReluGrad {
  static constexpr bool float_only = false, is_compare = false;
  template <class C>
  HETRAIN_HD static C f(C a, C b) {
    return a > C(0) ? b : C(0);
  }
};
/// tanh-GELU's gradient: b * gelu'(a). With s = sigmoid(2u) = (1 + tanh(u)) / 2 and
/// u = sqrt(2/pi) (a + 0.044715 a^3): gelu'(a) = s + 2 a s (1 - s) u'.
struct GeluTanhGrad {
  static constexpr bool float_only = true, is_compare = false;
  template <class C>
  HETRAIN_HD static C f(C a, C b) {
    const C k = C(0.79788456080286535588), c = C(0.044715);
    const C u = k * (a + c * a * a * a), du = k * (C(1) + C(3) * c * a * a);
    // With e = exp(-2|u|) <= 1, p = 1 / (1 + e) and q = e p, {s, 1 - s} = {p, q}: nothing
    // overflows or cancels, and s (1 - s) = p q.
    const C e = HETRAIN_LIBM(exp)(C(-2) * (u < C(0) ? -u : u)), p = C(1) / (C(1) + e), q = e * p;
    return b * ((u >= C(0) ? p : q) + C(2) * a * p * q * du);
  }
};
#define HETRAIN_SCALAR_COMPARE(Name, expr)                       \
  struct Name {                                                  \
    static constexpr bool float_only = false, is_compare = true; \
    template <class C>                                           \
    HETRAIN_HD static bool f(C a, C b) {                         \
      return expr;                                               \
    }                                                            \
  };
HETRAIN_SCALAR_COMPARE(Equal, a == b)
HETRAIN_SCALAR_COMPARE(NotEqual, a != b)
HETRAIN_SCALAR_COMPARE(Less, a < b)
HETRAIN_SCALAR_COMPARE(LessEqual, a <= b)
HETRAIN_SCALAR_COMPARE(Greater, a > b)
HETRAIN_SCALAR_COMPARE(GreaterEqual, a >= b)
#undef HETRAIN_SCALAR_COMPARE

// --- the lists: X(id, Formula). Comparisons come last among the binary ops.
// clang-format off
#define HETRAIN_UNARY_FORMULAS(X) \
  X(neg, Neg) X(abs, Abs) X(exp, Exp) X(log, Log) X(sqrt, Sqrt) X(rsqrt, Rsqrt) \
  X(square, Square) X(tanh, Tanh) X(sigmoid, Sigmoid) X(relu, Relu) X(gelu, GeluErf) \
  X(gelu_tanh, GeluTanh) X(erf, Erf) X(silu, Silu)
#define HETRAIN_BINARY_FORMULAS(X) \
  X(add, Add) X(sub, Sub) X(mul, Mul) X(div, Div) X(pow, Pow) X(maximum, Maximum) \
  X(minimum, Minimum) X(relu_backward, ReluGrad) X(gelu_tanh_backward, GeluTanhGrad) \
  X(equal, Equal) X(not_equal, NotEqual) X(less, Less) X(less_equal, LessEqual) \
  X(greater, Greater) X(greater_equal, GreaterEqual)
// clang-format on

#define HETRAIN_SCALAR_ID(id, F) id,
enum class UnaryId : uint8_t { HETRAIN_UNARY_FORMULAS(HETRAIN_SCALAR_ID) };
enum class BinaryId : uint8_t { HETRAIN_BINARY_FORMULAS(HETRAIN_SCALAR_ID) };
#undef HETRAIN_SCALAR_ID

template <class>
inline constexpr bool kNoFormula = false;

/// The id of the formula an op (a formula, or a graph op trait deriving from one) computes.
template <class Op>
constexpr UnaryId unary_id() {
  using Id = UnaryId;
#define HETRAIN_SCALAR_PICK(id, F)        \
  if constexpr (std::is_base_of_v<F, Op>) \
    return Id::id;                        \
  else
  HETRAIN_UNARY_FORMULAS(HETRAIN_SCALAR_PICK) {
    static_assert(kNoFormula<Op>, "a unary op whose formula is not in HETRAIN_UNARY_FORMULAS");
    return UnaryId{};
  }
}
template <class Op>
constexpr BinaryId binary_id() {
  using Id = BinaryId;
  HETRAIN_BINARY_FORMULAS(HETRAIN_SCALAR_PICK) {
    static_assert(kNoFormula<Op>, "a binary op whose formula is not in HETRAIN_BINARY_FORMULAS");
    return BinaryId{};
  }
#undef HETRAIN_SCALAR_PICK
}
constexpr bool is_compare(BinaryId id) { return id >= BinaryId::equal; }

}  // namespace hetrain::formulas
