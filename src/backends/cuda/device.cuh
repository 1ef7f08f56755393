// Device-side helpers shared by the .cu files: storage types, loads into the compute type
// and rounding stores (bit-compatible with hetrain/base/dtype.h), dtype dispatch, launch
// sizes and block reductions.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>
#include <utility>

#include "backends/cuda/check.h"
#include "backends/cuda/kernels.h"
#include "hetrain/base/dispatch.h"  // dispatch_index
#include "hetrain/base/error.h"

namespace hetrain::cuda {

/// f16 and bf16 as raw bits, like Half/BFloat16 on the host.
struct F16 {
  uint16_t bits;
};
struct BF16 {
  uint16_t bits;
};

template <class T>
struct ComputeOf {
  using type = T;
};
template <>
struct ComputeOf<F16> {
  using type = float;
};
template <>
struct ComputeOf<BF16> {
  using type = float;
};
template <class T>
using compute_of = typename ComputeOf<T>::type;

/// Accumulator of sums: f32 for the 16-bit floats and f32, f64 for f64, the type itself
/// for integers.
template <class T>
using acc_of = compute_of<T>;

__device__ __forceinline__ float bf16_bits_to_float(uint16_t b) {
  return __uint_as_float(static_cast<uint32_t>(b) << 16);
}
__device__ __forceinline__ uint16_t float_to_bf16_bits(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  return static_cast<uint16_t>(u >> 16);
}

template <class T>
__device__ __forceinline__ compute_of<T> load(T v) {
  if constexpr (std::is_same_v<T, F16>) {
    return __half2float(__ushort_as_half(v.bits));
  } else if constexpr (std::is_same_v<T, BF16>) {
    return bf16_bits_to_float(v.bits);
  } else {
    return v;
  }
}
/// Converts a compute value to storage type T (round to nearest even for f16/bf16).
template <class T, class C>
__device__ __forceinline__ T store(C v) {
  if constexpr (std::is_same_v<T, F16>) {
    return F16{__half_as_ushort(__float2half_rn(static_cast<float>(v)))};
  } else if constexpr (std::is_same_v<T, BF16>) {
    return BF16{float_to_bf16_bits(static_cast<float>(v))};
  } else if constexpr (std::is_same_v<T, bool>) {
    return v != C(0);
  } else {
    return static_cast<T>(v);
  }
}

/// Calls f.template operator()<T>() for the device storage type of a floating dtype (F16 and
/// BF16 for the half types; the host dispatch_* in hetrain/base/dispatch.h pick host types).
template <class F>
void dispatch_device_float(Dtype dt, const char* op, F&& f) {
  switch (dt) {
    case Dtype::f64:
      f.template operator()<double>();
      return;
    case Dtype::f32:
      f.template operator()<float>();
      return;
    case Dtype::f16:
      f.template operator()<F16>();
      return;
    case Dtype::bf16:
      f.template operator()<BF16>();
      return;
    default:
      fail("[", op, "] CUDA kernel needs a floating-point dtype, got ", dtype_name(dt));
  }
}
/// The same for every dtype: integers and bool as themselves.
template <class F>
void dispatch_device(Dtype dt, const char* op, F&& f) {
  switch (dt) {
    case Dtype::i32:
      f.template operator()<int32_t>();
      return;
    case Dtype::i64:
      f.template operator()<int64_t>();
      return;
    case Dtype::boolean:
      f.template operator()<bool>();
      return;
    default:
      dispatch_device_float(dt, op, std::forward<F>(f));
  }
}

/// Blocks for a grid-stride loop over n items with `threads` per block.
inline unsigned grid_for(int64_t n, int threads) {
  const int64_t b = (n + threads - 1) / threads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > (int64_t{1} << 16) ? (int64_t{1} << 16) : b));
}

template <class T>
__device__ __forceinline__ T warp_sum(T v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
/// max that propagates NaN (the CPU kernels' `(v > m || v != v) ? v : m`).
template <class T>
__device__ __forceinline__ T nan_max(T m, T v) {
  return (v > m || v != v) ? v : m;
}
template <class T>
__device__ __forceinline__ T warp_max(T v) {
  for (int o = 16; o > 0; o >>= 1) v = nan_max(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
/// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets it.
/// `shared` holds 32 values; the block must call it uniformly.
template <class T>
__device__ T block_sum(T v, T* shared) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // shared may still be read from a previous call
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  T t = lane < nw ? shared[lane] : T(0);
  return warp_sum(t);
}
template <class T>
__device__ T block_max(T v, T* shared, T lowest) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  T t = lane < nw ? shared[lane] : lowest;
  return warp_max(t);
}

__device__ __forceinline__ float d_exp(float x) { return expf(x); }
__device__ __forceinline__ double d_exp(double x) { return exp(x); }
__device__ __forceinline__ float d_log(float x) { return logf(x); }
__device__ __forceinline__ double d_log(double x) { return log(x); }
__device__ __forceinline__ float d_sqrt(float x) { return sqrtf(x); }
__device__ __forceinline__ double d_sqrt(double x) { return sqrt(x); }
__device__ __forceinline__ float d_tanh(float x) { return tanhf(x); }
__device__ __forceinline__ double d_tanh(double x) { return tanh(x); }
__device__ __forceinline__ float d_erf(float x) { return erff(x); }
__device__ __forceinline__ double d_erf(double x) { return erf(x); }
__device__ __forceinline__ float d_pow(float a, float b) { return powf(a, b); }
__device__ __forceinline__ double d_pow(double a, double b) { return pow(a, b); }

}  // namespace hetrain::cuda
