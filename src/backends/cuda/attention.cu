// Fused scaled-dot-product attention, flash-attention-2 style, with the semantics of
// backends/cpu/eval_attention.cpp (arithmetic in f32, f64 for f64; no atomics, deterministic):
//  - forward: a block owns kB query rows of one batch-head, walks the key/value tiles (kB keys
//    each) through shared memory with an online softmax and saves the row logsumexp;
//  - backward: D = rowsum(dO * O) per query row (a warp per row); dq by blocks of query rows
//    walking the key tiles, dk and dv by blocks of keys walking the query tiles, both
//    recomputing P = exp(s - lse) tile by tile. dq has its own pass, so nothing is summed
//    across blocks.
// Memory beyond inputs and outputs: the B * Lq values of D, linear in L. Tiles live in shared
// memory in the compute type, rows zero-padded to the head-dim bucket D (32, 64, 128, 256 over
// max(E, Ev)) and strided D + 1 against bank conflicts. A block is 16 x 16 threads; thread
// (ty, tx) owns tile rows ty + 16a and, of a (kB, kB) score tile, columns tx + 16c; of a
// (kB, D) result tile, dims tx + 16c. SIMT FMAs in registers: no Tensor Cores (yet).
#include <algorithm>

#include "backends/cuda/device.cuh"

namespace hetrain::cuda {

namespace {

constexpr int kSide = 16;  // a block is kSide x kSide threads
constexpr int kThreads = kSide * kSide;

/// Rows of a tile (query rows per block, keys per tile) for head-dim bucket D and a compute
/// type of `bytes`: at most 84 KB of shared memory per block (within every sm_80+ device's
/// opt-in limit), except f64 at D = 256 (134 KB).
constexpr int tile_rows(int D, int bytes) {
  if (bytes == 8) return D <= 64 ? 32 : 16;
  return D <= 64 ? 64 : (D == 128 ? 32 : 16);
}

/// Tile geometry of the kernels for storage type T and head-dim bucket D.
template <class T, int D>
struct Flash {
  using C = compute_of<T>;
  static constexpr int kB = tile_rows(D, sizeof(C));
  static constexpr int kR = kB / kSide;  // tile rows (and score columns) per thread
  static constexpr int kD = D / kSide;   // result dims per thread
  static constexpr int kLd = D + 1;      // row stride of a (kB, D) tile
  static constexpr int kLs = kB + 1;     // row stride of a (kB, kB) score tile
  static constexpr int kTile = kB * kLd;
  /// Dynamic shared memory: forward Q, K, V and P; backward four (kB, D) tiles, a score tile
  /// and two vectors of kB row values (lse, D).
  static constexpr size_t kForwardBytes = (3 * size_t{kTile} + kB * kLs) * sizeof(C);
  static constexpr size_t kBackwardBytes = (4 * size_t{kTile} + kB * kLs + 2 * kB) * sizeof(C);
  static_assert(kB % kSide == 0 && D % kSide == 0);
};

/// Query row i sees key j (j < Lk; causal: j <= i).
__device__ __forceinline__ bool visible(const AttentionDims& g, int64_t i, int64_t j) {
  return j < g.Lk && (!g.causal || j <= i);
}

/// Rows [r0, r0 + kB) of a row-major (L, width) matrix into the (kB, D) tile s (row stride
/// D + 1), zero beyond row L and beyond column width.
template <int kB, int D, class C, class T>
__device__ __forceinline__ void load_tile(C* __restrict__ s, const T* __restrict__ x, int64_t r0,
                                          int64_t L, int64_t width) {
  for (int idx = threadIdx.x; idx < kB * D; idx += kThreads) {
    const int r = idx / D, d = idx % D;
    const int64_t row = r0 + r;
    s[r * (D + 1) + d] = row < L && d < width ? static_cast<C>(load(x[row * width + d])) : C(0);
  }
}
/// x[r0, r0 + kB) into s, zero beyond L.
template <int kB, class C>
__device__ __forceinline__ void load_rows(C* __restrict__ s, const C* __restrict__ x, int64_t r0,
                                          int64_t L) {
  for (int r = threadIdx.x; r < kB; r += kThreads) s[r] = r0 + r < L ? x[r0 + r] : C(0);
}

/// acc[a][c] = sum_d A[ty + 16a][d] * Bt[tx + 16c][d] over two (kB, D) tiles: this thread's
/// part of the (kB, kB) tile A Bt^T.
template <int kR, int D, class C>
__device__ __forceinline__ void tile_dots(C (&acc)[kR][kR], const C* __restrict__ A,
                                          const C* __restrict__ Bt, int ty, int tx) {
#pragma unroll
  for (int a = 0; a < kR; ++a)
#pragma unroll
    for (int c = 0; c < kR; ++c) acc[a][c] = 0;
#pragma unroll 8
  for (int d = 0; d < D; ++d) {
    C x[kR], y[kR];
#pragma unroll
    for (int a = 0; a < kR; ++a) x[a] = A[(ty + kSide * a) * (D + 1) + d];
#pragma unroll
    for (int c = 0; c < kR; ++c) y[c] = Bt[(tx + kSide * c) * (D + 1) + d];
#pragma unroll
    for (int a = 0; a < kR; ++a)
#pragma unroll
      for (int c = 0; c < kR; ++c) acc[a][c] += x[a] * y[c];
  }
}

/// acc[a][c] += sum_j S[ty + 16a][j] * X[j][tx + 16c]: this thread's part of S X for a (kB, kB)
/// score tile S (row stride kB + 1) and a (kB, D) tile X.
template <int kB, int D, int kR, int kD, class C>
__device__ __forceinline__ void tile_matmul(C (&acc)[kR][kD], const C* __restrict__ S,
                                            const C* __restrict__ X, int ty, int tx) {
#pragma unroll 4
  for (int j = 0; j < kB; ++j) {
    C x[kD];
#pragma unroll
    for (int c = 0; c < kD; ++c) x[c] = X[j * (D + 1) + tx + kSide * c];
#pragma unroll
    for (int a = 0; a < kR; ++a) {
      const C s = S[(ty + kSide * a) * (kB + 1) + j];
#pragma unroll
      for (int c = 0; c < kD; ++c) acc[a][c] += s * x[c];
    }
  }
}

/// Max and sum over the 16 threads of a tile row (same ty: lanes differing in their low 4
/// bits). The whole warp must call them.
template <class C>
__device__ __forceinline__ C row_max(C v) {
  for (int o = kSide / 2; o > 0; o >>= 1) {
    const C w = __shfl_xor_sync(0xffffffffu, v, o);
    v = v < w ? w : v;
  }
  return v;
}
template <class C>
__device__ __forceinline__ C row_sum(C v) {
  for (int o = kSide / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

/// Query-row tiles per batch-head, and the tile a block handles at flat index t (the highest
/// rows first: under a causal mask they walk the most key tiles).
template <int kB>
__device__ __forceinline__ int64_t query_tile_start(int64_t t, int64_t tiles) {
  return (tiles - 1 - t % tiles) * kB;
}
/// Keys a block of query rows [i0, i0 + kB) reads: all, or under a causal mask those up to
/// its last row.
template <int kB>
__device__ __forceinline__ int64_t key_end(const AttentionDims& g, int64_t i0) {
  return g.causal ? (i0 + kB < g.Lk ? i0 + kB : g.Lk) : g.Lk;
}

template <class T, int D>
__global__ void __launch_bounds__(kThreads)
    flash_forward_kernel(AttentionDims g, compute_of<T> scale, T* __restrict__ o,
                         compute_of<T>* __restrict__ lse, const T* __restrict__ q,
                         const T* __restrict__ k, const T* __restrict__ v) {
  using F = Flash<T, D>;
  using C = typename F::C;
  constexpr int kB = F::kB, kR = F::kR, kD = F::kD;
  extern __shared__ __align__(16) unsigned char smem[];
  C* Qs = reinterpret_cast<C*>(smem);
  C* Ks = Qs + F::kTile;
  C* Vs = Ks + F::kTile;
  C* Ps = Vs + F::kTile;  // (kB, kB + 1)
  const int ty = static_cast<int>(threadIdx.x) / kSide, tx = static_cast<int>(threadIdx.x) % kSide;
  const int64_t tiles = (g.Lq + kB - 1) / kB;
  for (int64_t t = blockIdx.x; t < g.B * tiles; t += gridDim.x) {
    const int64_t b = t / tiles, i0 = query_tile_start<kB>(t, tiles);
    __syncthreads();  // the previous tile's reads of Qs are done
    load_tile<kB, D>(Qs, q + b * g.Lq * g.E, i0, g.Lq, g.E);
    C m[kR], l[kR], acc[kR][kD];
#pragma unroll
    for (int a = 0; a < kR; ++a) {
      m[a] = -INFINITY;
      l[a] = 0;
#pragma unroll
      for (int c = 0; c < kD; ++c) acc[a][c] = 0;
    }
    const int64_t kend = key_end<kB>(g, i0);
    for (int64_t j0 = 0; j0 < kend; j0 += kB) {
      __syncthreads();  // the previous key tile's reads of Ks, Vs and Ps are done
      load_tile<kB, D>(Ks, k + b * g.Lk * g.E, j0, g.Lk, g.E);
      load_tile<kB, D>(Vs, v + b * g.Lk * g.Ev, j0, g.Lk, g.Ev);
      __syncthreads();
      C s[kR][kR];
      tile_dots<kR, D>(s, Qs, Ks, ty, tx);
#pragma unroll
      for (int a = 0; a < kR; ++a) {
        const int r = ty + kSide * a;
        C mx = m[a];
#pragma unroll
        for (int c = 0; c < kR; ++c) {
          s[a][c] = visible(g, i0 + r, j0 + tx + kSide * c) ? s[a][c] * scale : C(-INFINITY);
          mx = mx < s[a][c] ? s[a][c] : mx;
        }
        mx = row_max(mx);
        // Every row sees key 0 in the first tile, so mx is finite from then on; the guard
        // keeps a row with nothing visible yet from computing -inf - -inf.
        const C shift = mx == C(-INFINITY) ? C(0) : mx;
        const C alpha = d_exp(m[a] - shift);
        C sum = 0;
#pragma unroll
        for (int c = 0; c < kR; ++c) {
          const C p = d_exp(s[a][c] - shift);
          sum += p;
          Ps[r * F::kLs + tx + kSide * c] = p;
        }
        l[a] = l[a] * alpha + row_sum(sum);
        m[a] = mx;
#pragma unroll
        for (int c = 0; c < kD; ++c) acc[a][c] *= alpha;
      }
      __syncthreads();
      tile_matmul<kB, D>(acc, Ps, Vs, ty, tx);
    }
#pragma unroll
    for (int a = 0; a < kR; ++a) {
      const int64_t i = i0 + ty + kSide * a;
      if (i >= g.Lq) continue;
      const C inv = C(1) / l[a];
      T* orow = o + (b * g.Lq + i) * g.Ev;
#pragma unroll
      for (int c = 0; c < kD; ++c) {
        const int e = tx + kSide * c;
        if (e < g.Ev) orow[e] = store<T>(acc[a][c] * inv);
      }
      if (tx == 0) lse[b * g.Lq + i] = m[a] + d_log(l[a]);
    }
  }
}

/// D_i = sum_e dO_ie O_ie per query row, a warp per row.
template <class T>
__global__ void flash_d_kernel(int64_t rows, int64_t Ev, compute_of<T>* __restrict__ d,
                               const T* __restrict__ o, const T* __restrict__ dout) {
  using C = compute_of<T>;
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int64_t warps = (int64_t{gridDim.x} * blockDim.x) >> 5;
  for (int64_t r = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) >> 5; r < rows; r += warps) {
    C s = 0;
    for (int64_t e = lane; e < Ev; e += 32)
      s += static_cast<C>(load(o[r * Ev + e])) * static_cast<C>(load(dout[r * Ev + e]));
    s = warp_sum(s);
    if (lane == 0) d[r] = s;
  }
}

/// dq_i = scale * sum_j dS_ij k_j with dS_ij = P_ij (dO_i . v_j - D_i), by query-row blocks.
template <class T, int D>
__global__ void __launch_bounds__(kThreads)
    flash_dq_kernel(AttentionDims g, compute_of<T> scale, T* __restrict__ dq,
                    const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                    const T* __restrict__ dout, const compute_of<T>* __restrict__ lse,
                    const compute_of<T>* __restrict__ d) {
  using F = Flash<T, D>;
  using C = typename F::C;
  constexpr int kB = F::kB, kR = F::kR, kD = F::kD;
  extern __shared__ __align__(16) unsigned char smem[];
  C* Qs = reinterpret_cast<C*>(smem);
  C* dOs = Qs + F::kTile;
  C* Ks = dOs + F::kTile;
  C* Vs = Ks + F::kTile;
  C* Ss = Vs + F::kTile;  // dS, (kB, kB + 1)
  C* Ls = Ss + kB * F::kLs;
  C* Ds = Ls + kB;
  const int ty = static_cast<int>(threadIdx.x) / kSide, tx = static_cast<int>(threadIdx.x) % kSide;
  const int64_t tiles = (g.Lq + kB - 1) / kB;
  for (int64_t t = blockIdx.x; t < g.B * tiles; t += gridDim.x) {
    const int64_t b = t / tiles, i0 = query_tile_start<kB>(t, tiles);
    __syncthreads();  // the previous tile's reads of Qs, dOs, Ls and Ds are done
    load_tile<kB, D>(Qs, q + b * g.Lq * g.E, i0, g.Lq, g.E);
    load_tile<kB, D>(dOs, dout + b * g.Lq * g.Ev, i0, g.Lq, g.Ev);
    load_rows<kB>(Ls, lse + b * g.Lq, i0, g.Lq);
    load_rows<kB>(Ds, d + b * g.Lq, i0, g.Lq);
    C acc[kR][kD];
#pragma unroll
    for (int a = 0; a < kR; ++a)
#pragma unroll
      for (int c = 0; c < kD; ++c) acc[a][c] = 0;
    const int64_t kend = key_end<kB>(g, i0);
    for (int64_t j0 = 0; j0 < kend; j0 += kB) {
      __syncthreads();  // the previous key tile's reads of Ks, Vs and Ss are done
      load_tile<kB, D>(Ks, k + b * g.Lk * g.E, j0, g.Lk, g.E);
      load_tile<kB, D>(Vs, v + b * g.Lk * g.Ev, j0, g.Lk, g.Ev);
      __syncthreads();
      C s[kR][kR], dp[kR][kR];
      tile_dots<kR, D>(s, Qs, Ks, ty, tx);
      tile_dots<kR, D>(dp, dOs, Vs, ty, tx);
#pragma unroll
      for (int a = 0; a < kR; ++a) {
        const int r = ty + kSide * a;
#pragma unroll
        for (int c = 0; c < kR; ++c) {
          const int col = tx + kSide * c;
          const C p = visible(g, i0 + r, j0 + col) ? d_exp(s[a][c] * scale - Ls[r]) : C(0);
          Ss[r * F::kLs + col] = p * (dp[a][c] - Ds[r]);
        }
      }
      __syncthreads();
      tile_matmul<kB, D>(acc, Ss, Ks, ty, tx);
    }
#pragma unroll
    for (int a = 0; a < kR; ++a) {
      const int64_t i = i0 + ty + kSide * a;
      if (i >= g.Lq) continue;
      T* row = dq + (b * g.Lq + i) * g.E;
#pragma unroll
      for (int c = 0; c < kD; ++c) {
        const int e = tx + kSide * c;
        if (e < g.E) row[e] = store<T>(acc[a][c] * scale);
      }
    }
  }
}

/// dk_j = scale * sum_i dS_ij q_i and dv_j = sum_i P_ij dO_i, by key blocks.
template <class T, int D>
__global__ void __launch_bounds__(kThreads)
    flash_dkdv_kernel(AttentionDims g, compute_of<T> scale, T* __restrict__ dk, T* __restrict__ dv,
                      const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                      const T* __restrict__ dout, const compute_of<T>* __restrict__ lse,
                      const compute_of<T>* __restrict__ d) {
  using F = Flash<T, D>;
  using C = typename F::C;
  constexpr int kB = F::kB, kR = F::kR, kD = F::kD;
  extern __shared__ __align__(16) unsigned char smem[];
  C* Ks = reinterpret_cast<C*>(smem);
  C* Vs = Ks + F::kTile;
  C* Qs = Vs + F::kTile;
  C* dOs = Qs + F::kTile;
  C* Ss = dOs + F::kTile;  // P^T, then dS^T: (kB keys, kB + 1)
  C* Ls = Ss + kB * F::kLs;
  C* Ds = Ls + kB;
  const int ty = static_cast<int>(threadIdx.x) / kSide, tx = static_cast<int>(threadIdx.x) % kSide;
  const int64_t tiles = (g.Lk + kB - 1) / kB;
  for (int64_t t = blockIdx.x; t < g.B * tiles; t += gridDim.x) {
    const int64_t b = t / tiles, j0 = (t % tiles) * kB;
    __syncthreads();  // the previous tile's reads of Ks and Vs are done
    load_tile<kB, D>(Ks, k + b * g.Lk * g.E, j0, g.Lk, g.E);
    load_tile<kB, D>(Vs, v + b * g.Lk * g.Ev, j0, g.Lk, g.Ev);
    C dka[kR][kD], dva[kR][kD];
#pragma unroll
    for (int a = 0; a < kR; ++a)
#pragma unroll
      for (int c = 0; c < kD; ++c) dka[a][c] = dva[a][c] = 0;
    // Causal: query rows before j0 see none of these keys.
    for (int64_t i0 = g.causal ? j0 : 0; i0 < g.Lq; i0 += kB) {
      __syncthreads();  // the previous query tile's reads of Qs, dOs, Ss, Ls and Ds are done
      load_tile<kB, D>(Qs, q + b * g.Lq * g.E, i0, g.Lq, g.E);
      load_tile<kB, D>(dOs, dout + b * g.Lq * g.Ev, i0, g.Lq, g.Ev);
      load_rows<kB>(Ls, lse + b * g.Lq, i0, g.Lq);
      load_rows<kB>(Ds, d + b * g.Lq, i0, g.Lq);
      __syncthreads();
      // Transposed tiles: row a is key j0 + ty + 16a, column c query i0 + tx + 16c.
      C s[kR][kR], ds[kR][kR];
      tile_dots<kR, D>(s, Ks, Qs, ty, tx);
      tile_dots<kR, D>(ds, Vs, dOs, ty, tx);
#pragma unroll
      for (int a = 0; a < kR; ++a) {
        const int r = ty + kSide * a;
#pragma unroll
        for (int c = 0; c < kR; ++c) {
          const int col = tx + kSide * c;
          const int64_t i = i0 + col;
          const C p = i < g.Lq && visible(g, i, j0 + r) ? d_exp(s[a][c] * scale - Ls[col]) : C(0);
          ds[a][c] = p * (ds[a][c] - Ds[col]);
          Ss[r * F::kLs + col] = p;
        }
      }
      __syncthreads();
      tile_matmul<kB, D>(dva, Ss, dOs, ty, tx);
      __syncthreads();  // every thread is done reading P before dS overwrites it
#pragma unroll
      for (int a = 0; a < kR; ++a)
#pragma unroll
        for (int c = 0; c < kR; ++c) Ss[(ty + kSide * a) * F::kLs + tx + kSide * c] = ds[a][c];
      __syncthreads();
      tile_matmul<kB, D>(dka, Ss, Qs, ty, tx);
    }
#pragma unroll
    for (int a = 0; a < kR; ++a) {
      const int64_t j = j0 + ty + kSide * a;
      if (j >= g.Lk) continue;
      T* dkr = dk + (b * g.Lk + j) * g.E;
      T* dvr = dv + (b * g.Lk + j) * g.Ev;
#pragma unroll
      for (int c = 0; c < kD; ++c) {
        const int e = tx + kSide * c;
        if (e < g.E) dkr[e] = store<T>(dka[a][c] * scale);
        if (e < g.Ev) dvr[e] = store<T>(dva[a][c]);
      }
    }
  }
}

/// Calls f.template operator()<D>() for the head-dim bucket of max(E, Ev).
template <class F>
void dispatch_head_dim(const AttentionDims& g, const char* op, F&& f) {
  const int64_t e = std::max(g.E, g.Ev);
  if (e <= 32) {
    f.template operator()<32>();
  } else if (e <= 64) {
    f.template operator()<64>();
  } else if (e <= 128) {
    f.template operator()<128>();
  } else if (e <= kMaxAttentionDim) {
    f.template operator()<256>();
  } else {
    fail("[", op, "] the CUDA kernel handles head dims up to ", kMaxAttentionDim, ", got E=", g.E,
         " Ev=", g.Ev);
  }
}

/// Lets kernel use `bytes` of dynamic shared memory on the current device (past the default
/// 48 KB); a clear error where the device has less.
template <class K>
void allow_shared(K* kernel, size_t bytes, const char* op) {
  int dev = 0, most = 0;
  HT_CUDA_CHECK(cudaGetDevice(&dev));
  HT_CUDA_CHECK(cudaDeviceGetAttribute(&most, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  if (bytes > static_cast<size_t>(most))
    fail("[", op, "] the CUDA kernel for this dtype and head dim needs ", bytes,
         " bytes of shared memory per block; the device allows ", most);
  HT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(bytes)));
}

/// Blocks for a grid-stride loop over n tiles.
unsigned tile_blocks(int64_t n) {
  return static_cast<unsigned>(std::clamp<int64_t>(n, 1, int64_t{1} << 20));
}

}  // namespace

void launch_attention(Dtype dt, const AttentionDims& g, double scale, void* o, void* lse,
                      const void* q, const void* k, const void* v, cudaStream_t s) {
  dispatch_device_float(dt, "sdpa", [&]<class T>() {
    dispatch_head_dim(g, "sdpa", [&]<int D>() {
      using F = Flash<T, D>;
      using C = typename F::C;
      if (g.B * g.Lq == 0) return;
      allow_shared(flash_forward_kernel<T, D>, F::kForwardBytes, "sdpa");
      flash_forward_kernel<T, D>
          <<<tile_blocks(g.B * ((g.Lq + F::kB - 1) / F::kB)), kThreads, F::kForwardBytes, s>>>(
              g, static_cast<C>(scale), static_cast<T*>(o), static_cast<C*>(lse),
              static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v));
      HT_CUDA_CHECK_LAUNCH("flash_forward_kernel");
    });
  });
}

void launch_attention_backward(Dtype dt, const AttentionDims& g, double scale, void* dq, void* dk,
                               void* dv, void* d_rows, const void* q, const void* k, const void* v,
                               const void* o, const void* dout, const void* lse, cudaStream_t s) {
  dispatch_device_float(dt, "sdpa_backward", [&]<class T>() {
    dispatch_head_dim(g, "sdpa_backward", [&]<int D>() {
      using F = Flash<T, D>;
      using C = typename F::C;
      const auto* qp = static_cast<const T*>(q);
      const auto* kp = static_cast<const T*>(k);
      const auto* vp = static_cast<const T*>(v);
      const auto* dop = static_cast<const T*>(dout);
      const auto* lp = static_cast<const C*>(lse);
      auto* dr = static_cast<C*>(d_rows);
      if (g.B * g.Lq > 0) {
        constexpr int kWarps = 8;
        flash_d_kernel<T><<<tile_blocks((g.B * g.Lq + kWarps - 1) / kWarps), 32 * kWarps, 0, s>>>(
            g.B * g.Lq, g.Ev, dr, static_cast<const T*>(o), dop);
        HT_CUDA_CHECK_LAUNCH("flash_d_kernel");
        allow_shared(flash_dq_kernel<T, D>, F::kBackwardBytes, "sdpa_backward");
        flash_dq_kernel<T, D>
            <<<tile_blocks(g.B * ((g.Lq + F::kB - 1) / F::kB)), kThreads, F::kBackwardBytes, s>>>(
                g, static_cast<C>(scale), static_cast<T*>(dq), qp, kp, vp, dop, lp, dr);
        HT_CUDA_CHECK_LAUNCH("flash_dq_kernel");
      }
      // With Lq = 0 too: dk and dv are then zero.
      if (g.B * g.Lk > 0) {
        allow_shared(flash_dkdv_kernel<T, D>, F::kBackwardBytes, "sdpa_backward");
        flash_dkdv_kernel<T, D>
            <<<tile_blocks(g.B * ((g.Lk + F::kB - 1) / F::kB)), kThreads, F::kBackwardBytes, s>>>(
                g, static_cast<C>(scale), static_cast<T*>(dk), static_cast<T*>(dv), qp, kp, vp, dop,
                lp, dr);
        HT_CUDA_CHECK_LAUNCH("flash_dkdv_kernel");
      }
    });
  });
}

}  // namespace hetrain::cuda
