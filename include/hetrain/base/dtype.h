// Element types. f16 and bf16 are storage types: kernels load them into f32, compute, and
// store back with round-to-nearest-even.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace hetrain {

enum class Dtype : uint8_t { f64, f32, f16, bf16, i32, i64, boolean };

inline constexpr Dtype kAllDtypes[] = {Dtype::f64, Dtype::f32, Dtype::f16,    Dtype::bf16,
                                       Dtype::i32, Dtype::i64, Dtype::boolean};

size_t dtype_size(Dtype dt);
std::string_view dtype_name(Dtype dt);
/// Parses "f32", "float32", "bf16", ...; throws Error on an unknown name.
Dtype dtype_from_name(std::string_view name);
bool is_floating(Dtype dt);
bool is_integral(Dtype dt);  // i32, i64, bool
/// The result type of a binary op on a and b (PyTorch's promotion among these types).
Dtype promote_types(Dtype a, Dtype b);

/// IEEE binary16 stored as bits.
struct Half {
  uint16_t bits = 0;
};
/// bfloat16 stored as bits.
struct BFloat16 {
  uint16_t bits = 0;
};

inline float bf16_to_float(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
/// Rounds to nearest even; a NaN stays a (quiet) NaN. Branch-free, so loops over it vectorise.
inline uint16_t float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t nan = (u >> 16) | 0x40u;
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;  // round to nearest even
  return static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}
// IEEE half <-> float, exact (round to nearest even), inline and branch-free: every case is
// computed and the right one chosen by masks, so that GCC vectorises loops over f16 at every
// width (with if/else it saw control flow and left them scalar). No F16C needed: any x86-64.
// Checked against the branchy versions on all 2^32 floats and 2^16 halves.
inline float half_to_float(uint16_t h) {
  // Exponent and mantissa moved to a float's place, then rebiased by multiplying by 2^112:
  // exact for normals and subnormals alike (the float is subnormal exactly when the half is).
  const uint32_t em = static_cast<uint32_t>(h & 0x7fffu) << 13;
  float f;
  std::memcpy(&f, &em, 4);
  f *= 0x1p112f;
  uint32_t u;
  std::memcpy(&u, &f, 4);
  // inf and NaN keep their payload
  const uint32_t special = 0u - static_cast<uint32_t>((h & 0x7c00u) == 0x7c00u);
  u = (u & ~special) | ((em | 0x7f800000u) & special);
  u |= static_cast<uint32_t>(h & 0x8000u) << 16;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint16_t float_to_half(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t sign = u & 0x80000000u;
  u ^= sign;
  // Below the smallest normal half the FPU rounds for us: adding 0.5 aligns the value's units
  // of 2^-24 with the float's last mantissa bit.
  float a;
  std::memcpy(&a, &u, 4);
  a += 0.5f;
  uint32_t subnormal;
  std::memcpy(&subnormal, &a, 4);
  subnormal -= 0x3f000000u;
  // Normal: rebias, round the mantissa from 23 to 10 bits (a carry bumps the exponent).
  const uint32_t normal = (u + 0xc8000fffu + ((u >> 13) & 1u)) >> 13;
  // |f| >= 2^16: inf, or a quiet NaN for a NaN.
  const uint32_t big = 0x7c00u | (static_cast<uint32_t>(u > 0x7f800000u) << 9);
  const uint32_t is_big = 0u - static_cast<uint32_t>(u >= 0x47800000u);
  const uint32_t is_sub = 0u - static_cast<uint32_t>(u < 0x38800000u);
  const uint32_t o = (big & is_big) | (subnormal & is_sub) | (normal & ~(is_big | is_sub));
  return static_cast<uint16_t>(o | (sign >> 16));
}

/// Loads any storage type as its compute type; stores back with rounding.
template <class T>
inline auto to_compute(T v) {
  if constexpr (std::is_same_v<T, Half>) {
    return half_to_float(v.bits);
  } else if constexpr (std::is_same_v<T, BFloat16>) {
    return bf16_to_float(v.bits);
  } else {
    return v;
  }
}
template <class T, class C>
inline T from_compute(C v) {
  if constexpr (std::is_same_v<T, Half>) {
    return Half{float_to_half(static_cast<float>(v))};
  } else if constexpr (std::is_same_v<T, BFloat16>) {
    return BFloat16{float_to_bf16(static_cast<float>(v))};
  } else {
    return static_cast<T>(v);
  }
}
/// The type arithmetic on T is done in.
template <class T>
using compute_t = decltype(to_compute(T{}));

template <class T>
constexpr Dtype dtype_of();
template <>
constexpr Dtype dtype_of<double>() {
  return Dtype::f64;
}
template <>
constexpr Dtype dtype_of<float>() {
  return Dtype::f32;
}
template <>
constexpr Dtype dtype_of<Half>() {
  return Dtype::f16;
}
template <>
constexpr Dtype dtype_of<BFloat16>() {
  return Dtype::bf16;
}
template <>
constexpr Dtype dtype_of<int32_t>() {
  return Dtype::i32;
}
template <>
constexpr Dtype dtype_of<int64_t>() {
  return Dtype::i64;
}
template <>
constexpr Dtype dtype_of<bool>() {
  return Dtype::boolean;
}

}  // namespace hetrain
