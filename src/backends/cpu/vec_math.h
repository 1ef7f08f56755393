// Branch-free math the compiler can vectorise (std::exp is a library call it cannot), plus
// row reductions with several partial accumulators (vectorisable without -ffast-math).
// Loops calling vexp vectorise only where GCC may if-convert float compares: compile them
// with -fno-trapping-math (see the pragma in eval_nn.cpp).
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "hetrain/base/dtype.h"

namespace hetrain::cpu {

/// The CPU backend's one f32 exp (every kernel that needs e^x in f32 calls it: the Exp op,
/// tanh/sigmoid/silu/gelu, softmax, cross-entropy, attention). Branch-free, so loops over it
/// vectorise (std::exp is a library call the compiler cannot). The range reduction and the
/// polynomial are explicit std::fma: one rounding each, so every width gives the same bits (the
/// kernels' files compile with -ffp-contract=off), and vector FMAs at AVX2 and AVX-512 (in
/// gpt-mini's bf16 step, where tanh-GELU's exp is the largest elementwise cost, 1.03x over
/// separate multiplies and adds on an AMX Xeon). The baseline (SSE2) build calls libm's fma
/// there, scalar: it serves CPUs without AVX2 and the width tests.
///
/// Cephes' expf: x = n ln2 + r with |r| <= ln2/2, e^r by a degree-6 polynomial, 2^n from the
/// exponent bits (as two factors, so that n from -150 to 128 needs no special case). Within 2 ulp
/// of std::exp for normal results. Edges, as std::exp: NaN -> NaN; x > ln(FLT_MAX) (88.72) ->
/// +inf, so +inf -> +inf; subnormal results (x below -87.34) within one subnormal ulp; x below
/// -103.98 (result under half the smallest subnormal) -> +0, so -inf -> +0.
[[gnu::always_inline]] inline float vexp(float x) {
  const bool nan = std::isnan(x), over = x > 88.72283935546875f, zero = x < -103.97908020019531f;
  // Clamped (and NaN replaced) so n below fits an int32 for every input.
  float xc = nan ? 0.0f : x;
  xc = xc < -103.97908020019531f ? -103.97908020019531f : xc;
  xc = xc > 88.72283935546875f ? 88.72283935546875f : xc;
  // Round xc*log2(e) to the nearest integer with the 1.5*2^23 trick (no SSE4.1 needed).
  const float n = std::fma(xc, 1.44269504088896341f, 12582912.0f) - 12582912.0f;
  float r = std::fma(-n, 0.693359375f, xc);
  r = std::fma(-n, -2.12194440e-4f, r);
  float p = 1.9875691500e-4f;
  p = std::fma(p, r, 1.3981999507e-3f);
  p = std::fma(p, r, 8.3334519073e-3f);
  p = std::fma(p, r, 4.1665795894e-2f);
  p = std::fma(p, r, 1.6666665459e-1f);
  p = std::fma(p, r, 5.0000001201e-1f);
  p = std::fma(p * r, r, r) + 1.0f;
  // 2^n = 2^h * 2^(n-h), h = n/2: both factors are normal floats for n in [-150, 128]; the
  // first product is exact, the second rounds once (into the subnormals where the result is).
  const int32_t ni = static_cast<int32_t>(n), h = ni / 2;
  const float s1 = std::bit_cast<float>(static_cast<uint32_t>(h + 127) << 23);
  const float s2 = std::bit_cast<float>(static_cast<uint32_t>(ni - h + 127) << 23);
  const float y = p * s1 * s2;
  return nan ? x : over ? INFINITY : zero ? 0.0f : y;
}
inline double vexp(double x) { return std::exp(x); }

/// 2^z for z clamped to [-126, 127], where 2^n is one normal float: the cheap exp of kernels whose
/// argument saturates the result well inside that range (tanh-GELU and its gradient), without
/// vexp's edge selects. NaN clamps to -126 (comparisons with NaN are false), so a caller whose
/// result must carry a NaN input gets it through another operand. n = round(z) with the
/// 1.5*2^23 trick, f = z - n exactly (|f| <= 1/2), 2^f by its Taylor series to degree 7 (in
/// explicit fma, the same bits at every width; truncation under 6e-9 relative, under an f32 ulp).
[[gnu::always_inline]] inline float vexp2_clamped(float z) {
  float zc = z > -126.0f ? z : -126.0f;
  zc = zc < 127.0f ? zc : 127.0f;
  const float n = (zc + 12582912.0f) - 12582912.0f;
  const float f = zc - n;
  float p = 1.5252733804059840e-5f;  // ln2^7 / 7!
  p = std::fma(p, f, 1.5403530393381608e-4f);
  p = std::fma(p, f, 1.3333558146428443e-3f);
  p = std::fma(p, f, 9.6181291076284772e-3f);
  p = std::fma(p, f, 5.5504108664821580e-2f);
  p = std::fma(p, f, 2.4022650695910071e-1f);
  p = std::fma(p, f, 6.9314718055994531e-1f);
  p = std::fma(p, f, 1.0f);
  return p * std::bit_cast<float>(static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23);
}

/// *x in its compute type. f16/bf16 are read through their bits: a copy of the struct would keep
/// GCC from vectorising the loop around it.
template <class T>
[[gnu::always_inline]] inline auto load_compute(const T* x) {
  if constexpr (std::is_same_v<T, BFloat16>)
    return bf16_to_float(x->bits);
  else if constexpr (std::is_same_v<T, Half>)
    return half_to_float(x->bits);
  else
    return *x;
}
/// *y = v rounded to T (from_compute), f16/bf16 written through their bits.
template <class T, class C>
[[gnu::always_inline]] inline void store_compute(T* y, C v) {
  if constexpr (std::is_same_v<T, BFloat16>)
    y->bits = float_to_bf16(static_cast<float>(v));
  else if constexpr (std::is_same_v<T, Half>)
    y->bits = float_to_half(static_cast<float>(v));
  else
    *y = from_compute<T>(v);
}

/// Eight consecutive values of T as one vector load, read lane by lane in T's compute type. A loop
/// over lanes j that loads x[i + j] itself is built by GCC 12 from eight scalar loads (or
/// products) and shuffles, at AVX2 and AVX-512 alike, and one that copies them into a plain array
/// first reads that array back through the stack at AVX2 (two 16-byte stores, one 32-byte load);
/// from a vector its SLP vectoriser makes one load and vector arithmetic (a layer norm's backward
/// spent 30% of its time in those shuffles). The values and the order of the arithmetic are the
/// same either way. f16/bf16 lanes are their 16 bits, converted as load_compute does.
template <class T>
struct Load8 {
  using E = std::conditional_t<std::is_same_v<T, BFloat16> || std::is_same_v<T, Half>, uint16_t, T>;
  typedef E V __attribute__((vector_size(8 * sizeof(E))));
  V v;
  [[gnu::always_inline]] explicit Load8(const T* p) { std::memcpy(&v, p, sizeof v); }
  [[gnu::always_inline]] auto operator[](int j) const {
    if constexpr (std::is_same_v<T, BFloat16>)
      return bf16_to_float(v[j]);
    else if constexpr (std::is_same_v<T, Half>)
      return half_to_float(v[j]);
    else
      return v[j];
  }
};

/// Max of n values of T in compute precision (NaN propagates).
template <class T>
[[gnu::always_inline]] inline compute_t<T> row_max(const T* x, int64_t n) {
  using C = compute_t<T>;
  C acc[8];
  for (auto& a : acc) a = -INFINITY;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const Load8<T> a(x + i);
    for (int j = 0; j < 8; ++j) {
      C v = a[j];
      acc[j] = (v > acc[j] || std::isnan(v)) ? v : acc[j];
    }
  }
  for (; i < n; ++i) {
    C v = load_compute(x + i);
    acc[0] = (v > acc[0] || std::isnan(v)) ? v : acc[0];
  }
  C m = acc[0];
  for (int j = 1; j < 8; ++j) m = (acc[j] > m || std::isnan(acc[j])) ? acc[j] : m;
  return m;
}

/// Eight lanes of C as one GCC vector: the eight partial sums of the reductions here and in the
/// kernels, one register (or two halves) at every width. A plain C[8] array of sums lets GCC 12
/// vectorise the loop around it across iterations at AVX-512, with a shuffle per element (twice
/// as slow as AVX2); the order of the additions is the same either way, lane j being sum j.
template <class C>
struct Lanes8Of {
  typedef C type __attribute__((vector_size(8 * sizeof(C))));
};
template <class C>
using Lanes8 = typename Lanes8Of<C>::type;
/// acc += t[0..8) lane by lane (by reference: a vector passed or returned by value would
/// depend on the ISA in the ABI).
template <class C>
[[gnu::always_inline]] inline void add8(Lanes8<C>& acc, const C* t) {
  Lanes8<C> v;
  std::memcpy(&v, t, sizeof v);
  acc += v;
}
/// The eight partial sums (a Lanes8) added in a fixed order.
template <class V>
[[gnu::always_inline]] inline auto total8(const V& a) {
  return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
}

/// sum over i of f(load_compute(x + i)) with eight partial sums.
template <class T, class F>
[[gnu::always_inline]] inline compute_t<T> row_sum(const T* x, int64_t n, F&& f) {
  using C = compute_t<T>;
  Lanes8<C> acc = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const Load8<T> a(x + i);
    C t[8];
    for (int j = 0; j < 8; ++j) t[j] = f(a[j]);
    add8(acc, t);
  }
  for (; i < n; ++i) acc[0] += f(load_compute(x + i));
  return total8(acc);
}

/// sum over i of a[i] * b[i] in compute precision, with eight partial sums (as row_sum).
template <class T>
[[gnu::always_inline]] inline compute_t<T> row_dot(const T* a, const T* b, int64_t n) {
  using C = compute_t<T>;
  Lanes8<C> acc = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const Load8<T> av(a + i), bv(b + i);
    C t[8];
    for (int j = 0; j < 8; ++j) t[j] = av[j] * bv[j];
    add8(acc, t);
  }
  for (; i < n; ++i) acc[0] += load_compute(a + i) * load_compute(b + i);
  return total8(acc);
}

/// Rows per parallel_for chunk so that a chunk holds about this many elements.
inline constexpr int64_t kRowGrainElems = 1 << 14;
inline int64_t row_grain(int64_t row_len) {
  return std::max<int64_t>(1, kRowGrainElems / std::max<int64_t>(row_len, 1));
}

}  // namespace hetrain::cpu
