// Reductions (sum, max, min) over any set of axes of a strided array, and argmax.
#include <cfloat>
#include <climits>

#include "backends/cuda/device.cuh"

namespace hetrain::cuda {

namespace {

/// The CPU kernel's identities: lowest()/max() of the accumulator type (so a max over only
/// -inf gives -FLT_MAX there, and here too).
template <class A>
__device__ __forceinline__ A lowest_of() {
  if constexpr (std::is_same_v<A, float>)
    return -FLT_MAX;
  else if constexpr (std::is_same_v<A, double>)
    return -DBL_MAX;
  else if constexpr (std::is_same_v<A, int32_t>)
    return INT_MIN;
  else
    return LLONG_MIN;
}
template <class A>
__device__ __forceinline__ A highest_of() {
  if constexpr (std::is_same_v<A, float>)
    return FLT_MAX;
  else if constexpr (std::is_same_v<A, double>)
    return DBL_MAX;
  else if constexpr (std::is_same_v<A, int32_t>)
    return INT_MAX;
  else
    return LLONG_MAX;
}

template <ReduceOp K, class A>
__device__ __forceinline__ A identity() {
  if constexpr (K == ReduceOp::sum)
    return A(0);
  else if constexpr (K == ReduceOp::max)
    return lowest_of<A>();
  else
    return highest_of<A>();
}
template <ReduceOp K, class A>
__device__ __forceinline__ A combine(A a, A v) {
  if constexpr (K == ReduceOp::sum)
    return a + v;
  else if constexpr (K == ReduceOp::max)
    return (v > a || v != v) ? v : a;  // NaN propagates
  else
    return (v < a || v != v) ? v : a;
}

__device__ __forceinline__ int64_t offset_in(int64_t i, int nd, const int64_t* shape,
                                             const int64_t* strides) {
  int64_t off = 0;
  for (int d = nd - 1; d >= 0; --d) {
    const int64_t q = i / shape[d];
    off += (i - q * shape[d]) * strides[d];
    i = q;
  }
  return off;
}

/// One block per output (grid-stride): the block's threads stride over the reduced
/// elements, then combine through shared memory.
template <class T, ReduceOp K>
__global__ void reduce_rows_kernel(ReduceDims d, T* __restrict__ y, const T* __restrict__ x) {
  using A = compute_of<T>;
  __shared__ A shared[32];
  for (int64_t o = blockIdx.x; o < d.outputs; o += gridDim.x) {
    const T* base = x + offset_in(o, d.kept_ndim, d.kept_shape, d.kept_strides);
    A acc = identity<K, A>();
    for (int64_t r = threadIdx.x; r < d.reduced; r += blockDim.x)
      acc = combine<K, A>(
          acc, static_cast<A>(load(base[offset_in(r, d.red_ndim, d.red_shape, d.red_strides)])));
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int s = 16; s > 0; s >>= 1) acc = combine<K, A>(acc, __shfl_xor_sync(0xffffffffu, acc, s));
    __syncthreads();  // shared is reused across outputs
    if (lane == 0) shared[warp] = acc;
    __syncthreads();
    if (warp == 0) {
      A t = lane < nw ? shared[lane] : identity<K, A>();
      for (int s = 16; s > 0; s >>= 1) t = combine<K, A>(t, __shfl_xor_sync(0xffffffffu, t, s));
      if (lane == 0) y[o] = store<T>(t);
    }
  }
}

/// One thread per output, the reduced elements in order (coalesced when the kept inner
/// dimension is contiguous).
template <class T, ReduceOp K>
__global__ void reduce_cols_kernel(ReduceDims d, T* __restrict__ y, const T* __restrict__ x) {
  using A = compute_of<T>;
  for (int64_t o = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; o < d.outputs;
       o += int64_t{gridDim.x} * blockDim.x) {
    const T* base = x + offset_in(o, d.kept_ndim, d.kept_shape, d.kept_strides);
    A acc = identity<K, A>();
    for (int64_t r = 0; r < d.reduced; ++r)
      acc = combine<K, A>(
          acc, static_cast<A>(load(base[offset_in(r, d.red_ndim, d.red_shape, d.red_strides)])));
    y[o] = store<T>(acc);
  }
}

template <class T>
__global__ void argmax_kernel(int64_t O, int64_t R, int64_t I, int64_t* __restrict__ y,
                              const T* __restrict__ x) {
  for (int64_t t = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; t < O * I;
       t += int64_t{gridDim.x} * blockDim.x) {
    const int64_t o = t / I, i = t - o * I;
    const T* base = x + o * R * I + i;
    auto best = load(base[0]);
    int64_t bi = 0;
    for (int64_t r = 1; r < R; ++r) {
      const auto v = load(base[r * I]);
      if (best != best) break;  // NaN is the maximum, the first one wins
      if (v > best || v != v) {
        best = v;
        bi = r;
      }
    }
    y[t] = bi;
  }
}

}  // namespace

void launch_reduce(ReduceOp op, Dtype dt, const ReduceDims& d, void* y, const void* x,
                   cudaStream_t s) {
  if (d.outputs == 0) return;
  // Long reductions whose elements are adjacent (or too few outputs to fill the GPU) get a
  // block per output; the rest a thread per output.
  const bool inner_reduced = d.red_ndim > 0 && d.red_strides[d.red_ndim - 1] == 1;
  const bool rows = d.reduced >= 128 && (inner_reduced || d.outputs < 8192);
  dispatch_device(dt, "reduce", [&]<class T>() {
    if constexpr (std::is_same_v<T, bool>) {
      fail("[reduce] does not support dtype bool");
    } else {
      auto go = [&]<ReduceOp K>() {
        if (rows) {
          const unsigned blocks = static_cast<unsigned>(d.outputs < 65535 ? d.outputs : 65535);
          reduce_rows_kernel<T, K>
              <<<blocks, 256, 0, s>>>(d, static_cast<T*>(y), static_cast<const T*>(x));
          HT_CUDA_CHECK_LAUNCH("reduce_rows_kernel");
        } else {
          reduce_cols_kernel<T, K><<<grid_for(d.outputs, 256), 256, 0, s>>>(
              d, static_cast<T*>(y), static_cast<const T*>(x));
          HT_CUDA_CHECK_LAUNCH("reduce_cols_kernel");
        }
      };
      switch (op) {
        case ReduceOp::sum:
          go.template operator()<ReduceOp::sum>();
          break;
        case ReduceOp::max:
          go.template operator()<ReduceOp::max>();
          break;
        case ReduceOp::min:
          go.template operator()<ReduceOp::min>();
          break;
      }
    }
  });
}

void launch_argmax(Dtype dt, int64_t O, int64_t R, int64_t I, int64_t* y, const void* x,
                   cudaStream_t s) {
  if (O * I == 0) return;
  dispatch_device(dt, "argmax", [&]<class T>() {
    if constexpr (std::is_same_v<T, bool>) {
      fail("[argmax] does not support dtype bool");
    } else {
      argmax_kernel<T><<<grid_for(O * I, 256), 256, 0, s>>>(O, R, I, y, static_cast<const T*>(x));
      HT_CUDA_CHECK_LAUNCH("argmax_kernel");
    }
  });
}

}  // namespace hetrain::cuda
