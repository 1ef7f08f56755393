// Batch norm over (N, H, W) of contiguous NCHW arrays with batch statistics, forward and
// backward (semantics of backends/cpu/eval_norm2d.cpp). Each channel's M = N * HW values are split
// into chunks; a block reduces one (channel, chunk) pair with block_sum, then a thread per
// channel adds that channel's chunk sums in order (deterministic) and computes the channel's
// scalars in f64, as the CPU kernel does; a last elementwise pass writes y or dx. Sums in f32
// (f64 for f64).
#include "backends/cuda/device.cuh"

namespace hetrain::cuda {

namespace {

constexpr int kThreads = 256;
/// About this many values per block, and at most kMaxChunks blocks per channel.
constexpr int64_t kChunkValues = 8192;
constexpr int64_t kMaxChunks = 32;

int64_t chunks_of(const BatchNormDims& d) {
  const int64_t c = (d.N * d.HW + kChunkValues - 1) / kChunkValues;
  return c < 1 ? 1 : (c > kMaxChunks ? kMaxChunks : c);
}

enum class BnSums : uint8_t { x, squared_deviation, grad };

/// Sums over chunk blockIdx.y of channel blockIdx.x (values [k * per, (k + 1) * per) of its
/// N * HW, image-major): sum x, sum (x - mean)^2, or sum g and sum g (x - mean) (grad), into
/// p0 (and p1) at c * chunks + k.
/// The forward's pre-activation x * scale + shift, one explicit fma in the forward and in the
/// backward's relu mask so that both round alike whatever the compiler contracts.
template <class A>
__device__ A bn_pre(A x, A scale, A shift) {
  return fma(x, scale, shift);
}

/// With `relu` (grad sums only), g is zeroed where bn_pre(x) <= 0; scale and shift per channel.
template <class T, BnSums K, bool Relu = false>
__global__ void bn_partial_kernel(BatchNormDims d, int64_t per, acc_of<T>* __restrict__ p0,
                                  acc_of<T>* __restrict__ p1, const T* __restrict__ x,
                                  const T* __restrict__ g, const acc_of<T>* __restrict__ mean,
                                  const acc_of<T>* __restrict__ scale = nullptr,
                                  const acc_of<T>* __restrict__ shift = nullptr) {
  using A = acc_of<T>;
  __shared__ A shared[32];
  const int64_t c = blockIdx.x, k = blockIdx.y, m = d.N * d.HW;
  const int64_t j0 = k * per, j1 = j0 + per < m ? j0 + per : m;
  const A mu = K == BnSums::x ? A(0) : mean[c];
  A s0 = 0, s1 = 0;
  for (int64_t j = j0 + threadIdx.x; j < j1; j += blockDim.x) {
    const int64_t n = j / d.HW;
    const int64_t off = (n * d.C + c) * d.HW + (j - n * d.HW);
    const A v = load(x[off]);
    if constexpr (K == BnSums::x) {
      s0 += v;
    } else if constexpr (K == BnSums::squared_deviation) {
      s0 += (v - mu) * (v - mu);
    } else {
      A gv = load(g[off]);
      if constexpr (Relu)
        if (!(bn_pre(v, scale[c], shift[c]) > A(0))) gv = A(0);
      s0 += gv;
      s1 += gv * (v - mu);
    }
  }
  s0 = block_sum(s0, shared);
  if constexpr (K == BnSums::grad) s1 = block_sum(s1, shared);
  if (threadIdx.x == 0) {
    p0[c * gridDim.y + k] = s0;
    if constexpr (K == BnSums::grad) p1[c * gridDim.y + k] = s1;
  }
}

/// The chunk sums of one channel, added in chunk order.
template <class A>
__device__ double chunk_sum(const A* p, int64_t chunks) {
  double s = 0;
  for (int64_t k = 0; k < chunks; ++k) s += static_cast<double>(p[k]);
  return s;
}

template <class T>
__global__ void bn_mean_kernel(BatchNormDims d, int64_t chunks, acc_of<T>* __restrict__ mean,
                               const acc_of<T>* __restrict__ p0) {
  using A = acc_of<T>;
  const double m = static_cast<double>(d.N * d.HW);
  for (int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; c < d.C;
       c += int64_t{gridDim.x} * blockDim.x)
    mean[c] = static_cast<A>(chunk_sum(p0 + c * chunks, chunks) / m);
}

/// y's per-channel scale w / sqrt(var + eps) and shift b - mean * scale, with var as stored (the
/// CPU's BnAffine).
template <class T>
__device__ void affine(int64_t c, double eps, acc_of<T>* scale, acc_of<T>* shift,
                       const acc_of<T>* mean, const acc_of<T>* var, const T* w, const T* b) {
  using A = acc_of<T>;
  const A sc =
      static_cast<A>(static_cast<double>(load(w[c])) / sqrt(static_cast<double>(var[c]) + eps));
  scale[c] = sc;
  shift[c] = load(b[c]) - mean[c] * sc;
}

/// var, and y's per-channel scale and shift.
template <class T>
__global__ void bn_scale_kernel(BatchNormDims d, int64_t chunks, double eps,
                                acc_of<T>* __restrict__ var, acc_of<T>* __restrict__ scale,
                                acc_of<T>* __restrict__ shift, const acc_of<T>* __restrict__ mean,
                                const acc_of<T>* __restrict__ p0, const T* __restrict__ w,
                                const T* __restrict__ b) {
  using A = acc_of<T>;
  const double m = static_cast<double>(d.N * d.HW);
  for (int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; c < d.C;
       c += int64_t{gridDim.x} * blockDim.x) {
    var[c] = static_cast<A>(chunk_sum(p0 + c * chunks, chunks) / m);
    affine(c, eps, scale, shift, mean, var, w, b);
  }
}

/// scale and shift of channels in a grid-stride loop, from the stored mean and var (the backward's
/// relu mask recomputes the forward's pre-activation with them).
template <class T>
__global__ void bn_affine_kernel(BatchNormDims d, double eps, acc_of<T>* __restrict__ scale,
                                 acc_of<T>* __restrict__ shift, const acc_of<T>* __restrict__ mean,
                                 const acc_of<T>* __restrict__ var, const T* __restrict__ w,
                                 const T* __restrict__ b) {
  for (int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; c < d.C;
       c += int64_t{gridDim.x} * blockDim.x)
    affine(c, eps, scale, shift, mean, var, w, b);
}

template <class T, bool Relu>
__global__ void bn_apply_kernel(BatchNormDims d, T* __restrict__ y, const T* __restrict__ x,
                                const acc_of<T>* __restrict__ scale,
                                const acc_of<T>* __restrict__ shift) {
  using A = acc_of<T>;
  const int64_t total = d.N * d.C * d.HW;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < total;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t c = (e / d.HW) % d.C;
    const A v = bn_pre(load(x[e]), scale[c], shift[c]);
    y[e] = store<T>(Relu ? (v > A(0) ? v : A(0)) : v);
  }
}

/// db, dw, and dx's per-channel k = w * invstd, gmean = db / M, proj = dw * invstd / M.
template <class T>
__global__ void bn_backward_scalars_kernel(
    BatchNormDims d, int64_t chunks, double eps, T* __restrict__ dw, T* __restrict__ db,
    acc_of<T>* __restrict__ k, acc_of<T>* __restrict__ gmean, acc_of<T>* __restrict__ proj,
    const acc_of<T>* __restrict__ var, const acc_of<T>* __restrict__ p0,
    const acc_of<T>* __restrict__ p1, const T* __restrict__ w) {
  using A = acc_of<T>;
  const double m = static_cast<double>(d.N * d.HW);
  for (int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; c < d.C;
       c += int64_t{gridDim.x} * blockDim.x) {
    const double invstd = 1.0 / sqrt(static_cast<double>(var[c]) + eps);
    const double sg = chunk_sum(p0 + c * chunks, chunks), sgx = chunk_sum(p1 + c * chunks, chunks);
    db[c] = store<T>(static_cast<A>(sg));
    dw[c] = store<T>(static_cast<A>(sgx * invstd));
    k[c] = static_cast<A>(static_cast<double>(load(w[c])) * invstd);
    gmean[c] = static_cast<A>(sg / m);
    proj[c] = static_cast<A>(sgx * invstd * invstd / m);
  }
}

template <class T, bool Relu>
__global__ void bn_backward_apply_kernel(
    BatchNormDims d, T* __restrict__ dx, const T* __restrict__ x, const T* __restrict__ g,
    const acc_of<T>* __restrict__ mean, const acc_of<T>* __restrict__ k,
    const acc_of<T>* __restrict__ gmean, const acc_of<T>* __restrict__ proj,
    const acc_of<T>* __restrict__ scale, const acc_of<T>* __restrict__ shift) {
  using A = acc_of<T>;
  const int64_t total = d.N * d.C * d.HW;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < total;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t c = (e / d.HW) % d.C;
    const A xv = load(x[e]);
    A gv = load(g[e]);
    if constexpr (Relu)
      if (!(bn_pre(xv, scale[c], shift[c]) > A(0))) gv = A(0);
    dx[e] = store<T>(k[c] * (gv - gmean[c] - (xv - mean[c]) * proj[c]));
  }
}

dim3 partial_grid(const BatchNormDims& d, int64_t chunks) {
  HT_ASSERT(d.C <= int64_t{0x7fffffff});
  return dim3(static_cast<unsigned>(d.C), static_cast<unsigned>(chunks));
}

}  // namespace

int64_t batch_norm_workspace(const BatchNormDims& d) { return (2 * chunks_of(d) + 5) * d.C; }

void launch_batch_norm(Dtype dt, const BatchNormDims& d, double eps, bool relu, void* y, void* mean,
                       void* var, void* workspace, const void* x, const void* w, const void* b,
                       cudaStream_t s) {
  if (d.C == 0 || d.N * d.HW == 0) return;
  const int64_t chunks = chunks_of(d), per = (d.N * d.HW + chunks - 1) / chunks;
  dispatch_device_float(dt, "batch_norm2d", [&]<class T>() {
    using A = acc_of<T>;
    const T* xp = static_cast<const T*>(x);
    A* mp = static_cast<A*>(mean);
    A* partial = static_cast<A*>(workspace);
    A* scale = partial + 2 * chunks * d.C;
    A* shift = scale + d.C;
    const dim3 grid = partial_grid(d, chunks);
    bn_partial_kernel<T, BnSums::x>
        <<<grid, kThreads, 0, s>>>(d, per, partial, nullptr, xp, nullptr, nullptr);
    HT_CUDA_CHECK_LAUNCH("bn_partial_kernel");
    bn_mean_kernel<T><<<grid_for(d.C, kThreads), kThreads, 0, s>>>(d, chunks, mp, partial);
    HT_CUDA_CHECK_LAUNCH("bn_mean_kernel");
    // Second pass, squared deviations from the mean: stable when |mean| >> std.
    A* partial_sq = partial + chunks * d.C;
    bn_partial_kernel<T, BnSums::squared_deviation>
        <<<grid, kThreads, 0, s>>>(d, per, partial_sq, nullptr, xp, nullptr, mp);
    HT_CUDA_CHECK_LAUNCH("bn_partial_kernel");
    bn_scale_kernel<T><<<grid_for(d.C, kThreads), kThreads, 0, s>>>(
        d, chunks, eps, static_cast<A*>(var), scale, shift, mp, partial_sq,
        static_cast<const T*>(w), static_cast<const T*>(b));
    HT_CUDA_CHECK_LAUNCH("bn_scale_kernel");
    const int64_t total = d.N * d.C * d.HW;
    if (relu)
      bn_apply_kernel<T, true>
          <<<grid_for(total, kThreads), kThreads, 0, s>>>(d, static_cast<T*>(y), xp, scale, shift);
    else
      bn_apply_kernel<T, false>
          <<<grid_for(total, kThreads), kThreads, 0, s>>>(d, static_cast<T*>(y), xp, scale, shift);
    HT_CUDA_CHECK_LAUNCH("bn_apply_kernel");
  });
}

void launch_batch_norm_backward(Dtype dt, const BatchNormDims& d, double eps, bool relu, void* dx,
                                void* dw, void* db, void* workspace, const void* x,
                                const void* mean, const void* var, const void* g, const void* w,
                                const void* b, cudaStream_t s) {
  if (d.C == 0 || d.N * d.HW == 0) return;
  const int64_t chunks = chunks_of(d), per = (d.N * d.HW + chunks - 1) / chunks;
  dispatch_device_float(dt, "batch_norm2d_backward", [&]<class T>() {
    using A = acc_of<T>;
    const T *xp = static_cast<const T*>(x), *gp = static_cast<const T*>(g);
    const A* mp = static_cast<const A*>(mean);
    A* p0 = static_cast<A*>(workspace);
    A* p1 = p0 + chunks * d.C;
    A* k = p1 + chunks * d.C;
    A* gmean = k + d.C;
    A* proj = gmean + d.C;
    A* scale = proj + d.C;
    A* shift = scale + d.C;
    const A* vp = static_cast<const A*>(var);
    const T *wp = static_cast<const T*>(w), *bp = static_cast<const T*>(b);
    if (relu) {
      bn_affine_kernel<T>
          <<<grid_for(d.C, kThreads), kThreads, 0, s>>>(d, eps, scale, shift, mp, vp, wp, bp);
      HT_CUDA_CHECK_LAUNCH("bn_affine_kernel");
      bn_partial_kernel<T, BnSums::grad, true>
          <<<partial_grid(d, chunks), kThreads, 0, s>>>(d, per, p0, p1, xp, gp, mp, scale, shift);
    } else {
      bn_partial_kernel<T, BnSums::grad>
          <<<partial_grid(d, chunks), kThreads, 0, s>>>(d, per, p0, p1, xp, gp, mp);
    }
    HT_CUDA_CHECK_LAUNCH("bn_partial_kernel");
    bn_backward_scalars_kernel<T><<<grid_for(d.C, kThreads), kThreads, 0, s>>>(
        d, chunks, eps, static_cast<T*>(dw), static_cast<T*>(db), k, gmean, proj, vp, p0, p1, wp);
    HT_CUDA_CHECK_LAUNCH("bn_backward_scalars_kernel");
    const int64_t total = d.N * d.C * d.HW;
    if (relu)
      bn_backward_apply_kernel<T, true><<<grid_for(total, kThreads), kThreads, 0, s>>>(
          d, static_cast<T*>(dx), xp, gp, mp, k, gmean, proj, scale, shift);
    else
      bn_backward_apply_kernel<T, false><<<grid_for(total, kThreads), kThreads, 0, s>>>(
          d, static_cast<T*>(dx), xp, gp, mp, k, gmean, proj, scale, shift);
    HT_CUDA_CHECK_LAUNCH("bn_backward_apply_kernel");
  });
}

}  // namespace hetrain::cuda
