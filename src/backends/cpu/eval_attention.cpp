// Fused CPU attention, flash-attention style. The forward walks key blocks for each block of
// query rows with an online softmax, so a task holds one (Bq x Bk) score tile, never the
// (Lq x Lk) matrix. The backward (flash-attention-2) recomputes each probability tile from
// q, k and the saved row logsumexp. Block products go through sgemm/dgemm, or, for bf16 operands
// on a CPU with a bf16 matmul unit, through one batched oneDNN bf16 matmul per group of
// batch-heads (the BFloat16 overloads of attention_forward and attention_backward below).

// Lets GCC if-convert the float selects of cpu::vexp so the tile exp loops vectorise (as in
// eval_nn.cpp; nothing here reads FP exception flags).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math")
#endif
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "backends/cpu/compute_buffers.h"
#include "backends/cpu/isa.h"
#include "backends/cpu/omp_single.h"
#include "backends/cpu/vec_math.h"
#include "graph/prims/attention.h"
#include "hetrain/base/thread_pool.h"

namespace hetrain {

namespace {

using cpu::as_contiguous;
using cpu::compute_dtype;
using cpu::dispatch_compute;
using cpu::finish_output;
using cpu::gemm;
using cpu::start_output;
using cpu::workspace;

constexpr int64_t kBq = 128;  // query rows per tile
constexpr int64_t kBk = 256;  // keys per tile

struct AttnGeom {
  int64_t B, Lq, Lk, E, Ev;
  bool causal;
};

AttnGeom attn_geom(const Shape& q, const Shape& v, bool causal) {
  const size_t n = q.size();
  AttnGeom g{1, q[n - 2], v[n - 2], q[n - 1], v[n - 1], causal};
  for (size_t d = 0; d + 2 < n; ++d) g.B *= q[d];
  return g;
}

/// Where one operand's rows are: batch-head b = n * heads + h starts at n * sn + h * sh, its rows
/// are ld apart and its elements contiguous. A plain (B..., L, E) array is heads = 1, sn = L * E,
/// ld = E; a packed (N, L, 3D) projection is heads = H, sn = 3LD, sh = D / H, ld = 3D, with q, k
/// and v starting at columns 0, D and 2D.
template <class T>
struct Rows {
  T* base;
  int64_t heads, sn, sh, ld;
  T* at(int64_t b, int64_t row = 0) const {
    return base + b / heads * sn + b % heads * sh + row * ld;
  }
};

/// Separate (B..., L, E) operands: q and k (part 0, 1) are E wide, v (part 2) and the output Ev.
struct PlainGeom {
  AttnGeom g;
  template <class T>
  Rows<T> rows(T* p, int64_t part) const {
    const int64_t L = part == 0 ? g.Lq : g.Lk, E = part == 2 ? g.Ev : g.E;
    return {p, 1, L * E, 0, E};
  }
  template <class T>
  Rows<T> out_rows(T* p) const {
    return {p, 1, g.Lq * g.Ev, 0, g.Ev};
  }
};

/// A packed (N, L, 3D) projection with H heads of d = D / H: batch-head n * H + h of q, k or v
/// (part 0, 1, 2) is columns [part * D + h * d, + d) of image n; the output (N, L, D) holds head
/// h at columns [h * d, + d).
struct PackedGeom {
  AttnGeom g;  // B = N * H batch-heads, Lq = Lk = L, E = Ev = d
  int64_t H;
  template <class T>
  Rows<T> rows(T* x, int64_t part) const {
    const int64_t D = H * g.E;
    return {x + part * D, H, g.Lq * 3 * D, g.E, 3 * D};
  }
  template <class T>
  Rows<T> out_rows(T* y) const {
    return {y, H, g.Lq * H * g.E, g.E, H * g.E};
  }
};

PackedGeom packed_geom(const Shape& qkv, int64_t heads, bool causal) {
  const int64_t L = qkv[1], d = qkv[2] / 3 / heads;
  return {{qkv[0] * heads, L, L, d, d, causal}, heads};
}

/// Keys [0, limit) of a tile starting at key j0 are visible to query row i.
int64_t visible(const AttnGeom& g, int64_t i, int64_t j0, int64_t nk) {
  return g.causal ? std::clamp<int64_t>(i - j0 + 1, 0, nk) : nk;
}

/// Zeros rows [r0, r0 + n) of batch-head b, `width` elements each.
template <class T>
void zero_rows(const Rows<T>& a, int64_t b, int64_t r0, int64_t n, int64_t width) {
  for (int64_t r = r0; r < r0 + n; ++r) std::fill(a.at(b, r), a.at(b, r) + width, T(0));
}

/// Score tiles are kBk wide and their rows padded to whole vectors: exp runs over every lane of a
/// row's last vector (the lanes past its visible keys are zeroed after), so no row ends in a
/// scalar loop. The padding is a whole number of 16-lane vectors, what AVX-512 holds.
constexpr int64_t kPad = 16;
static_assert(kBk % kPad == 0);
int64_t padded(int64_t n) { return (n + kPad - 1) / kPad * kPad; }

/// Max of s[0, n) and m, ignoring NaN as std::max(m, s[c]) in a row would; eight partial maxima
/// in one vector so the loop vectorises (the max is exact, so the order does not change it).
template <class T>
[[gnu::always_inline]] inline T tile_row_max(const T* s, int64_t n, T m) {
  cpu::Lanes8<T> acc = {m, m, m, m, m, m, m, m};
  int64_t c = 0;
  for (; c + 8 <= n; c += 8) {
    cpu::Lanes8<T> v;
    std::memcpy(&v, s + c, sizeof v);
    acc = v > acc ? v : acc;
  }
  for (; c < n; ++c) acc[0] = s[c] > acc[0] ? s[c] : acc[0];
  for (int j = 1; j < 8; ++j) m = acc[j] > m ? acc[j] : m;
  return acc[0] > m ? acc[0] : m;
}

/// s[c] = exp(s[c] - shift) for the lim visible keys of a row (over whole vectors), 0 for the
/// rest of its nk; returns the sum of the visible ones (eight partial sums in a fixed order).
template <class T>
[[gnu::always_inline]] inline T exp_row(T* s, int64_t lim, int64_t nk, T shift) {
  const int64_t np = lim > 0 ? padded(lim) : 0;
  for (int64_t c = nk; c < np; ++c) s[c] = T(0);  // past the tile: never written by its GEMM
  for (int64_t c = 0; c < np; ++c) s[c] = cpu::vexp(s[c] - shift);
  const T sum = cpu::row_sum(s, lim, [](T v) { return v; });
  for (int64_t c = lim; c < nk; ++c) s[c] = T(0);
  return sum;
}

/// Forward, one (nq x nk) score tile of scaled q.k products: folds it into each row's running max
/// m, sum l and output accumulator acc (online softmax) and leaves the tile's probabilities,
/// exp(s - m), for the product with v.
struct OnlineSoftmax {
  template <cpu::Isa, class T>
  [[gnu::always_inline]] static inline void run(T* S, int64_t ld, const AttnGeom& g, int64_t i0,
                                                int64_t nq, int64_t j0, int64_t nk, T* m, T* l,
                                                T* acc) {
    for (int64_t r = 0; r < nq; ++r) {
      T* s = S + r * ld;
      const int64_t lim = visible(g, i0 + r, j0, nk);
      // Row r saw key 0 in the first tile, so mx is finite from then on.
      const T mx = tile_row_max(s, lim, m[r]);
      const T alpha = cpu::vexp(m[r] - mx);
      const T sum = exp_row(s, lim, nk, mx);
      l[r] = l[r] * alpha + sum;
      m[r] = mx;
      if (alpha != T(1)) {
        T* a = acc + r * g.Ev;
        for (int64_t e = 0; e < g.Ev; ++e) a[e] *= alpha;
      }
    }
  }
};

/// Forward, the tile's last step: each output row is its accumulator over its sum (rounded to
/// the output's dtype U).
struct FinishRows {
  template <cpu::Isa, class T, class U>
  [[gnu::always_inline]] static inline void run(const T* acc, const T* l, int64_t nq, int64_t Ev,
                                                const Rows<U>& O, int64_t b, int64_t i0) {
    for (int64_t r = 0; r < nq; ++r) {
      const T inv = T(1) / l[r];
      U* o = O.at(b, i0 + r);
      const T* a = acc + r * Ev;
      for (int64_t e = 0; e < Ev; ++e) cpu::store_compute(o + e, a[e] * inv);
    }
  }
};

/// Backward, one tile: P = exp(s - lse) from the recomputed scores (0 past each row's visible
/// keys).
struct TileProbs {
  template <cpu::Isa, class T>
  [[gnu::always_inline]] static inline void run(T* P, int64_t ld, const AttnGeom& g, int64_t i0,
                                                int64_t nq, int64_t j0, int64_t nk, const T* lse) {
    for (int64_t r = 0; r < nq; ++r)
      exp_row(P + r * ld, visible(g, i0 + r, j0, nk), nk, lse[i0 + r]);
  }
};

/// Backward, one tile: dS = P * (dP - D), the softmax gradient, in place of dP.
struct SoftmaxGrad {
  template <cpu::Isa, class T>
  [[gnu::always_inline]] static inline void run(const T* P, T* dS, int64_t ld, int64_t nq,
                                                int64_t nk, const T* D) {
    for (int64_t r = 0; r < nq; ++r) {
      const T d = D[r];
      const T* p = P + r * ld;
      T* ds = dS + r * ld;
      for (int64_t c = 0; c < nk; ++c) ds[c] = p[c] * (ds[c] - d);
    }
  }
};

/// D[r - r0] = rowsum(dO_r * O_r) in the compute type for rows [r0, r1) of all batch-heads, L
/// rows each: eight partial sums in a fixed order (cpu::row_dot; one running sum was a chain of
/// dependent adds, a twelfth of the f32 backward's time at d = 32).
struct RowDots {
  template <cpu::Isa, class T>
  [[gnu::always_inline]] static inline void run(const Rows<const T>& dO, const Rows<const T>& O,
                                                int64_t r0, int64_t r1, int64_t L, int64_t E,
                                                compute_t<T>* D) {
    for (int64_t r = r0; r < r1; ++r)
      D[r - r0] = cpu::row_dot(dO.at(r / L, r % L), O.at(r / L, r % L), E);
  }
};

template <class T>
void attention_forward(Rows<const T> Q, Rows<const T> K, Rows<const T> V, Rows<T> O, T* LSE,
                       const AttnGeom& g, T scale) {
  const Dtype dt = dtype_of<T>();
  const int64_t nqb = (g.Lq + kBq - 1) / kBq;
  parallel_for(g.B * nqb, 1, [&](int64_t t0, int64_t t1) {
    Array ws = workspace({kBq * kBk + kBq * g.Ev + 2 * kBq}, dt);
    T* S = ws.data<T>();
    T* acc = S + kBq * kBk;
    T* m = acc + kBq * g.Ev;
    T* l = m + kBq;
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t b = t / nqb, i0 = (t % nqb) * kBq, nq = std::min(kBq, g.Lq - i0);
      const T* q = Q.at(b, i0);
      const T* k = K.at(b);
      const T* v = V.at(b);
      std::fill(m, m + nq, -std::numeric_limits<T>::infinity());
      std::fill(l, l + nq, T(0));
      std::fill(acc, acc + nq * g.Ev, T(0));
      const int64_t kend = g.causal ? std::min(g.Lk, i0 + nq) : g.Lk;
      for (int64_t j0 = 0; j0 < kend; j0 += kBk) {
        const int64_t nk = std::min(kBk, kend - j0);
        gemm<T>(false, true, nq, nk, g.E, scale, q, Q.ld, k + j0 * K.ld, K.ld, T(0), S, kBk);
        cpu::isa_dispatch<OnlineSoftmax>(S, kBk, g, i0, nq, j0, nk, m, l, acc);
        gemm<T>(false, false, nq, g.Ev, nk, T(1), S, kBk, v + j0 * V.ld, V.ld, T(1), acc, g.Ev);
      }
      cpu::isa_dispatch<FinishRows>(static_cast<const T*>(acc), static_cast<const T*>(l), nq, g.Ev,
                                    O, b, i0);
      for (int64_t r = 0; r < nq; ++r) LSE[b * g.Lq + i0 + r] = m[r] + std::log(l[r]);
    }
  });
}

template <class T>
void attention_backward(Rows<const T> Q, Rows<const T> K, Rows<const T> V, Rows<const T> O,
                        Rows<const T> dO, const T* LSE, Rows<T> dQ, Rows<T> dK, Rows<T> dV,
                        const AttnGeom& g, T scale) {
  const Dtype dt = dtype_of<T>();
  // D_i = rowsum(dO_i * O_i), the softmax-backward correction per query row.
  Array dws = workspace({g.B * g.Lq}, dt);
  T* D = dws.data<T>();
  parallel_for(g.B * g.Lq, 256, [&](int64_t r0, int64_t r1) {
    cpu::isa_dispatch<RowDots>(dO, O, r0, r1, g.Lq, g.Ev, D + r0);
  });
  // Tasks own disjoint key blocks (their dK, dV rows). dQ sums over key blocks: with fewer
  // batch-heads than threads, the key blocks of one head are split and each split adds
  // into its own dQ partial (O(L) memory), summed at the end in a fixed order.
  const int64_t nkb = (g.Lk + kBk - 1) / kBk;
  const int64_t splits =
      std::clamp<int64_t>((num_threads() + g.B - 1) / std::max<int64_t>(g.B, 1), 1, nkb);
  const int64_t qsize = g.Lq * g.E;
  Array partial;
  if (splits > 1) {
    partial = workspace({(splits - 1) * g.B * qsize}, dt);
    std::fill(partial.data<T>(), partial.data<T>() + partial.numel(), T(0));
  }
  // Each gradient row is written by its first product (beta 0) and added to by the rest, so
  // only rows that no product reaches are zeroed: dQ where there are no keys, a key block's dK and
  // dV where no query sees it. (Zeroing every row first, d floats at a time, was a twentieth of
  // the backward's time at d = 32.)
  if (nkb == 0)
    parallel_for(g.B, 1, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) zero_rows(dQ, b, 0, g.Lq, g.E);
    });
  parallel_for(g.B * splits, 1, [&](int64_t t0, int64_t t1) {
    Array ws = workspace({2 * kBq * kBk}, dt);
    T* P = ws.data<T>();
    T* dS = P + kBq * kBk;
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t b = t / splits, sp = t % splits;
      const T* q = Q.at(b);
      const T* k = K.at(b);
      const T* v = V.at(b);
      const T* lse = LSE + b * g.Lq;
      const T* Db = D + b * g.Lq;
      T* dq = sp == 0 ? dQ.at(b) : partial.data<T>() + ((sp - 1) * g.B + b) * qsize;
      const int64_t ldq = sp == 0 ? dQ.ld : g.E;
      for (int64_t jb = sp * nkb / splits; jb < (sp + 1) * nkb / splits; ++jb) {
        const int64_t j0 = jb * kBk, nk = std::min(kBk, g.Lk - j0);
        T* dk = dK.at(b, j0);
        T* dv = dV.at(b, j0);
        // Causal: rows before j0 see none of these keys.
        const int64_t first_i0 = g.causal ? j0 : 0;
        if (first_i0 >= g.Lq) {
          zero_rows(dK, b, j0, nk, g.E);
          zero_rows(dV, b, j0, nk, g.Ev);
        }
        // dq rows start in the split's first key block, which every query tile reaches (in
        // split 0, key block 0; the other splits' partials start zeroed).
        const T dq_beta = sp == 0 && jb == 0 ? T(0) : T(1);
        for (int64_t i0 = first_i0; i0 < g.Lq; i0 += kBq) {
          const int64_t nq = std::min(kBq, g.Lq - i0);
          const T kv_beta = i0 == first_i0 ? T(0) : T(1);
          gemm<T>(false, true, nq, nk, g.E, scale, q + i0 * Q.ld, Q.ld, k + j0 * K.ld, K.ld, T(0),
                  P, kBk);
          cpu::isa_dispatch<TileProbs>(P, kBk, g, i0, nq, j0, nk, lse);
          const T* doi = dO.at(b, i0);
          gemm<T>(true, false, nk, g.Ev, nq, T(1), P, kBk, doi, dO.ld, kv_beta, dv, dV.ld);
          gemm<T>(false, true, nq, nk, g.Ev, T(1), doi, dO.ld, v + j0 * V.ld, V.ld, T(0), dS, kBk);
          cpu::isa_dispatch<SoftmaxGrad>(static_cast<const T*>(P), dS, kBk, nq, nk, Db + i0);
          gemm<T>(false, false, nq, g.E, nk, scale, dS, kBk, k + j0 * K.ld, K.ld, dq_beta,
                  dq + i0 * ldq, ldq);
          gemm<T>(true, false, nk, g.E, nq, scale, dS, kBk, q + i0 * Q.ld, Q.ld, kv_beta, dk,
                  dK.ld);
        }
      }
    }
  });
  for (int64_t sp = 1; sp < splits; ++sp)
    parallel_for(g.B * g.Lq, 256, [&](int64_t r0, int64_t r1) {
      const T* p = partial.data<T>() + (sp - 1) * g.B * qsize;
      for (int64_t r = r0; r < r1; ++r) {
        T* dq = dQ.at(r / g.Lq, r % g.Lq);
        for (int64_t e = 0; e < g.E; ++e) dq[e] += p[r * g.E + e];
      }
    });
}

// bf16 attention where batched oneDNN bf16 matmuls pay (cpu::bf16_attention_path(): AMX).
// The same tiles and softmax kernels, walked for a group of batch-heads at once, so each tile
// product is one batched oneDNN matmul over the group instead of one small f32 GEMM per
// batch-head. The products take bf16 operands (q, k, v and dO as given; the probabilities and dS
// rounded to bf16, as PyTorch's CPU flash attention does) and accumulate in f32; the softmax, its
// statistics and the accumulators stay f32.
//
// Each group is one task of a single parallel_for, start to end on one thread: its head-major
// copies, tiles and f32 accumulators stay in that core's cache between the steps, and the
// group's matmuls run single-threaded inside the task. (Walking all batch-heads as one group with
// every step a parallel region of its own streamed the tiles through memory and left one thread
// waiting at each of the seven or more joins a call.) The group size depends on the shape only,
// never on the thread count, so the results do not either.

/// Workspace bytes a group aims at: about a core's L2, so that its steps find their operands in
/// cache. A group holds at least one batch-head, whatever that takes.
constexpr int64_t kGroupBytes = int64_t{2} << 20;

/// A group's tile buffers: rows ld apart, batch-head h's tile at h * tq * ld; G heads a group.
struct GroupTiles {
  int64_t tq, ld, G;
  int64_t stride() const { return tq * ld; }
};

/// Workspace bytes per batch-head of a group, the backward's (the larger): q, k, v and dO copied
/// as bf16, dq, dk and dv accumulated in f32, two f32 tiles and three bf16 ones
/// (a group's one staging tile for P before its transpose is not counted).
int64_t group_bytes_per_head(const AttnGeom& g, int64_t tile) {
  const int64_t q = g.Lq * g.E, k = g.Lk * g.E, v = g.Lk * g.Ev, o = g.Lq * g.Ev;
  return 2 * (q + k + v + o) + 4 * (q + k + v) + (2 * 4 + 3 * 2) * tile;
}

/// The tiles and the group size: the largest power of two of batch-heads (at most all of them)
/// whose workspace fits kGroupBytes, so that groups split evenly over a power-of-two team.
GroupTiles group_tiles(const AttnGeom& g) {
  const int64_t tq = std::min(kBq, g.Lq), ld = padded(std::min(kBk, g.Lk));
  // tq is 0 for q with no rows (k and v are never empty): one group, no tiles.
  const int64_t per_head = std::max<int64_t>(group_bytes_per_head(g, tq * ld), 1);
  int64_t G = 1;
  while (2 * G * per_head <= kGroupBytes && 2 * G <= g.B) G *= 2;
  return {tq, ld, G};
}

/// Rows [0, nq) of an f32 tile, nk wide, rounded to bf16 (the products' operand).
struct TileToBf16 {
  template <cpu::Isa>
  [[gnu::always_inline]] static inline void run(const float* S, BFloat16* P, int64_t ld, int64_t nq,
                                                int64_t nk) {
    for (int64_t r = 0; r < nq; ++r)
      for (int64_t c = 0; c < nk; ++c) cpu::store_compute(P + r * ld + c, S[r * ld + c]);
  }
};

/// Columns j of eight rows a[0..8), as eight vectors: out[j][i] = a[i][j] (three rounds of lane
/// shuffles; the values only move).
template <class V>
[[gnu::always_inline]] inline void transpose8(const V (&a)[8], V (&out)[8]) {
  V t[8], u[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = __builtin_shufflevector(a[i], a[i + 1], 0, 8, 1, 9, 4, 12, 5, 13);
    t[i + 1] = __builtin_shufflevector(a[i], a[i + 1], 2, 10, 3, 11, 6, 14, 7, 15);
  }
  for (int i = 0; i < 8; i += 4)
    for (int j = 0; j < 2; ++j) {
      u[i + 2 * j] = __builtin_shufflevector(t[i + j], t[i + j + 2], 0, 1, 8, 9, 4, 5, 12, 13);
      u[i + 2 * j + 1] =
          __builtin_shufflevector(t[i + j], t[i + j + 2], 2, 3, 10, 11, 6, 7, 14, 15);
    }
  for (int j = 0; j < 4; ++j) {
    out[j] = __builtin_shufflevector(u[j], u[j + 4], 0, 1, 2, 3, 8, 9, 10, 11);
    out[j + 4] = __builtin_shufflevector(u[j], u[j + 4], 4, 5, 6, 7, 12, 13, 14, 15);
  }
}

/// A bf16 tile of nq rows of nk (ld apart) stored transposed, nk rows of nq (ldt apart): the A
/// operand of a product that reads the tile transposed (Pᵀ·dO, dSᵀ·Q), which oneDNN's batched
/// matmul runs about 1.4x slower from a transposed layout than from a plain one. Whole 8 x 8
/// blocks go through vector shuffles of the bits, the edges element by element.
struct TransposeTile {
  template <cpu::Isa>
  [[gnu::always_inline]] static inline void run(const BFloat16* P, BFloat16* PT, int64_t ld,
                                                int64_t ldt, int64_t nq, int64_t nk) {
    using V = cpu::Lanes8<uint16_t>;
    const int64_t rq = nq / 8 * 8, ck = nk / 8 * 8;
    for (int64_t r0 = 0; r0 < rq; r0 += 8)
      for (int64_t c0 = 0; c0 < ck; c0 += 8) {
        V a[8], t[8];
        for (int i = 0; i < 8; ++i) std::memcpy(&a[i], P + (r0 + i) * ld + c0, sizeof a[i]);
        transpose8(a, t);
        for (int j = 0; j < 8; ++j)
          std::memcpy(static_cast<void*>(PT + (c0 + j) * ldt + r0), &t[j], sizeof t[j]);
      }
    for (int64_t c = 0; c < nk; ++c)  // the edges: rows past rq, and columns past ck
      for (int64_t r = c < ck ? rq : 0; r < nq; ++r) PT[c * ldt + r] = P[r * ld + c];
  }
};

/// Batch-heads [b0, b0 + n) of a (L x E) operand copied to (n, L, E), contiguous.
void gather_heads(const Rows<const BFloat16>& a, int64_t b0, int64_t n, int64_t L, int64_t E,
                  BFloat16* dst) {
  for (int64_t r = 0; r < n * L; ++r) {
    const auto* src = reinterpret_cast<const uint16_t*>(a.at(b0 + r / L, r % L));
    auto* out = reinterpret_cast<uint16_t*>(dst + r * E);
    for (int64_t e = 0; e < E; ++e) out[e] = src[e];  // E is short: inline, not a memmove call
  }
}

/// (n, L, E) f32 rounded into batch-heads [b0, b0 + n) of a bf16 operand.
struct ScatterHeads {
  template <cpu::Isa>
  [[gnu::always_inline]] static inline void run(const float* src, int64_t b0, int64_t n, int64_t L,
                                                int64_t E, const Rows<BFloat16>& a) {
    for (int64_t r = 0; r < n * L; ++r) {
      BFloat16* o = a.at(b0 + r / L, r % L);
      const float* x = src + r * E;
      for (int64_t e = 0; e < E; ++e) cpu::store_compute(o + e, x[e]);
    }
  }
};

/// One batched product over a group's n batch-heads: C_h = alpha op(A_h) op(B_h) (+ C_h), on the
/// calling thread (the task runs inside a parallel_for, under SingleOmpThread).
void group_gemm(int64_t n, int64_t M, int64_t N, int64_t K, float alpha, cpu::BatchOperand A,
                cpu::BatchOperand B, bool accumulate, float* C, int64_t sc, int64_t ldc) {
  cpu::batched_gemm_onednn(Dtype::bf16, Dtype::f32, n, M, N, K, alpha, A, B,
                           accumulate ? 1.0f : 0.0f, C, sc, ldc);
}

/// fn(b0, n) for every group of batch-heads, the groups spread over the pool, each on one thread
/// with oneDNN's team at one.
template <class F>
void for_groups(const AttnGeom& g, const GroupTiles& t, F&& fn) {
  const int64_t groups = (g.B + t.G - 1) / t.G;
  parallel_for(groups, 1, [&](int64_t c0, int64_t c1) {
    cpu::SingleOmpThread one;
    for (int64_t c = c0; c < c1; ++c) fn(c * t.G, std::min(t.G, g.B - c * t.G));
  });
}

void attention_forward(Rows<const BFloat16> Q, Rows<const BFloat16> K, Rows<const BFloat16> V,
                       Rows<BFloat16> O, float* LSE, const AttnGeom& g, float scale) {
  const GroupTiles t = group_tiles(g);
  const int64_t G = t.G, ts = t.stride();
  for_groups(g, t, [&](int64_t b0, int64_t n) {
    Array qc = workspace({G * g.Lq * g.E}, Dtype::bf16),
          kc = workspace({G * g.Lk * g.E}, Dtype::bf16),
          vc = workspace({G * g.Lk * g.Ev}, Dtype::bf16);
    Array sw = workspace({G * ts}, Dtype::f32), pw = workspace({G * ts}, Dtype::bf16);
    Array aw = workspace({G * t.tq * g.Ev + 2 * G * t.tq}, Dtype::f32);
    auto* q = qc.data<BFloat16>();
    auto* k = kc.data<BFloat16>();
    auto* v = vc.data<BFloat16>();
    float* S = sw.data<float>();
    auto* P = pw.data<BFloat16>();
    float* acc = aw.data<float>();
    float* m = acc + G * t.tq * g.Ev;
    float* l = m + G * t.tq;
    gather_heads(Q, b0, n, g.Lq, g.E, q);
    gather_heads(K, b0, n, g.Lk, g.E, k);
    gather_heads(V, b0, n, g.Lk, g.Ev, v);
    for (int64_t i0 = 0; i0 < g.Lq; i0 += kBq) {
      const int64_t nq = std::min(kBq, g.Lq - i0);
      std::fill(m, m + n * t.tq, -std::numeric_limits<float>::infinity());
      std::fill(l, l + n * t.tq, 0.0f);
      std::fill(acc, acc + n * t.tq * g.Ev, 0.0f);
      const int64_t kend = g.causal ? std::min(g.Lk, i0 + nq) : g.Lk;
      for (int64_t j0 = 0; j0 < kend; j0 += kBk) {
        const int64_t nk = std::min(kBk, kend - j0);
        group_gemm(n, nq, nk, g.E, scale, {q + i0 * g.E, g.Lq * g.E, g.E, false},
                   {k + j0 * g.E, g.Lk * g.E, g.E, true}, false, S, ts, t.ld);
        for (int64_t h = 0; h < n; ++h) {
          cpu::isa_dispatch<OnlineSoftmax>(S + h * ts, t.ld, g, i0, nq, j0, nk, m + h * t.tq,
                                           l + h * t.tq, acc + h * t.tq * g.Ev);
          cpu::isa_dispatch<TileToBf16>(static_cast<const float*>(S + h * ts), P + h * ts, t.ld, nq,
                                        nk);
        }
        group_gemm(n, nq, g.Ev, nk, 1.0f, {P, ts, t.ld, false},
                   {v + j0 * g.Ev, g.Lk * g.Ev, g.Ev, false}, true, acc, t.tq * g.Ev, g.Ev);
      }
      for (int64_t h = 0; h < n; ++h) {
        const float* lh = l + h * t.tq;
        const float* mh = m + h * t.tq;
        cpu::isa_dispatch<FinishRows>(static_cast<const float*>(acc + h * t.tq * g.Ev), lh, nq,
                                      g.Ev, O, b0 + h, i0);
        for (int64_t r = 0; r < nq; ++r) LSE[(b0 + h) * g.Lq + i0 + r] = mh[r] + std::log(lh[r]);
      }
    }
  });
}

void attention_backward(Rows<const BFloat16> Q, Rows<const BFloat16> K, Rows<const BFloat16> V,
                        Rows<const BFloat16> O, Rows<const BFloat16> dO, const float* LSE,
                        Rows<BFloat16> dQ, Rows<BFloat16> dK, Rows<BFloat16> dV, const AttnGeom& g,
                        float scale) {
  const GroupTiles t = group_tiles(g);
  const int64_t G = t.G, ts = t.stride();
  const int64_t qn = g.Lq * g.E, kn = g.Lk * g.E, vn = g.Lk * g.Ev, on = g.Lq * g.Ev;
  for_groups(g, t, [&](int64_t b0, int64_t n) {
    // D_i = rowsum(dO_i * O_i), the softmax-backward correction per query row of the group.
    Array dws = workspace({G * g.Lq}, Dtype::f32);
    float* D = dws.data<float>();
    cpu::isa_dispatch<RowDots>(dO, O, b0 * g.Lq, (b0 + n) * g.Lq, g.Lq, g.Ev, D);
    Array opw = workspace({G * (qn + kn + vn + on)}, Dtype::bf16);
    auto* q = opw.data<BFloat16>();
    auto* k = q + G * qn;
    auto* v = k + G * kn;
    auto* dout = v + G * vn;
    Array gw = workspace({G * (qn + kn + vn) + 2 * G * ts}, Dtype::f32);
    float* dq = gw.data<float>();
    float* dk = dq + G * qn;
    float* dv = dk + G * kn;
    float* P = dv + G * vn;
    float* dP = P + G * ts;
    // The bf16 tiles: P transposed (Pᵀ·dO reads it so), dS as is (dS·K) and transposed (dSᵀ·Q).
    // A transposed tile holds nk rows of tq (ts = tq * ld elements, as the plain one).
    // Pb is one head's P rounded, before its transpose.
    Array bw = workspace({3 * G * ts + ts}, Dtype::bf16);
    auto* PbT = bw.data<BFloat16>();
    auto* dSb = PbT + G * ts;
    auto* dSbT = dSb + G * ts;
    auto* Pb = dSbT + G * ts;
    gather_heads(Q, b0, n, g.Lq, g.E, q);
    gather_heads(K, b0, n, g.Lk, g.E, k);
    gather_heads(V, b0, n, g.Lk, g.Ev, v);
    gather_heads(dO, b0, n, g.Lq, g.Ev, dout);
    std::fill(dq, dq + n * qn, 0.0f);
    std::fill(dk, dk + n * kn, 0.0f);
    std::fill(dv, dv + n * vn, 0.0f);
    for (int64_t j0 = 0; j0 < g.Lk; j0 += kBk) {
      const int64_t nk = std::min(kBk, g.Lk - j0);
      // Causal: rows before j0 see none of these keys.
      for (int64_t i0 = g.causal ? j0 : 0; i0 < g.Lq; i0 += kBq) {
        const int64_t nq = std::min(kBq, g.Lq - i0);
        group_gemm(n, nq, nk, g.E, scale, {q + i0 * g.E, qn, g.E, false},
                   {k + j0 * g.E, kn, g.E, true}, false, P, ts, t.ld);
        for (int64_t h = 0; h < n; ++h) {
          cpu::isa_dispatch<TileProbs>(P + h * ts, t.ld, g, i0, nq, j0, nk, LSE + (b0 + h) * g.Lq);
          cpu::isa_dispatch<TileToBf16>(static_cast<const float*>(P + h * ts), Pb, t.ld, nq, nk);
          cpu::isa_dispatch<TransposeTile>(static_cast<const BFloat16*>(Pb), PbT + h * ts, t.ld,
                                           t.tq, nq, nk);
        }
        group_gemm(n, nk, g.Ev, nq, 1.0f, {PbT, ts, t.tq, false},
                   {dout + i0 * g.Ev, on, g.Ev, false}, true, dv + j0 * g.Ev, vn, g.Ev);
        group_gemm(n, nq, nk, g.Ev, 1.0f, {dout + i0 * g.Ev, on, g.Ev, false},
                   {v + j0 * g.Ev, vn, g.Ev, true}, false, dP, ts, t.ld);
        for (int64_t h = 0; h < n; ++h) {
          cpu::isa_dispatch<SoftmaxGrad>(static_cast<const float*>(P + h * ts), dP + h * ts, t.ld,
                                         nq, nk, static_cast<const float*>(D + h * g.Lq + i0));
          cpu::isa_dispatch<TileToBf16>(static_cast<const float*>(dP + h * ts), dSb + h * ts, t.ld,
                                        nq, nk);
          cpu::isa_dispatch<TransposeTile>(static_cast<const BFloat16*>(dSb + h * ts),
                                           dSbT + h * ts, t.ld, t.tq, nq, nk);
        }
        group_gemm(n, nq, g.E, nk, scale, {dSb, ts, t.ld, false}, {k + j0 * g.E, kn, g.E, false},
                   true, dq + i0 * g.E, qn, g.E);
        group_gemm(n, nk, g.E, nq, scale, {dSbT, ts, t.tq, false}, {q + i0 * g.E, qn, g.E, false},
                   true, dk + j0 * g.E, kn, g.E);
      }
    }
    cpu::isa_dispatch<ScatterHeads>(static_cast<const float*>(dq), b0, n, g.Lq, g.E, dQ);
    cpu::isa_dispatch<ScatterHeads>(static_cast<const float*>(dk), b0, n, g.Lk, g.E, dK);
    cpu::isa_dispatch<ScatterHeads>(static_cast<const float*>(dv), b0, n, g.Lk, g.Ev, dV);
  });
}

/// Whether bf16 operands run the batched bf16 products above.
bool bf16_attention(const std::vector<const Array*>& in) {
  if (cpu::bf16_attention_path() != cpu::Bf16AttentionPath::batched) return false;
  for (const Array* a : in)
    if (is_floating(a->dtype) && a->dtype != Dtype::bf16) return false;
  return true;
}

/// The dtype the kernels read and write: bf16 where bf16_attention() holds for the operands,
/// else the compute dtype (f16 and bf16 operands otherwise convert to f32).
Dtype operand_dtype(const std::vector<const Array*>& operands) {
  return bf16_attention(operands) ? Dtype::bf16 : compute_dtype(operands[0]->dtype);
}

/// Calls f.template operator()<T>() with T the element type of an operand dtype (bf16, f32, f64).
template <class F>
void dispatch_operand(Dtype dt, F&& f) {
  if (dt == Dtype::bf16)
    f.template operator()<BFloat16>();
  else
    dispatch_compute(dt, f);
}

}  // namespace

// The row logsumexp and the scale are in the operands' compute type (f32 for bf16 operands).
void SdpaForward::eval_cpu(const std::vector<const Array*>& in,
                           const std::vector<Array*>& out) const {
  const Dtype dt = operand_dtype(in);
  Array o = start_output(*out[0], dt);
  Array& lse = *out[1];
  lse.allocate();
  dispatch_operand(dt, [&]<class T>() {
    using C = compute_t<T>;
    const auto scale = static_cast<C>(scale_);
    if (heads_ > 0) {  // one packed (N, L, 3D) projection in, (N, L, D) out
      Array qkv = as_contiguous(*in[0], dt);
      const PackedGeom p = packed_geom(qkv.shape, heads_, causal_);
      const T* x = qkv.data<T>();
      attention_forward(p.rows(x, 0), p.rows(x, 1), p.rows(x, 2), p.out_rows(o.data<T>()),
                        lse.data<C>(), p.g, scale);
    } else {
      Array q = as_contiguous(*in[0], dt), k = as_contiguous(*in[1], dt),
            v = as_contiguous(*in[2], dt);
      const PlainGeom p{attn_geom(q.shape, v.shape, causal_)};
      attention_forward(p.rows<const T>(q.data<T>(), 0), p.rows<const T>(k.data<T>(), 1),
                        p.rows<const T>(v.data<T>(), 2), p.out_rows(o.data<T>()), lse.data<C>(),
                        p.g, scale);
    }
  });
  finish_output(o, *out[0]);
}

void SdpaBackward::eval_cpu(const std::vector<const Array*>& in,
                            const std::vector<Array*>& out) const {
  // Inputs: q, k, v (or the packed qkv), o, do, then the row logsumexp.
  const Dtype dt = operand_dtype({in.begin(), in.end() - 1});
  dispatch_operand(dt, [&]<class T>() {
    using C = compute_t<T>;
    const Dtype ct = dtype_of<C>();
    const auto scale = static_cast<C>(scale_);
    if (heads_ > 0) {  // inputs qkv, o, do, lse; output dqkv, all in the packed layout
      Array qkv = as_contiguous(*in[0], dt), o = as_contiguous(*in[1], dt),
            dout = as_contiguous(*in[2], dt), lse = as_contiguous(*in[3], ct);
      Array dqkv = start_output(*out[0], dt);
      const PackedGeom p = packed_geom(qkv.shape, heads_, causal_);
      const T* x = qkv.data<T>();
      T* dx = dqkv.data<T>();
      attention_backward(p.rows(x, 0), p.rows(x, 1), p.rows(x, 2),
                         p.out_rows(static_cast<const T*>(o.data<T>())),
                         p.out_rows(static_cast<const T*>(dout.data<T>())), lse.data<C>(),
                         p.rows(dx, 0), p.rows(dx, 1), p.rows(dx, 2), p.g, scale);
      finish_output(dqkv, *out[0]);
      return;
    }
    Array q = as_contiguous(*in[0], dt), k = as_contiguous(*in[1], dt),
          v = as_contiguous(*in[2], dt);
    Array o = as_contiguous(*in[3], dt), dout = as_contiguous(*in[4], dt);
    Array lse = as_contiguous(*in[5], ct);
    Array dq = start_output(*out[0], dt), dk = start_output(*out[1], dt),
          dv = start_output(*out[2], dt);
    const PlainGeom p{attn_geom(q.shape, v.shape, causal_)};
    attention_backward(p.rows<const T>(q.data<T>(), 0), p.rows<const T>(k.data<T>(), 1),
                       p.rows<const T>(v.data<T>(), 2), p.out_rows<const T>(o.data<T>()),
                       p.out_rows<const T>(dout.data<T>()), lse.data<C>(), p.rows(dq.data<T>(), 0),
                       p.rows(dk.data<T>(), 1), p.rows(dv.data<T>(), 2), p.g, scale);
    finish_output(dq, *out[0]);
    finish_output(dk, *out[1]);
    finish_output(dv, *out[2]);
  });
}

}  // namespace hetrain
