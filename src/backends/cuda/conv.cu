// Convolution and pooling kernels over contiguous NCHW planes: im2col and its adjoint col2im
// (the GEMMs are cuBLASLt's, see conv.cpp), max and average pooling forward and backward.
// Semantics follow backends/cpu/eval_conv.cpp; the backward kernels gather (a thread per input
// pixel sums the outputs that read it, in output order), so they need no atomics and give
// the same sums on every run.
#include "backends/cuda/device.cuh"

namespace hetrain::cuda {

namespace {

constexpr int kThreads = 256;

/// First output index o >= 0 whose window [o * s - p, o * s - p + k) reaches input index i,
/// and one past the last such index below n.
struct OutRange {
  int64_t lo, hi;
};
__device__ __forceinline__ OutRange covering(int64_t i, int64_t k, int64_t s, int64_t p,
                                             int64_t n) {
  const int64_t first = i + p - k + 1;  // o * s >= first
  const int64_t lo = first <= 0 ? 0 : (first + s - 1) / s;
  const int64_t last = (i + p) / s;  // o * s <= i + p (i + p >= 0)
  return {lo, last + 1 < n ? last + 1 : n};
}

template <class T>
__global__ void im2col_kernel(ConvDims d, int64_t nb, ColumnLayout l, T* __restrict__ col,
                              const T* __restrict__ x) {
  const int64_t howo = d.Ho * d.Wo, rows = d.C * d.kh * d.kw;
  const int64_t total = nb * rows * howo;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < total;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t p = e % howo, t = e / howo;
    const int64_t r = t % rows, n = t / rows;
    const int64_t ow = p % d.Wo, oh = p / d.Wo;
    const int64_t j = r % d.kw, ci = r / d.kw;
    const int64_t i = ci % d.kh, c = ci / d.kh;
    const int64_t ih = oh * d.sh - d.ph + i, iw = ow * d.sw - d.pw + j;
    T v{};  // +0 in every storage type
    if (ih >= 0 && ih < d.H && iw >= 0 && iw < d.W) v = x[((n * d.C + c) * d.H + ih) * d.W + iw];
    col[n * l.image_stride + r * l.row_stride + p] = v;
  }
}

template <class T>
__global__ void col2im_kernel(ConvDims d, int64_t nb, ColumnLayout l, T* __restrict__ dx,
                              const compute_of<T>* __restrict__ col) {
  using C = compute_of<T>;
  const int64_t total = nb * d.C * d.H * d.W;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < total;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t iw = e % d.W, t = e / d.W;
    const int64_t ih = t % d.H, nc = t / d.H;
    const int64_t c = nc % d.C, n = nc / d.C;
    const C* cn = col + n * l.image_stride;
    C acc = 0;
    for (int64_t i = 0; i < d.kh; ++i) {
      const int64_t hs = ih + d.ph - i;  // oh * sh
      if (hs < 0 || hs % d.sh != 0 || hs / d.sh >= d.Ho) continue;
      const int64_t oh = hs / d.sh;
      for (int64_t j = 0; j < d.kw; ++j) {
        const int64_t ws = iw + d.pw - j;  // ow * sw
        if (ws < 0 || ws % d.sw != 0 || ws / d.sw >= d.Wo) continue;
        acc += cn[((c * d.kh + i) * d.kw + j) * l.row_stride + oh * d.Wo + ws / d.sw];
      }
    }
    dx[e] = store<T>(acc);
  }
}

template <class T>
__global__ void max_pool_kernel(ConvDims d, int64_t planes, T* __restrict__ y,
                                int64_t* __restrict__ idx, const T* __restrict__ x) {
  using C = compute_of<T>;
  const int64_t total = planes * d.Ho * d.Wo;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < total;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t ow = e % d.Wo, t = e / d.Wo;
    const int64_t oh = t % d.Ho, pl = t / d.Ho;
    const T* xp = x + pl * d.H * d.W;
    const int64_t h0 = oh * d.sh - d.ph, w0 = ow * d.sw - d.pw;
    const int64_t h1 = h0 + d.kh < d.H ? h0 + d.kh : d.H, w1 = w0 + d.kw < d.W ? w0 + d.kw : d.W;
    C best = -INFINITY;
    int64_t bi = -1;
    bool nan = false;  // the first NaN is the maximum
    for (int64_t ih = h0 < 0 ? 0 : h0; !nan && ih < h1; ++ih)
      for (int64_t iw = w0 < 0 ? 0 : w0; !nan && iw < w1; ++iw) {
        const C v = load(xp[ih * d.W + iw]);
        if (bi < 0 || v > best || v != v) {
          best = v;
          bi = ih * d.W + iw;
          nan = v != v;
        }
      }
    y[e] = store<T>(best);
    idx[e] = bi;
  }
}

template <class T>
__global__ void max_pool_backward_kernel(ConvDims d, int64_t planes, T* __restrict__ dx,
                                         const int64_t* __restrict__ idx, const T* __restrict__ g) {
  using C = compute_of<T>;
  const int64_t total = planes * d.H * d.W;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < total;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t hw = e % (d.H * d.W), pl = e / (d.H * d.W);
    const int64_t ih = hw / d.W, iw = hw - ih * d.W;
    const OutRange rh = covering(ih, d.kh, d.sh, d.ph, d.Ho);
    const OutRange rw = covering(iw, d.kw, d.sw, d.pw, d.Wo);
    const int64_t base = pl * d.Ho * d.Wo;
    C acc = 0;
    for (int64_t oh = rh.lo; oh < rh.hi; ++oh)
      for (int64_t ow = rw.lo; ow < rw.hi; ++ow) {
        const int64_t o = base + oh * d.Wo + ow;
        if (idx[o] == hw) acc += load(g[o]);
      }
    dx[e] = store<T>(acc);
  }
}

template <class T>
__global__ void avg_pool_kernel(ConvDims d, int64_t planes, T* __restrict__ y,
                                const T* __restrict__ x) {
  using C = compute_of<T>;
  const C inv = C(1) / static_cast<C>(d.kh * d.kw);  // padding counts in the divisor
  const int64_t total = planes * d.Ho * d.Wo;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < total;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t ow = e % d.Wo, t = e / d.Wo;
    const int64_t oh = t % d.Ho, pl = t / d.Ho;
    const T* xp = x + pl * d.H * d.W;
    const int64_t h0 = oh * d.sh - d.ph, w0 = ow * d.sw - d.pw;
    const int64_t h1 = h0 + d.kh < d.H ? h0 + d.kh : d.H, w1 = w0 + d.kw < d.W ? w0 + d.kw : d.W;
    C acc = 0;
    for (int64_t ih = h0 < 0 ? 0 : h0; ih < h1; ++ih)
      for (int64_t iw = w0 < 0 ? 0 : w0; iw < w1; ++iw) acc += load(xp[ih * d.W + iw]);
    y[e] = store<T>(acc * inv);
  }
}

template <class T>
__global__ void avg_pool_backward_kernel(ConvDims d, int64_t planes, T* __restrict__ dx,
                                         const T* __restrict__ g) {
  using C = compute_of<T>;
  const C inv = C(1) / static_cast<C>(d.kh * d.kw);
  const int64_t total = planes * d.H * d.W;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < total;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t hw = e % (d.H * d.W), pl = e / (d.H * d.W);
    const int64_t ih = hw / d.W, iw = hw - ih * d.W;
    const OutRange rh = covering(ih, d.kh, d.sh, d.ph, d.Ho);
    const OutRange rw = covering(iw, d.kw, d.sw, d.pw, d.Wo);
    const T* gp = g + pl * d.Ho * d.Wo;
    C acc = 0;
    for (int64_t oh = rh.lo; oh < rh.hi; ++oh)
      for (int64_t ow = rw.lo; ow < rw.hi; ++ow) acc += load(gp[oh * d.Wo + ow]) * inv;
    dx[e] = store<T>(acc);
  }
}

}  // namespace

void launch_im2col(Dtype dt, const ConvDims& d, int64_t nb, const ColumnLayout& l, void* col,
                   const void* x, cudaStream_t s) {
  const int64_t total = nb * d.C * d.kh * d.kw * d.Ho * d.Wo;
  if (total == 0) return;
  dispatch_device_float(dt, "im2col", [&]<class T>() {
    im2col_kernel<T><<<grid_for(total, kThreads), kThreads, 0, s>>>(d, nb, l, static_cast<T*>(col),
                                                                    static_cast<const T*>(x));
    HT_CUDA_CHECK_LAUNCH("im2col_kernel");
  });
}

void launch_col2im(Dtype dt, const ConvDims& d, int64_t nb, const ColumnLayout& l, void* dx,
                   const void* col, cudaStream_t s) {
  const int64_t total = nb * d.C * d.H * d.W;
  if (total == 0) return;
  dispatch_device_float(dt, "col2im", [&]<class T>() {
    col2im_kernel<T><<<grid_for(total, kThreads), kThreads, 0, s>>>(
        d, nb, l, static_cast<T*>(dx), static_cast<const compute_of<T>*>(col));
    HT_CUDA_CHECK_LAUNCH("col2im_kernel");
  });
}

void launch_max_pool(Dtype dt, const ConvDims& d, int64_t planes, void* y, int64_t* idx,
                     const void* x, cudaStream_t s) {
  const int64_t total = planes * d.Ho * d.Wo;
  if (total == 0) return;
  dispatch_device_float(dt, "max_pool2d", [&]<class T>() {
    max_pool_kernel<T><<<grid_for(total, kThreads), kThreads, 0, s>>>(
        d, planes, static_cast<T*>(y), idx, static_cast<const T*>(x));
    HT_CUDA_CHECK_LAUNCH("max_pool_kernel");
  });
}

void launch_max_pool_backward(Dtype dt, const ConvDims& d, int64_t planes, void* dx,
                              const int64_t* idx, const void* g, cudaStream_t s) {
  const int64_t total = planes * d.H * d.W;
  if (total == 0) return;
  dispatch_device_float(dt, "max_pool2d_backward", [&]<class T>() {
    max_pool_backward_kernel<T><<<grid_for(total, kThreads), kThreads, 0, s>>>(
        d, planes, static_cast<T*>(dx), idx, static_cast<const T*>(g));
    HT_CUDA_CHECK_LAUNCH("max_pool_backward_kernel");
  });
}

void launch_avg_pool(Dtype dt, const ConvDims& d, int64_t planes, void* y, const void* x,
                     cudaStream_t s) {
  const int64_t total = planes * d.Ho * d.Wo;
  if (total == 0) return;
  dispatch_device_float(dt, "avg_pool2d", [&]<class T>() {
    avg_pool_kernel<T><<<grid_for(total, kThreads), kThreads, 0, s>>>(d, planes, static_cast<T*>(y),
                                                                      static_cast<const T*>(x));
    HT_CUDA_CHECK_LAUNCH("avg_pool_kernel");
  });
}

void launch_avg_pool_backward(Dtype dt, const ConvDims& d, int64_t planes, void* dx, const void* g,
                              cudaStream_t s) {
  const int64_t total = planes * d.H * d.W;
  if (total == 0) return;
  dispatch_device_float(dt, "avg_pool2d_backward", [&]<class T>() {
    avg_pool_backward_kernel<T><<<grid_for(total, kThreads), kThreads, 0, s>>>(
        d, planes, static_cast<T*>(dx), static_cast<const T*>(g));
    HT_CUDA_CHECK_LAUNCH("avg_pool_backward_kernel");
  });
}

}  // namespace hetrain::cuda
