// GEMM on the current CUDA device through cuBLASLt, for the primitives that are GEMMs at heart
// (matmul, the convolutions). Row-major operands with any leading dimension, transposes and
// strided batches; the caller keeps the buffers alive until the stream has run the call.
#pragma once

#include <cstdint>

#include "hetrain/base/dtype.h"

namespace hetrain::cuda {

/// A row-major matrix input of gemm: element (i, j) of batch b at ptr + b * batch_stride +
/// (transposed ? j * ld + i : i * ld + j), in elements. batch_stride 0 gives every batch the
/// same matrix.
struct GemmOperand {
  const void* ptr = nullptr;
  bool transposed = false;
  int64_t ld = 0;
  int64_t batch_stride = 0;
};
/// The output of gemm: element (i, j) of batch b at ptr + b * batch_stride + i * ld + j.
struct GemmOutput {
  void* ptr = nullptr;
  int64_t ld = 0;
  int64_t batch_stride = 0;
};

/// C (M x N) = A (M x K) @ B (K x N), plus C's previous value when accumulate, for each of
/// `batch` batches, queued on the current device's stream. A and B have dtype dt (f64, f32,
/// f16 or bf16; f32 runs on TF32 Tensor Cores only when HETRAIN_CUDA_TF32=1); C has dtype
/// c_dtype: dt, or f32 for f16/bf16 inputs (the f32 accumulator stored without rounding).
/// Products accumulate in f32 (f64 for f64). K may not be 0.
void gemm(Dtype dt, Dtype c_dtype, int64_t M, int64_t N, int64_t K, int64_t batch,
          const GemmOperand& a, const GemmOperand& b, const GemmOutput& c, bool accumulate = false);

}  // namespace hetrain::cuda
