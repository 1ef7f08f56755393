// cuBLASLt GEMM (see gemm.h). Row-major C = A @ B is column-major C^T = B^T @ A^T, so
// cuBLASLt's A is our B and its B our A; algorithms found by the heuristic are cached by
// problem (the same shapes recur every training step).
#include "backends/cuda/gemm.h"

#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <sstream>
#include <string>

#include "backends/cuda/check.h"
#include "backends/cuda/context.h"
#include "hetrain/base/error.h"

namespace hetrain::cuda {

namespace {

cudaDataType_t cuda_type(Dtype dt) {
  switch (dt) {
    case Dtype::f64:
      return CUDA_R_64F;
    case Dtype::f32:
      return CUDA_R_32F;
    case Dtype::f16:
      return CUDA_R_16F;
    case Dtype::bf16:
      return CUDA_R_16BF;
    default:
      fail("[gemm] internal: no cuBLASLt type for ", dtype_name(dt));
  }
}

bool tf32_allowed() {
  static const bool on = [] {
    const char* e = std::getenv("HETRAIN_CUDA_TF32");
    return e && std::strcmp(e, "1") == 0;
  }();
  return on;
}

/// Largest power of two (at most 256) dividing the address: cuBLASLt assumes 256-byte
/// aligned pointers unless told otherwise, and views into a buffer may not be.
uint32_t alignment(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  uint32_t al = 256;
  while (al > 1 && (a % al) != 0) al /= 2;
  return al;
}

template <class T, class Destroy>
struct LtHandle {
  T h = nullptr;
  Destroy destroy;
  explicit LtHandle(Destroy d) : destroy(d) {}
  ~LtHandle() {
    if (h) (void)destroy(h);
  }
  LtHandle(const LtHandle&) = delete;
  LtHandle& operator=(const LtHandle&) = delete;
};

/// One cuBLASLt layout: rows x cols column-major with leading dimension ld, batched.
void set_layout(cublasLtMatrixLayout_t& l, cudaDataType_t t, int64_t rows, int64_t cols, int64_t ld,
                int32_t batch, int64_t stride) {
  HT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&l, t, static_cast<uint64_t>(rows),
                                             static_cast<uint64_t>(cols), ld));
  if (batch > 1) {
    HT_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch,
                                                     sizeof(batch)));
    HT_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                     &stride, sizeof(stride)));
  }
}

struct AlgoCache {
  std::mutex mu;
  std::map<std::string, cublasLtMatmulAlgo_t> algos;
};
AlgoCache& algo_cache() {
  static AlgoCache* c = new AlgoCache();
  return *c;
}

}  // namespace

void gemm(Dtype dt, Dtype c_dtype, int64_t M, int64_t N, int64_t K, int64_t batch,
          const GemmOperand& a, const GemmOperand& b, const GemmOutput& c, bool accumulate) {
  HT_ASSERT(M > 0 && N > 0 && K > 0 && batch > 0);
  HT_ASSERT(c_dtype == dt || (c_dtype == Dtype::f32 && (dt == Dtype::f16 || dt == Dtype::bf16)));
  if (batch > std::numeric_limits<int32_t>::max())
    fail("[gemm] ", batch, " batches exceed cuBLASLt's batch count limit");
  DeviceContext& ctx = current_context();
  const cudaDataType_t t = cuda_type(dt), ct = cuda_type(c_dtype);
  const bool f64 = dt == Dtype::f64;
  const cublasComputeType_t compute = f64 ? CUBLAS_COMPUTE_64F
                                      : (dt == Dtype::f32 && tf32_allowed())
                                          ? CUBLAS_COMPUTE_32F_FAST_TF32
                                          : CUBLAS_COMPUTE_32F;
  const cudaDataType_t scale = f64 ? CUDA_R_64F : CUDA_R_32F;
  LtHandle<cublasLtMatmulDesc_t, decltype(&cublasLtMatmulDescDestroy)> desc(
      &cublasLtMatmulDescDestroy);
  HT_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc.h, compute, scale));
  // cuBLASLt's A is our B, its B our A.
  const cublasOperation_t op_a = b.transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = a.transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
  HT_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(desc.h, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
  HT_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(desc.h, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
  using LayoutHandle = LtHandle<cublasLtMatrixLayout_t, decltype(&cublasLtMatrixLayoutDestroy)>;
  LayoutHandle lay_a(&cublasLtMatrixLayoutDestroy), lay_b(&cublasLtMatrixLayoutDestroy),
      lay_c(&cublasLtMatrixLayoutDestroy);
  const auto nb = static_cast<int32_t>(batch);
  // Stored shapes (before the op): B^T is N x K as stored when B is plain, K x N when
  // transposed; likewise A^T. Row-major C (M x N, ld) is column-major N x M.
  set_layout(lay_a.h, t, b.transposed ? K : N, b.transposed ? N : K, b.ld, nb, b.batch_stride);
  set_layout(lay_b.h, t, a.transposed ? M : K, a.transposed ? K : M, a.ld, nb, a.batch_stride);
  set_layout(lay_c.h, ct, N, M, c.ld, nb, c.batch_stride);

  const uint32_t al_a = alignment(b.ptr), al_b = alignment(a.ptr), al_c = alignment(c.ptr);
  std::ostringstream key;
  key << ctx.index << ' ' << static_cast<int>(dt) << ' ' << static_cast<int>(c_dtype) << ' '
      << static_cast<int>(compute) << ' ' << M << ' ' << N << ' ' << K << ' ' << batch << ' '
      << a.transposed << a.ld << ' ' << a.batch_stride << ' ' << b.transposed << b.ld << ' '
      << b.batch_stride << ' ' << c.ld << ' ' << c.batch_stride << ' ' << al_a << ' ' << al_b << ' '
      << al_c;
  cublasLtMatmulAlgo_t algo;
  bool found = false;
  {
    AlgoCache& cache = algo_cache();
    std::lock_guard<std::mutex> lk(cache.mu);
    auto it = cache.algos.find(key.str());
    if (it != cache.algos.end()) {
      algo = it->second;
      found = true;
    }
  }
  if (!found) {
    LtHandle<cublasLtMatmulPreference_t, decltype(&cublasLtMatmulPreferenceDestroy)> pref(
        &cublasLtMatmulPreferenceDestroy);
    HT_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref.h));
    const uint64_t ws = ctx.lt_workspace_bytes;
    HT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref.h, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    HT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref.h, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof(al_a)));
    HT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref.h, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof(al_b)));
    HT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref.h, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, sizeof(al_c)));
    HT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref.h, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_c, sizeof(al_c)));
    cublasLtMatmulHeuristicResult_t result{};
    int count = 0;
    HT_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(ctx.lt, desc.h, lay_a.h, lay_b.h, lay_c.h,
                                                   lay_c.h, pref.h, 1, &result, &count));
    if (count == 0)
      fail("[gemm] cuBLASLt has no algorithm for ", dtype_name(dt), " -> ", dtype_name(c_dtype),
           " M=", M, " N=", N, " K=", K, " batch=", batch, " on cuda:", ctx.index);
    algo = result.algo;
    AlgoCache& cache = algo_cache();
    std::lock_guard<std::mutex> lk(cache.mu);
    cache.algos.emplace(key.str(), algo);
  }
  const float one_f = 1, zero_f = 0;
  const double one_d = 1, zero_d = 0;
  const void* alpha = f64 ? static_cast<const void*>(&one_d) : &one_f;
  const void* beta = f64 ? static_cast<const void*>(accumulate ? &one_d : &zero_d)
                         : (accumulate ? &one_f : &zero_f);
  HT_CUBLAS_CHECK(cublasLtMatmul(ctx.lt, desc.h, alpha, b.ptr, lay_a.h, a.ptr, lay_b.h, beta, c.ptr,
                                 lay_c.h, c.ptr, lay_c.h, &algo, ctx.lt_workspace,
                                 ctx.lt_workspace_bytes, ctx.stream));
}

}  // namespace hetrain::cuda
