// Fused scaled-dot-product attention, forward and backward (flash-attention's math: online
// softmax forward, probabilities recomputed from the saved logsumexp backward), one warp per
// row. Each lane holds the head dimensions e = lane + 32 t of its row in registers; scores are
// warp-reduced dot products. Semantics of backends/cpu/attention.cpp; arithmetic in f32 (f64
// for f64). A first version: correct and linear in memory, not yet tiled through shared
// memory or Tensor Cores.
#include "backends/cuda/device.cuh"

namespace hetrain::cuda {

namespace {

constexpr int kPer = static_cast<int>(kMaxAttentionDim / 32);  // dims per lane
constexpr int kWarpsPerBlock = 8;

__device__ __forceinline__ int64_t warp_id() {
  return (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) >> 5;
}
__device__ __forceinline__ int64_t warps_total() { return (int64_t{gridDim.x} * blockDim.x) >> 5; }

/// Loads this lane's dims of a row of n elements into r (zero beyond n).
template <class T, class C>
__device__ __forceinline__ void load_row(C (&r)[kPer], const T* row, int64_t n, int lane) {
#pragma unroll
  for (int t = 0; t < kPer; ++t) {
    const int64_t e = lane + 32 * t;
    r[t] = e < n ? static_cast<C>(load(row[e])) : C(0);
  }
}
/// Dot product of a register row with a memory row (every lane gets it).
template <class T, class C>
__device__ __forceinline__ C dot_row(const C (&r)[kPer], const T* row, int64_t n, int lane) {
  C s = 0;
#pragma unroll
  for (int t = 0; t < kPer; ++t) {
    const int64_t e = lane + 32 * t;
    if (e < n) s += r[t] * static_cast<C>(load(row[e]));
  }
  return warp_sum(s);
}

template <class T>
__global__ void attention_forward_kernel(AttentionDims g, compute_of<T> scale, T* __restrict__ o,
                                         compute_of<T>* __restrict__ lse, const T* __restrict__ q,
                                         const T* __restrict__ k, const T* __restrict__ v) {
  using C = compute_of<T>;
  const int lane = threadIdx.x & 31;
  for (int64_t row = warp_id(); row < g.B * g.Lq; row += warps_total()) {
    const int64_t b = row / g.Lq, i = row - b * g.Lq;
    C qr[kPer], acc[kPer];
    load_row(qr, q + row * g.E, g.E, lane);
#pragma unroll
    for (int t = 0; t < kPer; ++t) acc[t] = 0;
    C m = -INFINITY, l = 0;
    const int64_t kend = g.causal ? (i + 1 < g.Lk ? i + 1 : g.Lk) : g.Lk;
    const T* kb = k + b * g.Lk * g.E;
    const T* vb = v + b * g.Lk * g.Ev;
    for (int64_t j = 0; j < kend; ++j) {
      const C s = dot_row(qr, kb + j * g.E, g.E, lane) * scale;
      const C mx = m < s ? s : m;  // std::max(m, s), as the CPU kernel
      const C alpha = d_exp(m - mx);
      const C p = d_exp(s - mx);
      l = l * alpha + p;
      m = mx;
      const T* vr = vb + j * g.Ev;
#pragma unroll
      for (int t = 0; t < kPer; ++t) {
        const int64_t e = lane + 32 * t;
        if (e < g.Ev) acc[t] = acc[t] * alpha + p * static_cast<C>(load(vr[e]));
      }
    }
    const C inv = C(1) / l;
#pragma unroll
    for (int t = 0; t < kPer; ++t) {
      const int64_t e = lane + 32 * t;
      if (e < g.Ev) o[row * g.Ev + e] = store<T>(acc[t] * inv);
    }
    if (lane == 0) lse[row] = m + d_log(l);
  }
}

/// D_i = sum_e dO_ie O_ie per query row.
template <class T>
__global__ void attention_d_kernel(AttentionDims g, compute_of<T>* __restrict__ d,
                                   const T* __restrict__ o, const T* __restrict__ dout) {
  using C = compute_of<T>;
  const int lane = threadIdx.x & 31;
  for (int64_t row = warp_id(); row < g.B * g.Lq; row += warps_total()) {
    C r[kPer];
    load_row(r, dout + row * g.Ev, g.Ev, lane);
    const C s = dot_row(r, o + row * g.Ev, g.Ev, lane);
    if (lane == 0) d[row] = s;
  }
}

/// dq_i = scale * sum_j dS_ij k_j with dS_ij = P_ij (dO_i . v_j - D_i).
template <class T>
__global__ void attention_dq_kernel(AttentionDims g, compute_of<T> scale, T* __restrict__ dq,
                                    const T* __restrict__ q, const T* __restrict__ k,
                                    const T* __restrict__ v, const T* __restrict__ dout,
                                    const compute_of<T>* __restrict__ lse,
                                    const compute_of<T>* __restrict__ d) {
  using C = compute_of<T>;
  const int lane = threadIdx.x & 31;
  for (int64_t row = warp_id(); row < g.B * g.Lq; row += warps_total()) {
    const int64_t b = row / g.Lq, i = row - b * g.Lq;
    C qr[kPer], dor[kPer], acc[kPer];
    load_row(qr, q + row * g.E, g.E, lane);
    load_row(dor, dout + row * g.Ev, g.Ev, lane);
#pragma unroll
    for (int t = 0; t < kPer; ++t) acc[t] = 0;
    const C li = lse[row], di = d[row];
    const int64_t kend = g.causal ? (i + 1 < g.Lk ? i + 1 : g.Lk) : g.Lk;
    const T* kb = k + b * g.Lk * g.E;
    const T* vb = v + b * g.Lk * g.Ev;
    for (int64_t j = 0; j < kend; ++j) {
      const T* kr = kb + j * g.E;
      const C p = d_exp(dot_row(qr, kr, g.E, lane) * scale - li);
      const C ds = p * (dot_row(dor, vb + j * g.Ev, g.Ev, lane) - di);
#pragma unroll
      for (int t = 0; t < kPer; ++t) {
        const int64_t e = lane + 32 * t;
        if (e < g.E) acc[t] += ds * static_cast<C>(load(kr[e]));
      }
    }
#pragma unroll
    for (int t = 0; t < kPer; ++t) {
      const int64_t e = lane + 32 * t;
      if (e < g.E) dq[row * g.E + e] = store<T>(acc[t] * scale);
    }
  }
}

/// dk_j = scale * sum_i dS_ij q_i and dv_j = sum_i P_ij dO_i, per key row j.
template <class T>
__global__ void attention_dkdv_kernel(AttentionDims g, compute_of<T> scale, T* __restrict__ dk,
                                      T* __restrict__ dv, const T* __restrict__ q,
                                      const T* __restrict__ k, const T* __restrict__ v,
                                      const T* __restrict__ dout,
                                      const compute_of<T>* __restrict__ lse,
                                      const compute_of<T>* __restrict__ d) {
  using C = compute_of<T>;
  const int lane = threadIdx.x & 31;
  for (int64_t row = warp_id(); row < g.B * g.Lk; row += warps_total()) {
    const int64_t b = row / g.Lk, j = row - b * g.Lk;
    C kr[kPer], vr[kPer], dka[kPer], dva[kPer];
    load_row(kr, k + row * g.E, g.E, lane);
    load_row(vr, v + row * g.Ev, g.Ev, lane);
#pragma unroll
    for (int t = 0; t < kPer; ++t) dka[t] = dva[t] = 0;
    const T* qb = q + b * g.Lq * g.E;
    const T* db = dout + b * g.Lq * g.Ev;
    // Causal: queries before j do not see key j.
    for (int64_t i = g.causal ? j : 0; i < g.Lq; ++i) {
      const T* qi = qb + i * g.E;
      const T* doi = db + i * g.Ev;
      const C p = d_exp(dot_row(kr, qi, g.E, lane) * scale - lse[b * g.Lq + i]);
      const C ds = p * (dot_row(vr, doi, g.Ev, lane) - d[b * g.Lq + i]);
#pragma unroll
      for (int t = 0; t < kPer; ++t) {
        const int64_t e = lane + 32 * t;
        if (e < g.Ev) dva[t] += p * static_cast<C>(load(doi[e]));
        if (e < g.E) dka[t] += ds * static_cast<C>(load(qi[e]));
      }
    }
#pragma unroll
    for (int t = 0; t < kPer; ++t) {
      const int64_t e = lane + 32 * t;
      if (e < g.E) dk[row * g.E + e] = store<T>(dka[t] * scale);
      if (e < g.Ev) dv[row * g.Ev + e] = store<T>(dva[t]);
    }
  }
}

unsigned warp_blocks(int64_t rows) {
  const int64_t b = (rows + kWarpsPerBlock - 1) / kWarpsPerBlock;
  return static_cast<unsigned>(b < 1 ? 1 : (b > (int64_t{1} << 20) ? (int64_t{1} << 20) : b));
}

void check_dims(const AttentionDims& g) {
  if (g.E > kMaxAttentionDim || g.Ev > kMaxAttentionDim)
    fail("[sdpa] the CUDA kernel handles head dims up to ", kMaxAttentionDim, ", got E=", g.E,
         " Ev=", g.Ev);
}

}  // namespace

void launch_attention(Dtype dt, const AttentionDims& g, double scale, void* o, void* lse,
                      const void* q, const void* k, const void* v, cudaStream_t s) {
  check_dims(g);
  if (g.B * g.Lq == 0) return;
  dispatch_device_float(dt, "sdpa", [&]<class T>() {
    using C = compute_of<T>;
    attention_forward_kernel<T><<<warp_blocks(g.B * g.Lq), 32 * kWarpsPerBlock, 0, s>>>(
        g, static_cast<C>(scale), static_cast<T*>(o), static_cast<C*>(lse),
        static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v));
    HT_CUDA_CHECK_LAUNCH("attention_forward_kernel");
  });
}

void launch_attention_backward(Dtype dt, const AttentionDims& g, double scale, void* dq, void* dk,
                               void* dv, void* d_rows, const void* q, const void* k, const void* v,
                               const void* o, const void* dout, const void* lse, cudaStream_t s) {
  check_dims(g);
  dispatch_device_float(dt, "sdpa_backward", [&]<class T>() {
    using C = compute_of<T>;
    const auto* qp = static_cast<const T*>(q);
    const auto* kp = static_cast<const T*>(k);
    const auto* vp = static_cast<const T*>(v);
    const auto* dop = static_cast<const T*>(dout);
    const auto* lp = static_cast<const C*>(lse);
    auto* dr = static_cast<C*>(d_rows);
    if (g.B * g.Lq > 0) {
      attention_d_kernel<T><<<warp_blocks(g.B * g.Lq), 32 * kWarpsPerBlock, 0, s>>>(
          g, dr, static_cast<const T*>(o), dop);
      HT_CUDA_CHECK_LAUNCH("attention_d_kernel");
      attention_dq_kernel<T><<<warp_blocks(g.B * g.Lq), 32 * kWarpsPerBlock, 0, s>>>(
          g, static_cast<C>(scale), static_cast<T*>(dq), qp, kp, vp, dop, lp, dr);
      HT_CUDA_CHECK_LAUNCH("attention_dq_kernel");
    }
    if (g.B * g.Lk > 0) {
      attention_dkdv_kernel<T><<<warp_blocks(g.B * g.Lk), 32 * kWarpsPerBlock, 0, s>>>(
          g, static_cast<C>(scale), static_cast<T*>(dk), static_cast<T*>(dv), qp, kp, vp, dop, lp,
          dr);
      HT_CUDA_CHECK_LAUNCH("attention_dkdv_kernel");
    }
  });
}

}  // namespace hetrain::cuda
