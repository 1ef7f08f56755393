// Elementwise kernels: unary and binary ops, where, and the dtype-converting strided copy
// (cast, contiguous copies, concat and slice_scatter writes). One kernel per dtype; the op
// is a uniform switch inside, which keeps nvcc's work (and the build) small.
#include "backends/cuda/device.cuh"

namespace hetrain::cuda {

namespace {

/// Offsets of element i in each of the first N operands of it.
template <int N>
__device__ __forceinline__ void offsets(const Iter& it, int64_t i, int64_t (&off)[N]) {
  if (it.contiguous) {
    for (int k = 0; k < N; ++k) off[k] = i;
    return;
  }
  for (int k = 0; k < N; ++k) off[k] = 0;
  for (int d = it.ndim - 1; d >= 0; --d) {
    const int64_t s = it.shape[d];
    const int64_t q = i / s, r = i - q * s;
    for (int k = 0; k < N; ++k) off[k] += r * it.strides[k][d];
    i = q;
  }
}

template <class C>
__device__ __forceinline__ C sigmoid(C x) {
  // Stable for large |x|, as the CPU's SigmoidOp.
  if (x >= C(0)) return C(1) / (C(1) + d_exp(-x));
  const C e = d_exp(x);
  return e / (C(1) + e);
}

template <class C>
__device__ __forceinline__ C unary_f(UnaryOp op, C x) {
  switch (op) {
    case UnaryOp::neg:
      return -x;
    case UnaryOp::abs:
      return x < C(0) ? -x : x;
    case UnaryOp::square:
      return x * x;
    case UnaryOp::relu:
      return x > C(0) ? x : C(0);
    default:
      break;
  }
  if constexpr (std::is_floating_point_v<C>) {
    switch (op) {
      case UnaryOp::exp:
        return d_exp(x);
      case UnaryOp::log:
        return d_log(x);
      case UnaryOp::sqrt:
        return d_sqrt(x);
      case UnaryOp::rsqrt:
        return C(1) / d_sqrt(x);
      case UnaryOp::tanh:
        return d_tanh(x);
      case UnaryOp::sigmoid:
        return sigmoid(x);
      case UnaryOp::gelu:
        return C(0.5) * x * (C(1) + d_erf(x * C(0.70710678118654752440)));
      case UnaryOp::gelu_tanh: {
        const C k = C(0.79788456080286535588);  // sqrt(2/pi)
        return C(0.5) * x * (C(1) + d_tanh(k * (x + C(0.044715) * x * x * x)));
      }
      case UnaryOp::erf:
        return d_erf(x);
      case UnaryOp::silu:
        return x * sigmoid(x);
      default:
        break;
    }
  }
  return x;  // unreachable: the host rejects float-only ops on integers
}

template <class T>
__global__ void unary_kernel(UnaryOp op, Iter it, T* __restrict__ y, const T* __restrict__ x) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < it.numel;
       i += int64_t{gridDim.x} * blockDim.x) {
    int64_t off[2];
    offsets<2>(it, i, off);
    y[off[0]] = store<T>(unary_f(op, load(x[off[1]])));
  }
}

template <class C>
__device__ __forceinline__ C binary_f(BinaryOp op, C a, C b) {
  switch (op) {
    case BinaryOp::add:
      return a + b;
    case BinaryOp::sub:
      return a - b;
    case BinaryOp::mul:
      return a * b;
    case BinaryOp::div:
      if constexpr (std::is_integral_v<C>) {
        return b == C(0) ? C(0) : a / b;  // integer division by zero gives 0 (as the CPU)
      } else {
        return a / b;
      }
    case BinaryOp::pow:
      if constexpr (std::is_floating_point_v<C>) {
        return d_pow(a, b);
      } else {
        return a;  // unreachable: pow is float-only
      }
    case BinaryOp::maximum:
      return a >= b ? a : b;
    case BinaryOp::minimum:
      return a <= b ? a : b;
    case BinaryOp::relu_backward:
      return a > C(0) ? b : C(0);
    case BinaryOp::gelu_tanh_backward:  // as GeluTanhGradOp::f (graph/prims/elementwise.h)
      if constexpr (std::is_floating_point_v<C>) {
        const C k = C(0.79788456080286535588), c = C(0.044715);
        const C u = k * (a + c * a * a * a), du = k * (C(1) + C(3) * c * a * a);
        const C e = exp(C(-2) * fabs(u)), p = C(1) / (C(1) + e), q = e * p;
        return b * ((u >= C(0) ? p : q) + C(2) * a * p * q * du);
      } else {
        return a;  // unreachable: float-only
      }
    default:
      return a;
  }
}
template <class C>
__device__ __forceinline__ bool compare_f(BinaryOp op, C a, C b) {
  switch (op) {
    case BinaryOp::equal:
      return a == b;
    case BinaryOp::not_equal:
      return a != b;
    case BinaryOp::less:
      return a < b;
    case BinaryOp::less_equal:
      return a <= b;
    case BinaryOp::greater:
      return a > b;
    case BinaryOp::greater_equal:
      return a >= b;
    default:
      return false;
  }
}

template <class T>
__global__ void binary_kernel(BinaryOp op, Iter it, T* __restrict__ y, const T* __restrict__ a,
                              const T* __restrict__ b) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < it.numel;
       i += int64_t{gridDim.x} * blockDim.x) {
    int64_t off[3];
    offsets<3>(it, i, off);
    y[off[0]] = store<T>(binary_f(op, load(a[off[1]]), load(b[off[2]])));
  }
}

template <class T>
__global__ void compare_kernel(BinaryOp op, Iter it, bool* __restrict__ y, const T* __restrict__ a,
                               const T* __restrict__ b) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < it.numel;
       i += int64_t{gridDim.x} * blockDim.x) {
    int64_t off[3];
    offsets<3>(it, i, off);
    y[off[0]] = compare_f(op, load(a[off[1]]), load(b[off[2]]));
  }
}

template <class T>
__global__ void where_kernel(Iter it, T* __restrict__ y, const bool* __restrict__ c,
                             const T* __restrict__ a, const T* __restrict__ b) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < it.numel;
       i += int64_t{gridDim.x} * blockDim.x) {
    int64_t off[4];
    offsets<4>(it, i, off);
    y[off[0]] = c[off[1]] ? a[off[2]] : b[off[3]];
  }
}

template <class S, class D>
__global__ void cast_kernel(Iter it, D* __restrict__ y, const S* __restrict__ x) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < it.numel;
       i += int64_t{gridDim.x} * blockDim.x) {
    int64_t off[2];
    offsets<2>(it, i, off);
    if constexpr (std::is_same_v<S, D>) {
      y[off[0]] = x[off[1]];
    } else {
      y[off[0]] = store<D>(load(x[off[1]]));
    }
  }
}

constexpr int kThreads = 256;

}  // namespace

void launch_unary(UnaryOp op, Dtype dt, const Iter& it, void* y, const void* x, cudaStream_t s) {
  if (it.numel == 0) return;
  dispatch_device(dt, "unary", [&]<class T>() {
    if constexpr (std::is_same_v<T, bool>) {
      fail("[unary] no CUDA kernel for bool tensors");
    } else {
      unary_kernel<T><<<grid_for(it.numel, kThreads), kThreads, 0, s>>>(op, it, static_cast<T*>(y),
                                                                        static_cast<const T*>(x));
      HT_CUDA_CHECK_LAUNCH("unary_kernel");
    }
  });
}

void launch_binary(BinaryOp op, Dtype dt, const Iter& it, void* y, const void* a, const void* b,
                   cudaStream_t s) {
  if (it.numel == 0) return;
  dispatch_device(dt, "binary", [&]<class T>() {
    if (is_compare(op)) {
      compare_kernel<T><<<grid_for(it.numel, kThreads), kThreads, 0, s>>>(
          op, it, static_cast<bool*>(y), static_cast<const T*>(a), static_cast<const T*>(b));
      HT_CUDA_CHECK_LAUNCH("compare_kernel");
      return;
    }
    if constexpr (std::is_same_v<T, bool>) {
      fail("[binary] no CUDA kernel for arithmetic on bool tensors");
    } else {
      binary_kernel<T><<<grid_for(it.numel, kThreads), kThreads, 0, s>>>(
          op, it, static_cast<T*>(y), static_cast<const T*>(a), static_cast<const T*>(b));
      HT_CUDA_CHECK_LAUNCH("binary_kernel");
    }
  });
}

void launch_where(Dtype dt, const Iter& it, void* y, const void* c, const void* a, const void* b,
                  cudaStream_t s) {
  if (it.numel == 0) return;
  dispatch_device(dt, "where", [&]<class T>() {
    where_kernel<T><<<grid_for(it.numel, kThreads), kThreads, 0, s>>>(
        it, static_cast<T*>(y), static_cast<const bool*>(c), static_cast<const T*>(a),
        static_cast<const T*>(b));
    HT_CUDA_CHECK_LAUNCH("where_kernel");
  });
}

void launch_cast(Dtype dx, Dtype dy, const Iter& it, void* y, const void* x, cudaStream_t s) {
  if (it.numel == 0) return;
  dispatch_device(dx, "cast", [&]<class S>() {
    dispatch_device(dy, "cast", [&]<class D>() {
      cast_kernel<S, D><<<grid_for(it.numel, kThreads), kThreads, 0, s>>>(it, static_cast<D*>(y),
                                                                          static_cast<const S*>(x));
      HT_CUDA_CHECK_LAUNCH("cast_kernel");
    });
  });
}

}  // namespace hetrain::cuda
