#include "hetrain/base/dtype.h"

#include <cmath>

#include "hetrain/base/error.h"

namespace hetrain {

size_t dtype_size(Dtype dt) {
  switch (dt) {
    case Dtype::f64:
    case Dtype::i64:
      return 8;
    case Dtype::f32:
    case Dtype::i32:
      return 4;
    case Dtype::f16:
    case Dtype::bf16:
      return 2;
    case Dtype::boolean:
      return 1;
  }
  return 0;
}

std::string_view dtype_name(Dtype dt) {
  switch (dt) {
    case Dtype::f64:
      return "f64";
    case Dtype::f32:
      return "f32";
    case Dtype::f16:
      return "f16";
    case Dtype::bf16:
      return "bf16";
    case Dtype::i32:
      return "i32";
    case Dtype::i64:
      return "i64";
    case Dtype::boolean:
      return "bool";
  }
  return "?";
}

Dtype dtype_from_name(std::string_view n) {
  if (n == "f64" || n == "float64" || n == "double") return Dtype::f64;
  if (n == "f32" || n == "float32" || n == "float") return Dtype::f32;
  if (n == "f16" || n == "float16" || n == "half") return Dtype::f16;
  if (n == "bf16" || n == "bfloat16") return Dtype::bf16;
  if (n == "i32" || n == "int32") return Dtype::i32;
  if (n == "i64" || n == "int64") return Dtype::i64;
  if (n == "bool") return Dtype::boolean;
  fail("[dtype] unknown dtype '", n, "'; expected one of f64, f32, f16, bf16, i32, i64, bool");
}

bool is_floating(Dtype dt) {
  return dt == Dtype::f64 || dt == Dtype::f32 || dt == Dtype::f16 || dt == Dtype::bf16;
}
bool is_integral(Dtype dt) { return !is_floating(dt); }

Dtype promote_types(Dtype a, Dtype b) {
  if (a == b) return a;
  auto rank = [](Dtype d) {
    switch (d) {
      case Dtype::boolean:
        return 0;
      case Dtype::i32:
        return 1;
      case Dtype::i64:
        return 2;
      case Dtype::f16:
        return 3;
      case Dtype::bf16:
        return 3;
      case Dtype::f32:
        return 4;
      case Dtype::f64:
        return 5;
    }
    return 0;
  };
  // f16 with bf16 promotes to f32, as in PyTorch.
  if ((a == Dtype::f16 && b == Dtype::bf16) || (a == Dtype::bf16 && b == Dtype::f16))
    return Dtype::f32;
  return rank(a) >= rank(b) ? a : b;
}

}  // namespace hetrain
