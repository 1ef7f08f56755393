#include "hetrain/base/dtype.h"

#include <cmath>

#include "hetrain/base/error.h"

namespace hetrain {

size_t dtype_size(Dtype dt) {
  switch (dt) {
    case Dtype::f64: case Dtype::i64: return 8;
    case Dtype::f32: case Dtype::i32: return 4;
    case Dtype::f16: case Dtype::bf16: return 2;
    case Dtype::boolean: return 1;
  }
  return 0;
}

std::string_view dtype_name(Dtype dt) {
  switch (dt) {
    case Dtype::f64: return "f64";
    case Dtype::f32: return "f32";
    case Dtype::f16: return "f16";
    case Dtype::bf16: return "bf16";
    case Dtype::i32: return "i32";
    case Dtype::i64: return "i64";
    case Dtype::boolean: return "bool";
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
      case Dtype::boolean: return 0;
      case Dtype::i32: return 1;
      case Dtype::i64: return 2;
      case Dtype::f16: return 3;
      case Dtype::bf16: return 3;
      case Dtype::f32: return 4;
      case Dtype::f64: return 5;
    }
    return 0;
  };
  // f16 with bf16 promotes to f32, as in PyTorch.
  if ((a == Dtype::f16 && b == Dtype::bf16) || (a == Dtype::bf16 && b == Dtype::f16))
    return Dtype::f32;
  return rank(a) >= rank(b) ? a : b;
}

float half_to_float(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  uint32_t u;
  if (exp == 0) {
    if (man == 0) {
      u = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        ++e;
        man <<= 1;
      } while ((man & 0x400u) == 0);
      u = sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (man & 0x3ffu) << 13;
    }
  } else if (exp == 0x1f) {
    u = sign | 0x7f800000u | man << 13;
  } else {
    u = sign | (exp + 127 - 15) << 23 | man << 13;
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t float_to_half(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7e00u;             // NaN
  if (a >= 0x477ff000u) return sign | 0x7c00u;            // overflow (after rounding) -> inf
  if (a < 0x38800000u) {                                  // subnormal or zero in f16
    if (a < 0x33000000u) return sign;                     // below half the smallest subnormal
    // Value = m * 2^(e-150) with implicit bit; shift to units of 2^-24 with RNE.
    uint32_t e = a >> 23;
    uint32_t m = (a & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - e;  // 14 + (113 - e) ... aligns to 2^-24 units
    uint32_t q = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) ++q;
    return sign | static_cast<uint16_t>(q);
  }
  // Normal: rebias exponent, round mantissa from 23 to 10 bits (carry may bump exponent).
  uint32_t r = a - 0x38000000u;  // (127-15) << 23
  r += 0xfffu + ((r >> 13) & 1u);
  return sign | static_cast<uint16_t>(r >> 13);
}

}  // namespace hetrain
