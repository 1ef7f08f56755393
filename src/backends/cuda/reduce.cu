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

/// One block per output and chunk of its reduced elements (grid-stride over outputs): the
/// block's threads stride over the chunk, then combine through shared memory. With one chunk
/// (gridDim.y == 1) the result goes to y, else the chunk's partial to part[chunk * outputs + o]
/// (reduce_partials_kernel finishes), so that a few long reductions (a norm's sum of squares
/// to one number) still fill the GPU.
template <class T, ReduceOp K, class A>
__global__ void reduce_rows_kernel(ReduceDims d, int64_t per_chunk, T* __restrict__ y,
                                   A* __restrict__ part, const T* __restrict__ x) {
  __shared__ A shared[32];
  const int64_t r0 = blockIdx.y * per_chunk;
  const int64_t r1 = r0 + per_chunk < d.reduced ? r0 + per_chunk : d.reduced;
  const bool one_axis = d.red_ndim == 1;  // no index arithmetic per element
  for (int64_t o = blockIdx.x; o < d.outputs; o += gridDim.x) {
    const T* base = x + offset_in(o, d.kept_ndim, d.kept_shape, d.kept_strides);
    A acc = identity<K, A>();
    for (int64_t r = r0 + threadIdx.x; r < r1; r += blockDim.x)
      acc = combine<K, A>(
          acc, static_cast<A>(
                   load(base[one_axis ? r * d.red_strides[0]
                                      : offset_in(r, d.red_ndim, d.red_shape, d.red_strides)])));
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int s = 16; s > 0; s >>= 1) acc = combine<K, A>(acc, __shfl_xor_sync(0xffffffffu, acc, s));
    __syncthreads();  // shared is reused across outputs
    if (lane == 0) shared[warp] = acc;
    __syncthreads();
    if (warp == 0) {
      A t = lane < nw ? shared[lane] : identity<K, A>();
      for (int s = 16; s > 0; s >>= 1) t = combine<K, A>(t, __shfl_xor_sync(0xffffffffu, t, s));
      if (lane == 0) {
        if (gridDim.y == 1)
          y[o] = store<T>(t);
        else
          part[blockIdx.y * d.outputs + o] = t;
      }
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

/// Down columns: the kept index is contiguous (o), one reduced axis of stride rs (r). Block
/// (32, 8): the x threads read 32 adjacent columns (coalesced), the y threads stride over
/// rows [r0, r1) of the block's chunk; the 8 partials of a column combine in a fixed order.
/// With one chunk (gridDim.y == 1) the result goes to y, else the chunk's partial to
/// part[chunk * outputs + o] (reduce_partials_kernel finishes).
template <class T, ReduceOp K, class A>
__global__ void reduce_columns_kernel(int64_t outputs, int64_t reduced, int64_t rs,
                                      int64_t rows_per_chunk, T* __restrict__ y,
                                      A* __restrict__ part, const T* __restrict__ x) {
  __shared__ A partial[8][33];
  const int64_t o = blockIdx.x * int64_t{32} + threadIdx.x;
  const int64_t r0 = blockIdx.y * rows_per_chunk;
  const int64_t r1 = r0 + rows_per_chunk < reduced ? r0 + rows_per_chunk : reduced;
  A acc = identity<K, A>();
  if (o < outputs) {
    int64_t r = r0 + threadIdx.y;
    // Four loads in flight per thread, combined in row order.
    for (; r + 24 < r1; r += 32) {
      const A v0 = static_cast<A>(load(x[r * rs + o]));
      const A v1 = static_cast<A>(load(x[(r + 8) * rs + o]));
      const A v2 = static_cast<A>(load(x[(r + 16) * rs + o]));
      const A v3 = static_cast<A>(load(x[(r + 24) * rs + o]));
      acc = combine<K, A>(combine<K, A>(combine<K, A>(combine<K, A>(acc, v0), v1), v2), v3);
    }
    for (; r < r1; r += 8) acc = combine<K, A>(acc, static_cast<A>(load(x[r * rs + o])));
  }
  partial[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && o < outputs) {
    A t = partial[0][threadIdx.x];
    for (int k = 1; k < 8; ++k) t = combine<K, A>(t, partial[k][threadIdx.x]);
    if (gridDim.y == 1)
      y[o] = store<T>(t);
    else
      part[blockIdx.y * outputs + o] = t;
  }
}

/// y[o] = the chunks' partials of column o combined in chunk order.
template <class T, ReduceOp K, class A>
__global__ void reduce_partials_kernel(int64_t outputs, int chunks, T* __restrict__ y,
                                       const A* __restrict__ part) {
  for (int64_t o = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; o < outputs;
       o += int64_t{gridDim.x} * blockDim.x) {
    A t = part[o];
    for (int c = 1; c < chunks; ++c) t = combine<K, A>(t, part[c * outputs + o]);
    y[o] = store<T>(t);
  }
}

/// The column layout reduce_columns_kernel takes: one kept axis, contiguous, and one reduced
/// axis (Reduce::eval_cuda merges adjacent axes first).
bool columns_layout(const ReduceDims& d) {
  return d.kept_ndim == 1 && d.kept_strides[0] == 1 && d.red_ndim == 1 && d.reduced > 1;
}

/// Chunks of the reduced elements for `blocks` blocks per chunk: enough blocks to fill a large
/// GPU (about 512), each chunk at least `least` elements. A function of the shape alone, so a
/// result does not depend on the GPU.
int64_t chunks_for(int64_t blocks, int64_t reduced, int64_t least) {
  const int64_t chunks = (512 + blocks - 1) / blocks;
  const int64_t most = (reduced + least - 1) / least;
  return chunks < most ? chunks : most;
}
int64_t column_chunks(const ReduceDims& d) {
  return chunks_for((d.outputs + 31) / 32, d.reduced, 256);
}

/// Whether a reduction takes the block-per-output kernel: long reductions whose elements are
/// adjacent, or too few outputs to fill the GPU with a thread each.
bool rows_layout(const ReduceDims& d) {
  const bool inner_reduced = d.red_ndim > 0 && d.red_strides[d.red_ndim - 1] == 1;
  return !columns_layout(d) && d.reduced >= 128 && (inner_reduced || d.outputs < 8192);
}
int64_t row_chunks(const ReduceDims& d) {
  return d.outputs >= 512 ? 1 : chunks_for(d.outputs, d.reduced, 4096);
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

size_t reduce_workspace_bytes(const ReduceDims& d) {
  if (d.outputs == 0) return 0;
  const int64_t chunks = columns_layout(d) ? column_chunks(d) : rows_layout(d) ? row_chunks(d) : 1;
  return chunks > 1 ? static_cast<size_t>(chunks * d.outputs) * sizeof(double) : 0;
}

void launch_reduce(ReduceOp op, Dtype dt, const ReduceDims& d, void* y, const void* x,
                   void* workspace, cudaStream_t s) {
  if (d.outputs == 0) return;
  // Columns: a warp per 32 adjacent outputs; long reductions whose elements are adjacent (or
  // too few outputs to fill the GPU): a block per output; the rest: a thread per output.
  const bool columns = columns_layout(d), rows = rows_layout(d);
  dispatch_device(dt, "reduce", [&]<class T>() {
    if constexpr (std::is_same_v<T, bool>) {
      fail("[reduce] does not support dtype bool");
    } else {
      auto go = [&]<ReduceOp K>() {
        if (columns) {
          using A = compute_of<T>;
          const int64_t chunks = column_chunks(d);
          const int64_t per = (d.reduced + chunks - 1) / chunks;
          if (chunks > 1 && !workspace) fail("[reduce] internal: no workspace for the partials");
          const dim3 grid(static_cast<unsigned>((d.outputs + 31) / 32),
                          static_cast<unsigned>(chunks));
          reduce_columns_kernel<T, K, A><<<grid, dim3(32, 8), 0, s>>>(
              d.outputs, d.reduced, d.red_strides[0], per, static_cast<T*>(y),
              static_cast<A*>(workspace), static_cast<const T*>(x));
          HT_CUDA_CHECK_LAUNCH("reduce_columns_kernel");
          if (chunks > 1) {
            reduce_partials_kernel<T, K, A><<<grid_for(d.outputs, 256), 256, 0, s>>>(
                d.outputs, static_cast<int>(chunks), static_cast<T*>(y),
                static_cast<const A*>(workspace));
            HT_CUDA_CHECK_LAUNCH("reduce_partials_kernel");
          }
        } else if (rows) {
          using A = compute_of<T>;
          const int64_t chunks = row_chunks(d);
          const int64_t per = (d.reduced + chunks - 1) / chunks;
          if (chunks > 1 && !workspace) fail("[reduce] internal: no workspace for the partials");
          const dim3 grid(static_cast<unsigned>(d.outputs < 65535 ? d.outputs : 65535),
                          static_cast<unsigned>(chunks));
          reduce_rows_kernel<T, K, A><<<grid, 256, 0, s>>>(
              d, per, static_cast<T*>(y), static_cast<A*>(workspace), static_cast<const T*>(x));
          HT_CUDA_CHECK_LAUNCH("reduce_rows_kernel");
          if (chunks > 1) {
            reduce_partials_kernel<T, K, A><<<grid_for(d.outputs, 256), 256, 0, s>>>(
                d.outputs, static_cast<int>(chunks), static_cast<T*>(y),
                static_cast<const A*>(workspace));
            HT_CUDA_CHECK_LAUNCH("reduce_partials_kernel");
          }
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
