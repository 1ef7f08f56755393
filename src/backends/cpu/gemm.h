// GEMM entry points shared by CPU kernels (matmul, conv, attention). Row-major.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "backends/cpu/isa.h"
#include "backends/cpu/path_choice.h"
#include "hetrain/base/dtype.h"

namespace hetrain::cpu {

struct MatrixLayout {
  bool transposed = false;  // stored as the transpose (column-major)
  int64_t ld = 0;
};
/// How a rows x cols matrix with strides (s0, s1) can be passed to a GEMM, if at all.
std::optional<MatrixLayout> matrix_layout(int64_t rows, int64_t cols, int64_t s0, int64_t s1);

/// C = op(A) @ op(B) (M x N, inner size K) split into row blocks (M >= N) or column blocks, at
/// most one per thread of Hetrain's pool and at least about 4 MFLOP and 32 lines each (a small
/// GEMM is one block, run inline), run on the pool: block(m, n, a_off, b_off, c_off) computes the
/// m x n block whose first elements are at those offsets (in elements) of A, B and C. The GEMM
/// libraries run single-threaded inside: their own threads, beside a pool already running other
/// nodes, spin against it (a GPT step with 256-wide layers took 3x longer on 2 threads than on 1).
/// A block is the same whole rows or columns whatever the split, so each element of C sums the
/// same products in the library's order.
void gemm_blocks(bool ta, bool tb, int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldb,
                 int64_t ldc,
                 const std::function<void(int64_t m, int64_t n, int64_t a_off, int64_t b_off,
                                          int64_t c_off)>& block);

/// C = alpha * op(A) @ op(B) + beta * C, through the faster of the two below on this CPU
/// (sgemm_path()).
void sgemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
           int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc);
void sgemm_onednn(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                  int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc);
void sgemm_openblas(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                    int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc);
enum class SgemmPath { onednn, openblas };
/// The f32 GEMM library sgemm() calls: HETRAIN_SGEMM=openblas|onednn where set (another value
/// is an error), else the one set_sgemm_path() chose (the CLI passes the faster one in this
/// machine's device profile, which 'hetrain bench' measures), else sgemm_rule_path().
SgemmPath sgemm_path();
/// What decided sgemm_path(): HETRAIN_SGEMM, set_sgemm_path() or sgemm_rule_path().
using SgemmSource = PathSource;
SgemmSource sgemm_path_source();
/// Where no measurement is at hand: oneDNN on every CPU (docs/PERFORMANCE.md has the
/// measurements behind it; OpenBLAS is taken only where 'hetrain bench' measured it faster).
SgemmPath sgemm_rule_path();
/// The path sgemm() takes from now on, unless HETRAIN_SGEMM says otherwise.
void set_sgemm_path(SgemmPath p);
/// The choice behind sgemm_path() (paths numbered as SgemmPath).
PathChoice& sgemm_choice();
/// While it lives, sgemm() takes `p` whatever HETRAIN_SGEMM or set_sgemm_path() say: for
/// 'hetrain bench', which times both libraries. Process-wide; not nested.
class SgemmPathOverride : public PathOverride {
 public:
  explicit SgemmPathOverride(SgemmPath p);
};
/// "openblas" or "onednn", as HETRAIN_SGEMM and the device profile spell them.
const char* sgemm_path_name(SgemmPath p);
/// OpenBLAS's name for the kernel set it chose on this CPU ("Zen", "Haswell", ...).
std::string openblas_core_name();
/// The widest vector width an f32 GEMM library runs at in this process: oneDNN's (its
/// effective ISA, which DNNL_MAX_CPU_ISA / ONEDNN_MAX_CPU_ISA may lower) or OpenBLAS's kernel
/// set (OPENBLAS_CORETYPE may lower it), whichever is wider. With cpu::vector_isa() it bounds
/// what any f32 kernel of this process can reach: the FMA peak 'hetrain bench' measures.
Isa gemm_libraries_isa();
/// oneDNN's effective vector width (dnnl::get_effective_cpu_isa()).
Isa onednn_isa();

void dgemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha, const double* A,
           int64_t lda, const double* B, int64_t ldb, double beta, double* C, int64_t ldc);

/// C (M x N, leading dimension ldc) = op(A) @ op(B) for bf16 A and B through oneDNN's matmul
/// primitive (AMX or AVX512-BF16 kernels where the CPU has them); C is bf16 (rounded to
/// nearest even by oneDNN) when c_bf16, else f32. Primitives are cached by shape.
void gemm_bf16_onednn(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const BFloat16* A,
                      int64_t lda, const BFloat16* B, int64_t ldb, void* C, bool c_bf16,
                      int64_t ldc);
/// One operand of a strided batch of GEMMs: matrix b starts at p + b * batch_stride elements;
/// transposed means stored column-major with leading dimension ld.
struct BatchOperand {
  const void* p = nullptr;
  int64_t batch_stride = 0, ld = 0;
  bool transposed = false;
};
/// For b in [0, batch): C_b = alpha * op(A_b) @ op(B_b) + beta * C_b (beta 0 or 1; C_b rows ldc
/// apart, batch_stride_c apart), A and B of dtype ab (bf16 or f32), C of dtype c (f32 or bf16),
/// through one oneDNN matmul primitive on OpenMP's team (AMX or AVX512-BF16 kernels for bf16
/// where the CPU has them). Primitives are cached by shape, strides, dtypes, alpha and beta.
void batched_gemm_onednn(Dtype ab, Dtype c, int64_t batch, int64_t M, int64_t N, int64_t K,
                         float alpha, const BatchOperand& A, const BatchOperand& B, float beta,
                         void* C, int64_t batch_stride_c, int64_t ldc);
/// The oneDNN implementation a bf16 matmul of this shape gets here ("brg:avx512_core_amx",
/// ...), or "" where oneDNN has none (oneDNN 2.x on CPUs without AVX-512).
std::string bf16_gemm_impl_name(int64_t M, int64_t N, int64_t K);
/// Whether gemm_bf16_onednn can run on this CPU.
bool onednn_has_bf16_matmul();

enum class Bf16GemmPath { onednn, convert_sgemm };
/// How bf16 matmuls and convolutions run: on oneDNN's bf16 primitives, or converted to f32 (an
/// f32 GEMM, the f32 convolution kernels). convert_sgemm wherever oneDNN has no bf16 matmul;
/// elsewhere HETRAIN_BF16_GEMM=onednn|sgemm where set (another value throws), else the faster
/// in this machine's device profile ('hetrain bench' times both on bf16 layers), else
/// bf16_gemm_rule_path().
Bf16GemmPath bf16_gemm_path();
/// Where nothing was measured: oneDNN's bf16 kernels where the CPU computes in bf16 (AMX,
/// AVX512-BF16) and oneDNN has them, else convert_sgemm.
Bf16GemmPath bf16_gemm_rule_path();
/// The choice behind bf16_gemm_path() (paths numbered as Bf16GemmPath; "onednn", "sgemm").
PathChoice& bf16_gemm_choice();

enum class Bf16AttentionPath { batched, f32 };
/// How attention runs bf16 operands: `batched`, each tile's products as one oneDNN bf16 matmul
/// over a group of batch-heads (where the CPU has AMX), or `f32`, the f32 kernels over the
/// operands converted (elsewhere, AVX512-BF16 included). f32 wherever bf16_gemm_path() is not
/// oneDNN. HETRAIN_BF16_ATTENTION=batched|f32 overrides; another value throws.
Bf16AttentionPath bf16_attention_path();
/// Sets the path for the rest of the process (tests: both paths on one CPU) and returns the
/// previous one. Throws for `batched` where bf16_gemm_path() is not oneDNN.
Bf16AttentionPath set_bf16_attention_path(Bf16AttentionPath p);

}  // namespace hetrain::cpu
