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

/// F(x) where F applies to C; float-only formulas are never launched on integers (the host
/// rejects them), so that case only has to compile.
template <class F, class C>
__device__ __forceinline__ C apply_unary(C x) {
  if constexpr (F::float_only && !std::is_floating_point_v<C>) {
    return x;
  } else {
    return F::f(x);
  }
}

/// The op's formula from backends/scalar_ops.h: one case per entry of its list, generated.
template <class C>
__device__ __forceinline__ C unary_f(UnaryOp op, C x) {
  switch (op) {
#define HETRAIN_CASE(id, F) \
  case UnaryOp::id:         \
    return apply_unary<formulas::F>(x);
    HETRAIN_UNARY_FORMULAS(HETRAIN_CASE)
#undef HETRAIN_CASE
  }
  return x;  // unreachable: every id has its case above
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

template <class F, class C>
__device__ __forceinline__ auto apply_binary(C a, C b) {
  if constexpr (F::float_only && !std::is_floating_point_v<C>) {
    return a;
  } else {
    return F::f(a, b);
  }
}
/// The arithmetic ops (comparisons give 0 here; compare_f has them).
template <class C>
__device__ __forceinline__ C binary_f(BinaryOp op, C a, C b) {
  switch (op) {
#define HETRAIN_CASE(id, F)                                     \
  case BinaryOp::id:                                            \
    if constexpr (formulas::F::is_compare) {                    \
      return C(0); /* unreachable: compare_kernel runs these */ \
    } else {                                                    \
      return apply_binary<formulas::F>(a, b);                   \
    }
    HETRAIN_BINARY_FORMULAS(HETRAIN_CASE)
#undef HETRAIN_CASE
  }
  return a;
}
/// The comparisons.
template <class C>
__device__ __forceinline__ bool compare_f(BinaryOp op, C a, C b) {
  switch (op) {
#define HETRAIN_CASE(id, F)                                     \
  case BinaryOp::id:                                            \
    if constexpr (formulas::F::is_compare) {                    \
      return formulas::F::f(a, b);                              \
    } else {                                                    \
      return false; /* unreachable: binary_kernel runs these */ \
    }
    HETRAIN_BINARY_FORMULAS(HETRAIN_CASE)
#undef HETRAIN_CASE
  }
  return false;
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
