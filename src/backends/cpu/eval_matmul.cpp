// CPU GEMM: f32 through oneDNN's sgemm (its JIT picks AVX2/AVX-512/AMX kernels at run time,
// unlike Debian's OpenBLAS, which takes AVX-512 CPUs for "Prescott"); f64 through BLAS;
// bf16 through oneDNN's bf16 matmul where the CPU has bf16 instructions (see
// bf16_gemm_path()); otherwise f16/bf16 are converted to f32 around the f32 GEMM.
#include <cblas.h>
#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <utility>

#include "backends/cpu/gemm.h"
#include "backends/cpu/omp_single.h"
#include "graph/prims/elementwise.h"
#include "graph/prims/linalg.h"
#include "hetrain/base/error.h"
#include "hetrain/base/thread_pool.h"

namespace hetrain {

namespace cpu {

std::optional<MatrixLayout> matrix_layout(int64_t rows, int64_t cols, int64_t s0, int64_t s1) {
  if ((s1 == 1 || cols == 1) && (rows == 1 || s0 >= std::max<int64_t>(cols, 1)))
    return MatrixLayout{false, rows == 1 ? std::max<int64_t>(cols, 1) : s0};
  if ((s0 == 1 || rows == 1) && (cols == 1 || s1 >= std::max<int64_t>(rows, 1)))
    return MatrixLayout{true, cols == 1 ? std::max<int64_t>(rows, 1) : s1};
  return std::nullopt;
}

namespace {
/// OpenBLAS runs single-threaded, on gemm_blocks' blocks.
void single_threaded_blas() {
  static const bool once = [] {
    openblas_set_num_threads(1);
    return true;
  }();
  (void)once;
}
}  // namespace

void gemm_blocks(bool ta, bool tb, int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldb,
                 int64_t ldc,
                 const std::function<void(int64_t, int64_t, int64_t, int64_t, int64_t)>& block) {
  if (M == 0 || N == 0) return;
  const int64_t flops_per_line = 2 * std::max<int64_t>(K, 1) * std::min(M, N);
  // One block per thread at most: each block packs the shared operand again.
  const int64_t lines = std::max(M, N), threads = num_threads();
  const int64_t grain = std::max({int64_t{32}, (lines + threads - 1) / threads,
                                  (int64_t{4} << 20) / std::max<int64_t>(flops_per_line, 1)});
  if (M >= N) {
    parallel_for(M, grain, [&](int64_t lo, int64_t hi) {
      block(hi - lo, N, ta ? lo : lo * lda, 0, lo * ldc);
    });
  } else {
    parallel_for(N, grain,
                 [&](int64_t lo, int64_t hi) { block(M, hi - lo, 0, tb ? lo * ldb : lo, lo); });
  }
}

void sgemm_onednn(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                  int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  gemm_blocks(ta, tb, M, N, K, lda, ldb, ldc,
              [&](int64_t m, int64_t n, int64_t ao, int64_t bo, int64_t co) {
                SingleOmpThread one;
                const dnnl_status_t st = dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, K, alpha,
                                                    A + ao, lda, B + bo, ldb, beta, C + co, ldc);
                if (st != dnnl_success)
                  fail("[matmul] oneDNN sgemm failed (status ", static_cast<int>(st), ") for M=", m,
                       " N=", n, " K=", K);
              });
}

void sgemm_openblas(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                    int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  single_threaded_blas();
  gemm_blocks(ta, tb, M, N, K, lda, ldb, ldc,
              [&](int64_t m, int64_t n, int64_t ao, int64_t bo, int64_t co) {
                cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans,
                            tb ? CblasTrans : CblasNoTrans, static_cast<blasint>(m),
                            static_cast<blasint>(n), static_cast<blasint>(K), alpha, A + ao,
                            static_cast<blasint>(lda), B + bo, static_cast<blasint>(ldb), beta,
                            C + co, static_cast<blasint>(ldc));
              });
}

SgemmPath sgemm_rule_path() {
  // oneDNN everywhere. Both libraries run single-threaded on gemm_blocks' blocks, in the same
  // team. OpenBLAS's Zen kernels beat oneDNN's by ~10% on a lone 2048 GEMM on an AMD EPYC
  // (Zen 3), and on a Zen 4 held to AVX2 on linear layers alone; but there gpt-mini's training
  // step was 1.14x faster on oneDNN (fashion-mlp and fashion-cnn level), its attention's small
  // tile products 1.2-1.6x slower on OpenBLAS. On AVX-512 CPUs, which Debian's OpenBLAS 0.3.21
  // may take for "Prescott", OpenBLAS runs at a fifth of oneDNN's speed.
  return SgemmPath::onednn;
}

PathChoice& sgemm_choice() {
  static_assert(static_cast<int>(SgemmPath::onednn) == 0);
  static PathChoice c("HETRAIN_SGEMM", {"onednn", "openblas"}, "openblas or onednn",
                      [] { return static_cast<int>(sgemm_rule_path()); });
  return c;
}

void set_sgemm_path(SgemmPath p) { sgemm_choice().set_measured(static_cast<int>(p)); }

SgemmPathOverride::SgemmPathOverride(SgemmPath p)
    : PathOverride(sgemm_choice(), static_cast<int>(p)) {}

SgemmPath sgemm_path() { return static_cast<SgemmPath>(sgemm_choice().get()); }

SgemmSource sgemm_path_source() { return sgemm_choice().source(); }

const char* sgemm_path_name(SgemmPath p) { return sgemm_choice().name(static_cast<int>(p)); }

std::string openblas_core_name() { return openblas_get_corename(); }

Isa gemm_libraries_isa() {
  // OpenBLAS 0.3.21's x86-64 kernel sets that use AVX-512, then those that use AVX2 + FMA.
  const std::string core = openblas_core_name();
  Isa openblas = Isa::baseline;
  for (const char* c : {"SkylakeX", "Cooperlake", "SapphireRapids"})
    if (core == c) openblas = Isa::avx512;
  for (const char* c : {"Haswell", "Zen"})
    if (core == c) openblas = Isa::avx2;
  return std::max(openblas, onednn_isa());
}

void sgemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
           int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (sgemm_path() == SgemmPath::openblas) {
    sgemm_openblas(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  } else {
    sgemm_onednn(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  }
}

void dgemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha, const double* A,
           int64_t lda, const double* B, int64_t ldb, double beta, double* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  single_threaded_blas();
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              static_cast<blasint>(M), static_cast<blasint>(N), static_cast<blasint>(K), alpha, A,
              static_cast<blasint>(lda), B, static_cast<blasint>(ldb), beta, C,
              static_cast<blasint>(ldc));
}

}  // namespace cpu

namespace {

/// A matrix operand: base array made GEMM-compatible (copied if its strides are not).
struct Operand {
  Array arr;
  cpu::MatrixLayout layout;
};

Operand prepare(const Array& x, Dtype compute) {
  const size_t n = x.shape.size();
  const int64_t rows = x.shape[n - 2], cols = x.shape[n - 1];
  const std::optional<cpu::MatrixLayout> l =
      cpu::matrix_layout(rows, cols, x.strides[n - 2], x.strides[n - 1]);
  if (x.dtype == compute && l) return {x, *l};
  // A copy in the compute dtype, its batches contiguous. A transposed operand (a weight
  // gradient's activations, an input gradient's weight) stays transposed, so the copy reads and
  // writes in memory order: a row-major copy of it gathered one element per cache line.
  const bool transposed = l && l->transposed;
  Array src = x, a;
  a.shape = x.shape;
  a.dtype = compute;
  a.tag = MemoryTag::workspace;
  if (transposed) {
    std::swap(src.shape[n - 2], src.shape[n - 1]);
    std::swap(src.strides[n - 2], src.strides[n - 1]);
    a.shape = src.shape;
  }
  a.allocate();
  copy_strided(src, a);
  if (!transposed) return {a, cpu::MatrixLayout{false, cols}};
  a.shape = x.shape;
  std::swap(a.strides[n - 2], a.strides[n - 1]);
  return {a, cpu::MatrixLayout{true, rows}};
}

}  // namespace

void Matmul::eval_cpu(const std::vector<const Array*>& in, const std::vector<Array*>& out) const {
  const Array &a0 = *in[0], &b0 = *in[1];
  Array& y = *out[0];
  const Dtype dt = a0.dtype;
  const bool bf16_native = dt == Dtype::bf16 && cpu::bf16_gemm_path() == cpu::Bf16GemmPath::onednn;
  const Dtype compute = dt == Dtype::f64 ? Dtype::f64 : bf16_native ? Dtype::bf16 : Dtype::f32;
  Operand A = prepare(a0, compute), B = prepare(b0, compute);
  const size_t n = a0.shape.size();
  const int64_t M = a0.shape[n - 2], K = a0.shape[n - 1], N = b0.shape[n - 1];
  // The f32/f64 result goes straight into y; f16/bf16 results are rounded from a temporary.
  Array C;
  if (dt == compute) {
    y.allocate();
    C = y;
  } else {
    C.shape = y.shape;
    C.dtype = compute;
    C.tag = MemoryTag::workspace;
    C.allocate();
  }
  Shape batch(a0.shape.begin(), a0.shape.end() - 2);
  const int64_t nb = numel(batch);
  std::vector<int64_t> coord(batch.size(), 0);
  for (int64_t bi = 0; bi < nb; ++bi) {
    int64_t oa = A.arr.offset, ob = B.arr.offset;
    for (size_t d = 0; d < batch.size(); ++d) {
      oa += coord[d] * A.arr.strides[d];
      ob += coord[d] * B.arr.strides[d];
    }
    const int64_t oc = bi * M * N;
    if (compute == Dtype::bf16) {
      const auto* ap = static_cast<const BFloat16*>(A.arr.buffer->data()) + oa;
      const auto* bp = static_cast<const BFloat16*>(B.arr.buffer->data()) + ob;
      if (K == 0) {
        std::fill(C.data<BFloat16>() + oc, C.data<BFloat16>() + oc + M * N, BFloat16{});
      } else {
        cpu::gemm_bf16_onednn(A.layout.transposed, B.layout.transposed, M, N, K, ap, A.layout.ld,
                              bp, B.layout.ld, C.data<BFloat16>() + oc, /*c_bf16=*/true, N);
      }
    } else if (compute == Dtype::f32) {
      const float* ap = static_cast<const float*>(A.arr.buffer->data()) + oa;
      const float* bp = static_cast<const float*>(B.arr.buffer->data()) + ob;
      if (K == 0) {
        std::fill(C.data<float>() + oc, C.data<float>() + oc + M * N, 0.0f);
      } else {
        cpu::sgemm(A.layout.transposed, B.layout.transposed, M, N, K, 1.0f, ap, A.layout.ld, bp,
                   B.layout.ld, 0.0f, C.data<float>() + oc, N);
      }
    } else {
      const double* ap = static_cast<const double*>(A.arr.buffer->data()) + oa;
      const double* bp = static_cast<const double*>(B.arr.buffer->data()) + ob;
      if (K == 0) {
        std::fill(C.data<double>() + oc, C.data<double>() + oc + M * N, 0.0);
      } else {
        cpu::dgemm(A.layout.transposed, B.layout.transposed, M, N, K, 1.0, ap, A.layout.ld, bp,
                   B.layout.ld, 0.0, C.data<double>() + oc, N);
      }
    }
    for (size_t d = batch.size(); d-- > 0;) {
      if (++coord[d] < batch[d]) break;
      coord[d] = 0;
    }
  }
  if (dt != compute) {
    y.allocate();
    copy_strided(C, y);
  }
}

}  // namespace hetrain
