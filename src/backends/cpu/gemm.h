// GEMM entry points shared by CPU kernels (matmul, conv, attention). Row-major.
#pragma once

#include <cstdint>
#include <optional>

namespace hetrain::cpu {

struct MatrixLayout {
  bool transposed = false;  // stored as the transpose (column-major)
  int64_t ld = 0;
};
/// How a rows x cols matrix with strides (s0, s1) can be passed to a GEMM, if at all.
std::optional<MatrixLayout> matrix_layout(int64_t rows, int64_t cols, int64_t s0, int64_t s1);

/// C = alpha * op(A) @ op(B) + beta * C.
void sgemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
           int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc);
void dgemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha, const double* A,
           int64_t lda, const double* B, int64_t ldb, double beta, double* C, int64_t ldc);

}  // namespace hetrain::cpu
