// Matmul on CUDA through cuBLASLt (gemm.h): f32 (TF32 Tensor Cores only when
// HETRAIN_CUDA_TF32=1), f16 and bf16 with f32 accumulation, f64; integer inputs go through f32
// like the CPU kernel. Batches run as one strided-batched call when each operand's batch dims
// collapse to one stride; a batch-broadcast right operand (x @ W) folds the batch into M.
#include <algorithm>
#include <optional>

#include "backends/cuda/common.h"
#include "backends/cuda/gemm.h"
#include "graph/prims/linalg.h"

namespace hetrain {

namespace {

/// How a row-major (rows x cols) matrix with strides (s0, s1) is stored for BLAS: plain
/// (element (i, j) at i * ld + j) or transposed (at j * ld + i); nullopt if neither.
struct Layout {
  bool transposed = false;
  int64_t ld = 0;
};
std::optional<Layout> matrix_layout(int64_t rows, int64_t cols, int64_t s0, int64_t s1) {
  if ((s1 == 1 || cols == 1) && (rows == 1 || s0 >= std::max<int64_t>(cols, 1)))
    return Layout{false, rows == 1 ? std::max<int64_t>(cols, 1) : s0};
  if ((s0 == 1 || rows == 1) && (cols == 1 || s1 >= std::max<int64_t>(rows, 1)))
    return Layout{true, cols == 1 ? std::max<int64_t>(rows, 1) : s1};
  return std::nullopt;
}

/// One stride over the batch dims of x (those before the last two), or nullopt when they
/// do not collapse into one (size-1 dims ignored; 0 for a single or broadcast batch).
std::optional<int64_t> batch_stride(const Array& x) {
  const size_t nb = x.shape.size() - 2;
  std::optional<int64_t> inner;  // stride of the innermost batch dim of size > 1
  int64_t span = 0;              // elements that inner dim spans
  for (size_t d = nb; d-- > 0;) {
    if (x.shape[d] == 1) continue;
    if (!inner) {
      inner = x.strides[d];
    } else if (x.strides[d] != span) {
      return std::nullopt;
    }
    span = x.strides[d] * x.shape[d];
  }
  return inner.value_or(0);
}

/// A matrix operand ready for cuBLASLt: its array (a contiguous copy when its strides or
/// dtype do not suit), layout and batch stride.
struct Operand {
  Array arr;
  Layout layout;
  int64_t batch_stride = 0;
};

Operand prepare(const Array& x, Dtype compute, int64_t nbatch) {
  const size_t n = x.shape.size();
  Operand op;
  op.arr = x;
  if (x.dtype == compute) {
    const auto l =
        matrix_layout(x.shape[n - 2], x.shape[n - 1], x.strides[n - 2], x.strides[n - 1]);
    const auto bs = batch_stride(x);
    // A broadcast batch (stride 0) is left to the caller, who may fold it into M.
    if (l && bs) {
      op.layout = *l;
      op.batch_stride = *bs;
      return op;
    }
  }
  op.arr = cuda::device_array(x.shape, compute);
  cuda::copy_strided(x, op.arr);
  op.layout = {false, std::max<int64_t>(x.shape[n - 1], 1)};
  op.batch_stride = nbatch > 1 ? x.shape[n - 2] * x.shape[n - 1] : 0;
  return op;
}

/// x as a contiguous compute-dtype copy (for batch-broadcast operands that cannot fold).
Operand materialize(const Array& x, Dtype compute) {
  const size_t n = x.shape.size();
  Operand op;
  op.arr = cuda::device_array(x.shape, compute);
  cuda::copy_strided(x, op.arr);
  op.layout = {false, std::max<int64_t>(x.shape[n - 1], 1)};
  op.batch_stride = x.shape[n - 2] * x.shape[n - 1];
  return op;
}

void* element(const Array& a, int64_t extra) {
  return static_cast<char*>(a.raw()) + extra * static_cast<int64_t>(dtype_size(a.dtype));
}

}  // namespace

void Matmul::eval_cuda(const std::vector<const Array*>& in, const std::vector<Array*>& out) const {
  const Array &a0 = *in[0], &b0 = *in[1];
  Array& y = *out[0];
  const Dtype dt = a0.dtype;
  const bool native = dt == Dtype::f64 || dt == Dtype::f32 || dt == Dtype::f16 || dt == Dtype::bf16;
  const Dtype compute = native ? dt : Dtype::f32;
  const size_t n = a0.shape.size();
  const int64_t M = a0.shape[n - 2], K = a0.shape[n - 1], N = b0.shape[n - 1];
  const int64_t nb = numel(Shape(a0.shape.begin(), a0.shape.end() - 2));
  y.allocate();
  if (y.numel() == 0) return;
  // The result goes straight into y unless y's dtype is not a GEMM type (integers).
  Array c = dt == compute ? y : cuda::device_array(y.shape, compute);
  if (K == 0) {
    cuda::zero(c);
  } else {
    Operand A = prepare(a0, compute, nb), B = prepare(b0, compute, nb);
    int64_t m = M, batch = nb;
    if (nb > 1 && B.batch_stride == 0 && !A.layout.transposed &&
        A.batch_stride == M * A.layout.ld && A.layout.ld == K) {
      // x (batch.., M, K) @ W (K, N) broadcast over the batch: one (batch * M, K) GEMM.
      m = M * nb;
      batch = 1;
    } else if (nb > 1) {
      if (A.batch_stride == 0) A = materialize(A.arr, compute);
      if (B.batch_stride == 0) B = materialize(B.arr, compute);
    }
    cuda::gemm(compute, compute, m, N, K, batch,
               {element(A.arr, 0), A.layout.transposed, A.layout.ld, A.batch_stride},
               {element(B.arr, 0), B.layout.transposed, B.layout.ld, B.batch_stride},
               {c.raw(), N, m * N});
  }
  if (dt != compute) cuda::copy_strided(c, y);
}

}  // namespace hetrain
