// Launchers of the CUDA kernels: plain structs and pointers, shared by the host code that
// implements Primitive::eval_cuda (C++20, src/backends/cuda/*.cpp) and the device code
// (src/backends/cuda/*.cu, compiled by nvcc). Every launcher queues on the given stream and
// checks the launch; none synchronises.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "backends/scalar_ops.h"
#include "hetrain/base/dtype.h"

namespace hetrain::cuda {

/// Most dimensions an elementwise iteration handles (after merging contiguous dimensions).
inline constexpr int kMaxDims = 8;
/// Most operands of one elementwise iteration (output included).
inline constexpr int kMaxOperands = 4;

/// An elementwise iteration over `shape` (row-major), with each operand's strides in
/// elements. Operand 0 is the output. `contiguous`: every operand is dense row-major, so
/// element i of each is at offset i.
struct Iter {
  int ndim = 0;
  int64_t numel = 0;
  bool contiguous = true;
  int64_t shape[kMaxDims] = {};
  int64_t strides[kMaxOperands][kMaxDims] = {};
};

/// The elementwise ops' ids, generated from the formula lists in backends/scalar_ops.h (the
/// kernels run those formulas).
using UnaryOp = formulas::UnaryId;
using BinaryOp = formulas::BinaryId;
using formulas::is_compare;

/// y = op(x) in x's compute type (f32 for f16/bf16). dt: f64, f32, f16, bf16, i32, i64.
void launch_unary(UnaryOp op, Dtype dt, const Iter& it, void* y, const void* x, cudaStream_t s);
/// y = op(a, b); y is bool for comparisons, else a's dtype.
void launch_binary(BinaryOp op, Dtype dt, const Iter& it, void* y, const void* a, const void* b,
                   cudaStream_t s);
/// y = c ? a : b (operands 1..3: c bool, a and b of dtype dt).
void launch_where(Dtype dt, const Iter& it, void* y, const void* c, const void* a, const void* b,
                  cudaStream_t s);
/// y = x converted from dx to dy (round to nearest even into f16/bf16; != 0 into bool).
void launch_cast(Dtype dx, Dtype dy, const Iter& it, void* y, const void* x, cudaStream_t s);

/// Reduction of x (dtype dt) into y: output element o reduces over `reduced` (its own
/// shape and strides in x) starting at the x offset of o in `kept` (shape and strides of
/// the kept dims in x; y is contiguous over them). Sum accumulates in f32 for f16/bf16.
struct ReduceDims {
  int kept_ndim = 0, red_ndim = 0;
  int64_t kept_shape[kMaxDims] = {}, kept_strides[kMaxDims] = {};
  int64_t red_shape[kMaxDims] = {}, red_strides[kMaxDims] = {};
  int64_t outputs = 1, reduced = 1;
};
enum class ReduceOp : uint8_t { sum, max, min };
/// Bytes of device workspace launch_reduce needs for d (0: none; then workspace may be null).
size_t reduce_workspace_bytes(const ReduceDims& d);
void launch_reduce(ReduceOp op, Dtype dt, const ReduceDims& d, void* y, const void* x,
                   void* workspace, cudaStream_t s);
/// argmax over the middle axis of a contiguous (O, R, I) array: y (O, I) int64 (the first
/// maximum; a NaN is the maximum, the first one wins).
void launch_argmax(Dtype dt, int64_t O, int64_t R, int64_t I, int64_t* y, const void* x,
                   cudaStream_t s);

/// softmax / log_softmax over the middle axis of a contiguous (O, R, I) array (float dtypes).
void launch_softmax(Dtype dt, bool log, int64_t O, int64_t R, int64_t I, void* y, const void* x,
                    cudaStream_t s);

/// layer_norm (center) / rms_norm over rows of n contiguous elements; w, b may be null.
/// stats: (rows, 2) = (mean, rstd) in f32 (f64 for f64).
void launch_norm(Dtype dt, bool center, int64_t rows, int64_t n, double eps, void* y, void* stats,
                 const void* x, const void* w, const void* b, cudaStream_t s);
/// Backward of launch_norm: dx per row; dw, db (either may be null) summed over rows in a
/// fixed order (deterministic): per chunk of rows into `partial` (2 * chunks * n values of
/// the stats type), then over chunks. w may be null.
int64_t norm_backward_chunks(int64_t rows);
void launch_norm_backward(Dtype dt, bool center, int64_t rows, int64_t n, void* dx, void* dw,
                          void* db, void* partial, const void* x, const void* stats, const void* g,
                          const void* w, cudaStream_t s);

/// Fused cross-entropy over the middle axis of contiguous logits (O, R, I) with targets
/// (O, I) of index dtype it: loss and lse (O, I) in f32 (f64 for f64 logits).
void launch_cross_entropy(Dtype dt, Dtype it, int64_t O, int64_t R, int64_t I, int64_t ignore,
                          void* loss, void* lse, const void* x, const void* target, cudaStream_t s);
/// dx = (softmax(x) - onehot(target)) * g, 0 where the target is ignored.
void launch_cross_entropy_backward(Dtype dt, Dtype it, int64_t O, int64_t R, int64_t I,
                                   int64_t ignore, void* dx, const void* x, const void* target,
                                   const void* lse, const void* g, cudaStream_t s);

/// take along an axis of contiguous x viewed as (O, V, I): y (O, K, I) = x[:, idx[k], :].
void launch_take(Dtype dt, Dtype it, int64_t O, int64_t V, int64_t I, int64_t K, void* y,
                 const void* x, const void* idx, cudaStream_t s);
/// index_add, the adjoint of take: acc (O, V, I) in the compute type (f32 for f16/bf16),
/// zeroed by the caller, += g (O, K, I) at idx; then y = acc rounded (y may equal acc).
void launch_index_add(Dtype dt, Dtype it, int64_t O, int64_t V, int64_t I, int64_t K, void* y,
                      void* acc, const void* g, const void* idx, cudaStream_t s);

/// Scaled-dot-product attention over B batch-heads of contiguous q (B, Lq, E), k (B, Lk, E),
/// v (B, Lk, Ev): o (B, Lq, Ev) and the row logsumexp lse (B, Lq) in f32 (f64 for f64).
/// causal: query i sees keys j <= i. Flash-attention-2 tiling: blocks of query rows walk
/// key/value tiles in shared memory with an online softmax (memory linear in L). E and Ev at
/// most kMaxAttentionDim (kernels for head-dim buckets 32, 64, 128, 256).
inline constexpr int64_t kMaxAttentionDim = 256;
struct AttentionDims {
  int64_t B, Lq, Lk, E, Ev;
  bool causal;
};
void launch_attention(Dtype dt, const AttentionDims& g, double scale, void* o, void* lse,
                      const void* q, const void* k, const void* v, cudaStream_t s);
/// Its backward: dq, dk, dv from q, k, v, o, do, lse, recomputing the probabilities tile by
/// tile: D = rowsum(dO * O) into d_rows (a workspace of B * Lq values of lse's type), then dq
/// by blocks of query rows and dk, dv by blocks of keys (no atomics: deterministic).
void launch_attention_backward(Dtype dt, const AttentionDims& g, double scale, void* dq, void* dk,
                               void* dv, void* d_rows, const void* q, const void* k, const void* v,
                               const void* o, const void* dout, const void* lse, cudaStream_t s);

/// Geometry of a 2-D convolution or pooling window over contiguous NCHW planes: C channels of
/// H x W in, Ho x Wo out, a kh x kw window with strides (sh, sw) and zero padding (ph, pw).
struct ConvDims {
  int64_t C, H, W, Ho, Wo, kh, kw, sh, sw, ph, pw;
};
/// Where im2col puts column entry (image n, row r = (c * kh + i) * kw + j, output pixel p):
/// at n * image_stride + r * row_stride + p. Per image (C*kh*kw, Ho*Wo) matrices are
/// {C*kh*kw*Ho*Wo, Ho*Wo}; one (C*kh*kw, nb*Ho*Wo) matrix over nb images is {Ho*Wo, nb*Ho*Wo}.
struct ColumnLayout {
  int64_t image_stride, row_stride;
};
/// col from images [0, nb) of contiguous x (nb, C, H, W): zero where the window hits padding.
void launch_im2col(Dtype dt, const ConvDims& d, int64_t nb, const ColumnLayout& l, void* col,
                   const void* x, cudaStream_t s);
/// Its adjoint: dx (nb, C, H, W) = for each input pixel, the sum of the entries of col (the
/// compute type of dt: f32 for f16/bf16) that read it, in (i, j) order, rounded once. A
/// gather (no atomics): deterministic.
void launch_col2im(Dtype dt, const ConvDims& d, int64_t nb, const ColumnLayout& l, void* dx,
                   const void* col, cudaStream_t s);

/// Max pooling over `planes` contiguous (H, W) planes (-inf padding): y and the flat index
/// ih * W + iw of each window's first maximum (a NaN is the maximum, the first one wins).
void launch_max_pool(Dtype dt, const ConvDims& d, int64_t planes, void* y, int64_t* idx,
                     const void* x, cudaStream_t s);
/// dx: each input pixel gathers g from the outputs whose window covers it and whose saved
/// index is that pixel, in output order (f32 sums for f16/bf16).
void launch_max_pool_backward(Dtype dt, const ConvDims& d, int64_t planes, void* dx,
                              const int64_t* idx, const void* g, cudaStream_t s);
/// Average pooling, the zero padding counted in the divisor (kh * kw).
void launch_avg_pool(Dtype dt, const ConvDims& d, int64_t planes, void* y, const void* x,
                     cudaStream_t s);
/// dx: each input pixel gathers g / (kh * kw) from the outputs whose window covers it.
void launch_avg_pool_backward(Dtype dt, const ConvDims& d, int64_t planes, void* dx, const void* g,
                              cudaStream_t s);

/// Batch norm over (N, H, W) of contiguous NCHW arrays, per channel in the stats type (f32,
/// f64 for f64): each channel's N * HW values are split into chunks, reduced by one block
/// each, and the chunks' partial sums added in order (deterministic).
struct BatchNormDims {
  int64_t N, C, HW;
};
/// Workspace elements (of the stats type) the batch-norm launchers need.
int64_t batch_norm_workspace(const BatchNormDims& d);
/// Training forward: mean and biased var (C, stats type) by two passes (mean, then squared
/// deviations), y = (x - mean) * w / sqrt(var + eps) + b, or relu of it when `relu`.
void launch_batch_norm(Dtype dt, const BatchNormDims& d, double eps, bool relu, void* y, void* mean,
                       void* var, void* workspace, const void* x, const void* w, const void* b,
                       cudaStream_t s);
/// Its backward: db = sum(g), dw = sum(g * xhat), dx = w * invstd * (g - db / M - xhat * dw /
/// M) with M = N * HW (dw, db, dx of dtype dt; mean, var of the stats type). With `relu`, g is
/// zeroed where the forward's pre-activation (recomputed from x, w, b, mean, var) was <= 0.
void launch_batch_norm_backward(Dtype dt, const BatchNormDims& d, double eps, bool relu, void* dx,
                                void* dw, void* db, void* workspace, const void* x,
                                const void* mean, const void* var, const void* g, const void* w,
                                const void* b, cudaStream_t s);

/// One fused AdamW step over n contiguous elements (scalars as the CPU kernel rounds them).
struct AdamWScalars {
  double b1, b2, one_b1, one_b2, keep, inv_sqrt_bc2, eps, step;
  bool decay;
};
void launch_adamw(Dtype dt, int64_t n, const AdamWScalars& a, void* po, void* mo, void* vo,
                  const void* p, const void* g, const void* m, const void* v, cudaStream_t s);

}  // namespace hetrain::cuda
