// Neural-network kernels: softmax/log_softmax, layer_norm/rms_norm forward and backward,
// the fused cross-entropy forward and backward, take/index_add (embedding forward and
// backward) and the fused AdamW step. Semantics follow backends/cpu/eval_nn.cpp, eval_index.cpp and
// optim.cpp; sums accumulate in f32 (f64 for f64).
#include "backends/cuda/device.cuh"

namespace hetrain::cuda {

namespace {

constexpr int kRowThreads = 256;

// ---- softmax --------------------------------------------------------------------------------

/// A block per row of R contiguous elements (I == 1).
template <class T>
__global__ void softmax_rows_kernel(bool log, int64_t rows, int64_t R, T* __restrict__ y,
                                    const T* __restrict__ x) {
  using C = compute_of<T>;
  __shared__ C shared[32];
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* xr = x + row * R;
    T* yr = y + row * R;
    C m = -INFINITY;
    for (int64_t i = threadIdx.x; i < R; i += blockDim.x) m = nan_max(m, load(xr[i]));
    m = block_max(m, shared, C(-INFINITY));
    C s = 0;
    for (int64_t i = threadIdx.x; i < R; i += blockDim.x) s += d_exp(load(xr[i]) - m);
    s = block_sum(s, shared);
    if (log) {
      // (x - m) - log(s): no cancellation when |m| is large.
      const C ls = d_log(s);
      for (int64_t i = threadIdx.x; i < R; i += blockDim.x)
        yr[i] = store<T>((load(xr[i]) - m) - ls);
    } else {
      const C inv = C(1) / s;
      for (int64_t i = threadIdx.x; i < R; i += blockDim.x)
        yr[i] = store<T>(d_exp(load(xr[i]) - m) * inv);
    }
  }
}

/// A thread per (o, i) column of (O, R, I) with I > 1.
template <class T>
__global__ void softmax_cols_kernel(bool log, int64_t O, int64_t R, int64_t I, T* __restrict__ y,
                                    const T* __restrict__ x) {
  using C = compute_of<T>;
  for (int64_t t = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; t < O * I;
       t += int64_t{gridDim.x} * blockDim.x) {
    const int64_t o = t / I, i = t - o * I;
    const T* xb = x + o * R * I + i;
    T* yb = y + o * R * I + i;
    C m = -INFINITY, s = 0;
    for (int64_t r = 0; r < R; ++r) m = nan_max(m, load(xb[r * I]));
    for (int64_t r = 0; r < R; ++r) s += d_exp(load(xb[r * I]) - m);
    s = log ? d_log(s) : C(1) / s;
    for (int64_t r = 0; r < R; ++r) {
      const C v = load(xb[r * I]);
      yb[r * I] = store<T>(log ? (v - m) - s : d_exp(v - m) * s);
    }
  }
}

// ---- layer_norm / rms_norm --------------------------------------------------------------------

template <class T>
__global__ void norm_kernel(bool center, int64_t rows, int64_t n, compute_of<T> eps,
                            T* __restrict__ y, compute_of<T>* __restrict__ stats,
                            const T* __restrict__ x, const T* __restrict__ w,
                            const T* __restrict__ b) {
  using C = compute_of<T>;
  __shared__ C shared[32];
  const C inv_n = C(1) / static_cast<C>(n);
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* xr = x + row * n;
    T* yr = y + row * n;
    // Two passes (mean, then squared deviations): stable when |mean| >> std.
    C mean = 0;
    if (center) {
      C s = 0;
      for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += load(xr[i]);
      mean = block_sum(s, shared) * inv_n;
    }
    C v = 0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      const C d = load(xr[i]) - mean;
      v += d * d;
    }
    const C var = block_sum(v, shared) * inv_n;
    const C rstd = C(1) / d_sqrt(var + eps);
    if (threadIdx.x == 0) {
      stats[2 * row] = mean;
      stats[2 * row + 1] = rstd;
    }
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      C o = (load(xr[i]) - mean) * rstd;
      if (w) o = o * load(w[i]);
      if (b) o = o + load(b[i]);
      yr[i] = store<T>(o);
    }
  }
}

/// dx of one row per block: rstd * (g w - mean(g w) - xhat * mean(g w xhat)).
template <class T>
__global__ void norm_dx_kernel(bool center, int64_t rows, int64_t n, T* __restrict__ dx,
                               const T* __restrict__ x, const compute_of<T>* __restrict__ stats,
                               const T* __restrict__ g, const T* __restrict__ w) {
  using C = compute_of<T>;
  __shared__ C shared[32];
  const C inv_n = C(1) / static_cast<C>(n);
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* xr = x + row * n;
    const T* gr = g + row * n;
    T* dxr = dx + row * n;
    const C mean = stats[2 * row], rstd = stats[2 * row + 1];
    C sa = 0, sb = 0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      const C xh = (load(xr[i]) - mean) * rstd;
      const C gw = w ? load(gr[i]) * load(w[i]) : load(gr[i]);
      sa += gw;
      sb += gw * xh;
    }
    const C a = center ? block_sum(sa, shared) * inv_n : C(0);
    const C bdot = block_sum(sb, shared) * inv_n;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      const C xh = (load(xr[i]) - mean) * rstd;
      const C gw = w ? load(gr[i]) * load(w[i]) : load(gr[i]);
      dxr[i] = store<T>(rstd * (gw - a - xh * bdot));
    }
  }
}

/// Per chunk of rows (blockIdx.y) and column (x threads): partial sums of g * xhat (dw) and
/// g (db), in row order.
template <class T>
__global__ void norm_dwdb_partial_kernel(int64_t rows, int64_t n, int64_t per,
                                         compute_of<T>* __restrict__ pw,
                                         compute_of<T>* __restrict__ pb, const T* __restrict__ x,
                                         const compute_of<T>* __restrict__ stats,
                                         const T* __restrict__ g) {
  using C = compute_of<T>;
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i >= n) return;
  const int64_t c = blockIdx.y;
  const int64_t r0 = c * per, r1 = r0 + per < rows ? r0 + per : rows;
  C sw = 0, sb = 0;
  for (int64_t r = r0; r < r1; ++r) {
    const C gi = load(g[r * n + i]);
    sw += gi * ((load(x[r * n + i]) - stats[2 * r]) * stats[2 * r + 1]);
    sb += gi;
  }
  if (pw) pw[c * n + i] = sw;
  if (pb) pb[c * n + i] = sb;
}

/// Sums the chunks' partials per column in chunk order and rounds into dw / db.
template <class T>
__global__ void norm_dwdb_finish_kernel(int64_t n, int64_t chunks, T* __restrict__ dw,
                                        T* __restrict__ db, const compute_of<T>* __restrict__ pw,
                                        const compute_of<T>* __restrict__ pb) {
  using C = compute_of<T>;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    if (dw) {
      C s = 0;
      for (int64_t c = 0; c < chunks; ++c) s += pw[c * n + i];
      dw[i] = store<T>(s);
    }
    if (db) {
      C s = 0;
      for (int64_t c = 0; c < chunks; ++c) s += pb[c * n + i];
      db[i] = store<T>(s);
    }
  }
}

// ---- cross_entropy --------------------------------------------------------------------------

template <class T, class I>
__global__ void ce_rows_kernel(int64_t rows, int64_t R, int64_t ignore,
                               compute_of<T>* __restrict__ loss, compute_of<T>* __restrict__ lse,
                               const T* __restrict__ x, const I* __restrict__ target) {
  using C = compute_of<T>;
  __shared__ C shared[32];
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* xr = x + row * R;
    C m = -INFINITY;
    for (int64_t i = threadIdx.x; i < R; i += blockDim.x) m = nan_max(m, load(xr[i]));
    m = block_max(m, shared, C(-INFINITY));
    C s = 0;
    for (int64_t i = threadIdx.x; i < R; i += blockDim.x) s += d_exp(load(xr[i]) - m);
    s = block_sum(s, shared);
    if (threadIdx.x == 0) {
      const C ls = d_log(s);
      const int64_t t = static_cast<int64_t>(target[row]);
      lse[row] = m + ls;
      loss[row] = t == ignore ? C(0) : (m - load(xr[t])) + ls;
    }
  }
}

template <class T, class I>
__global__ void ce_cols_kernel(int64_t O, int64_t R, int64_t In, int64_t ignore,
                               compute_of<T>* __restrict__ loss, compute_of<T>* __restrict__ lse,
                               const T* __restrict__ x, const I* __restrict__ target) {
  using C = compute_of<T>;
  for (int64_t k = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; k < O * In;
       k += int64_t{gridDim.x} * blockDim.x) {
    const int64_t o = k / In, i = k - o * In;
    const T* xb = x + o * R * In + i;
    C m = -INFINITY, s = 0;
    for (int64_t r = 0; r < R; ++r) m = nan_max(m, load(xb[r * In]));
    for (int64_t r = 0; r < R; ++r) s += d_exp(load(xb[r * In]) - m);
    const C ls = d_log(s);
    const int64_t t = static_cast<int64_t>(target[k]);
    lse[k] = m + ls;
    loss[k] = t == ignore ? C(0) : (m - load(xb[t * In])) + ls;
  }
}

template <class T, class I>
__global__ void ce_backward_kernel(int64_t O, int64_t R, int64_t In, int64_t ignore,
                                   T* __restrict__ dx, const T* __restrict__ x,
                                   const I* __restrict__ target,
                                   const compute_of<T>* __restrict__ lse,
                                   const compute_of<T>* __restrict__ g) {
  using C = compute_of<T>;
  const int64_t total = O * R * In;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < total;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = e % In, orow = e / In;
    const int64_t r = orow % R, o = orow / R;
    const int64_t k = o * In + i;
    const int64_t t = static_cast<int64_t>(target[k]);
    const C gg = t == ignore ? C(0) : g[k];
    const C p = d_exp(load(x[e]) - lse[k]) * gg;
    dx[e] = store<T>(r == t && t != ignore ? p - gg : p);
  }
}

// ---- take / index_add -----------------------------------------------------------------------

template <class T, class Ix>
__global__ void take_kernel(int64_t O, int64_t V, int64_t In, int64_t K, T* __restrict__ y,
                            const T* __restrict__ x, const Ix* __restrict__ idx) {
  const int64_t total = O * K * In;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < total;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = e % In, ok = e / In;
    const int64_t k = ok % K, o = ok / K;
    y[e] = x[(o * V + static_cast<int64_t>(idx[k])) * In + i];
  }
}

template <class T, class Ix>
__global__ void index_add_kernel(int64_t O, int64_t V, int64_t In, int64_t K,
                                 compute_of<T>* __restrict__ acc, const T* __restrict__ g,
                                 const Ix* __restrict__ idx) {
  const int64_t total = O * K * In;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < total;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = e % In, ok = e / In;
    const int64_t k = ok % K, o = ok / K;
    atomicAdd(acc + (o * V + static_cast<int64_t>(idx[k])) * In + i, load(g[e]));
  }
}

template <class T>
__global__ void round_kernel(int64_t n, T* __restrict__ y, const compute_of<T>* __restrict__ a) {
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < n;
       e += int64_t{gridDim.x} * blockDim.x)
    y[e] = store<T>(a[e]);
}

// ---- adamw ----------------------------------------------------------------------------------

template <class T>
__global__ void adamw_kernel(int64_t n, compute_of<T> b1, compute_of<T> b2, compute_of<T> one_b1,
                             compute_of<T> one_b2, compute_of<T> keep, compute_of<T> inv_sqrt_bc2,
                             compute_of<T> eps, compute_of<T> step, bool decay, T* __restrict__ po,
                             T* __restrict__ mo, T* __restrict__ vo, const T* __restrict__ p,
                             const T* __restrict__ g, const T* __restrict__ m,
                             const T* __restrict__ v) {
  using C = compute_of<T>;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    // The CPU kernel's order of operations.
    const C gi = load(g[i]);
    const C mi = load(m[i]) * b1 + gi * one_b1;
    const C vi = load(v[i]) * b2 + (gi * gi) * one_b2;
    const C pi = decay ? load(p[i]) * keep : load(p[i]);
    const C denom = d_sqrt(vi) * inv_sqrt_bc2 + eps;
    po[i] = store<T>(pi - (mi / denom) * step);
    mo[i] = store<T>(mi);
    vo[i] = store<T>(vi);
  }
}

unsigned row_blocks(int64_t rows) {
  return static_cast<unsigned>(rows < 65535 ? (rows < 1 ? 1 : rows) : 65535);
}

}  // namespace

void launch_softmax(Dtype dt, bool log, int64_t O, int64_t R, int64_t I, void* y, const void* x,
                    cudaStream_t s) {
  if (O * R * I == 0) return;
  dispatch_device_float(dt, log ? "log_softmax" : "softmax", [&]<class T>() {
    if (I == 1) {
      softmax_rows_kernel<T><<<row_blocks(O), kRowThreads, 0, s>>>(log, O, R, static_cast<T*>(y),
                                                                   static_cast<const T*>(x));
      HT_CUDA_CHECK_LAUNCH("softmax_rows_kernel");
    } else {
      softmax_cols_kernel<T><<<grid_for(O * I, 256), 256, 0, s>>>(log, O, R, I, static_cast<T*>(y),
                                                                  static_cast<const T*>(x));
      HT_CUDA_CHECK_LAUNCH("softmax_cols_kernel");
    }
  });
}

void launch_norm(Dtype dt, bool center, int64_t rows, int64_t n, double eps, void* y, void* stats,
                 const void* x, const void* w, const void* b, cudaStream_t s) {
  if (rows * n == 0) return;
  dispatch_device_float(dt, center ? "layer_norm" : "rms_norm", [&]<class T>() {
    using C = compute_of<T>;
    norm_kernel<T><<<row_blocks(rows), kRowThreads, 0, s>>>(
        center, rows, n, static_cast<C>(eps), static_cast<T*>(y), static_cast<C*>(stats),
        static_cast<const T*>(x), static_cast<const T*>(w), static_cast<const T*>(b));
    HT_CUDA_CHECK_LAUNCH("norm_kernel");
  });
}

int64_t norm_backward_chunks(int64_t rows) { return rows < 256 ? (rows < 1 ? 1 : rows) : 256; }

void launch_norm_backward(Dtype dt, bool center, int64_t rows, int64_t n, void* dx, void* dw,
                          void* db, void* partial, const void* x, const void* stats, const void* g,
                          const void* w, cudaStream_t s) {
  dispatch_device_float(dt, center ? "layer_norm_backward" : "rms_norm_backward", [&]<class T>() {
    using C = compute_of<T>;
    if (rows * n > 0) {
      norm_dx_kernel<T><<<row_blocks(rows), kRowThreads, 0, s>>>(
          center, rows, n, static_cast<T*>(dx), static_cast<const T*>(x),
          static_cast<const C*>(stats), static_cast<const T*>(g), static_cast<const T*>(w));
      HT_CUDA_CHECK_LAUNCH("norm_dx_kernel");
    }
    if ((!dw && !db) || n == 0) return;
    const int64_t chunks = norm_backward_chunks(rows);
    const int64_t per = (rows + chunks - 1) / chunks;
    C* pw = static_cast<C*>(partial);
    C* pb = pw + chunks * n;
    const dim3 grid(static_cast<unsigned>((n + 255) / 256), static_cast<unsigned>(chunks));
    norm_dwdb_partial_kernel<T><<<grid, 256, 0, s>>>(
        rows, n, per, dw ? pw : nullptr, db ? pb : nullptr, static_cast<const T*>(x),
        static_cast<const C*>(stats), static_cast<const T*>(g));
    HT_CUDA_CHECK_LAUNCH("norm_dwdb_partial_kernel");
    norm_dwdb_finish_kernel<T><<<grid_for(n, 256), 256, 0, s>>>(n, chunks, static_cast<T*>(dw),
                                                                static_cast<T*>(db), pw, pb);
    HT_CUDA_CHECK_LAUNCH("norm_dwdb_finish_kernel");
  });
}

void launch_cross_entropy(Dtype dt, Dtype it, int64_t O, int64_t R, int64_t I, int64_t ignore,
                          void* loss, void* lse, const void* x, const void* target,
                          cudaStream_t s) {
  if (O * I == 0) return;
  dispatch_device_float(dt, "cross_entropy", [&]<class T>() {
    using C = compute_of<T>;
    dispatch_index(it, "cross_entropy", [&]<class Ix>() {
      if (I == 1) {
        ce_rows_kernel<T, Ix><<<row_blocks(O), kRowThreads, 0, s>>>(
            O, R, ignore, static_cast<C*>(loss), static_cast<C*>(lse), static_cast<const T*>(x),
            static_cast<const Ix*>(target));
        HT_CUDA_CHECK_LAUNCH("ce_rows_kernel");
      } else {
        ce_cols_kernel<T, Ix><<<grid_for(O * I, 256), 256, 0, s>>>(
            O, R, I, ignore, static_cast<C*>(loss), static_cast<C*>(lse), static_cast<const T*>(x),
            static_cast<const Ix*>(target));
        HT_CUDA_CHECK_LAUNCH("ce_cols_kernel");
      }
    });
  });
}

void launch_cross_entropy_backward(Dtype dt, Dtype it, int64_t O, int64_t R, int64_t I,
                                   int64_t ignore, void* dx, const void* x, const void* target,
                                   const void* lse, const void* g, cudaStream_t s) {
  if (O * R * I == 0) return;
  dispatch_device_float(dt, "cross_entropy_backward", [&]<class T>() {
    using C = compute_of<T>;
    dispatch_index(it, "cross_entropy_backward", [&]<class Ix>() {
      ce_backward_kernel<T, Ix><<<grid_for(O * R * I, 256), 256, 0, s>>>(
          O, R, I, ignore, static_cast<T*>(dx), static_cast<const T*>(x),
          static_cast<const Ix*>(target), static_cast<const C*>(lse), static_cast<const C*>(g));
      HT_CUDA_CHECK_LAUNCH("ce_backward_kernel");
    });
  });
}

void launch_take(Dtype dt, Dtype it, int64_t O, int64_t V, int64_t I, int64_t K, void* y,
                 const void* x, const void* idx, cudaStream_t s) {
  if (O * K * I == 0) return;
  dispatch_device(dt, "take", [&]<class T>() {
    dispatch_index(it, "take", [&]<class Ix>() {
      take_kernel<T, Ix><<<grid_for(O * K * I, 256), 256, 0, s>>>(
          O, V, I, K, static_cast<T*>(y), static_cast<const T*>(x), static_cast<const Ix*>(idx));
      HT_CUDA_CHECK_LAUNCH("take_kernel");
    });
  });
}

void launch_index_add(Dtype dt, Dtype it, int64_t O, int64_t V, int64_t I, int64_t K, void* y,
                      void* acc, const void* g, const void* idx, cudaStream_t s) {
  dispatch_device_float(dt, "index_add", [&]<class T>() {
    using C = compute_of<T>;
    if (O * K * I > 0) {
      dispatch_index(it, "index_add", [&]<class Ix>() {
        index_add_kernel<T, Ix><<<grid_for(O * K * I, 256), 256, 0, s>>>(
            O, V, I, K, static_cast<C*>(acc), static_cast<const T*>(g),
            static_cast<const Ix*>(idx));
        HT_CUDA_CHECK_LAUNCH("index_add_kernel");
      });
    }
    if constexpr (!std::is_same_v<T, C>) {
      if (O * V * I > 0) {
        round_kernel<T><<<grid_for(O * V * I, 256), 256, 0, s>>>(O * V * I, static_cast<T*>(y),
                                                                 static_cast<const C*>(acc));
        HT_CUDA_CHECK_LAUNCH("round_kernel");
      }
    }
  });
}

void launch_adamw(Dtype dt, int64_t n, const AdamWScalars& a, void* po, void* mo, void* vo,
                  const void* p, const void* g, const void* m, const void* v, cudaStream_t s) {
  if (n == 0) return;
  dispatch_device_float(dt, "adamw_update", [&]<class T>() {
    using C = compute_of<T>;
    adamw_kernel<T><<<grid_for(n, 256), 256, 0, s>>>(
        n, static_cast<C>(a.b1), static_cast<C>(a.b2), static_cast<C>(a.one_b1),
        static_cast<C>(a.one_b2), static_cast<C>(a.keep), static_cast<C>(a.inv_sqrt_bc2),
        static_cast<C>(a.eps), static_cast<C>(a.step), a.decay, static_cast<T*>(po),
        static_cast<T*>(mo), static_cast<T*>(vo), static_cast<const T*>(p),
        static_cast<const T*>(g), static_cast<const T*>(m), static_cast<const T*>(v));
    HT_CUDA_CHECK_LAUNCH("adamw_kernel");
  });
}

}  // namespace hetrain::cuda
