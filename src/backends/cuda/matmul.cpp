// Matmul on CUDA through cuBLASLt: f32 (TF32 Tensor Cores only when HETRAIN_CUDA_TF32=1),
// f16 and bf16 with f32 accumulation, f64; integer inputs go through f32 like the CPU
// kernel. Batches run as one strided-batched call when each operand's batch dims collapse to
// one stride; a batch-broadcast right operand (x @ W) folds the batch into M.
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>

#include "backends/cuda/check.h"
#include "backends/cuda/common.h"
#include "backends/cuda/context.h"
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
      fail("[matmul] internal: no cuBLASLt type for ", dtype_name(dt));
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

/// Algorithms found by the heuristic, by problem (the same shapes recur every step).
struct AlgoCache {
  std::mutex mu;
  std::map<std::string, cublasLtMatmulAlgo_t> algos;
};
AlgoCache& algo_cache() {
  static AlgoCache* c = new AlgoCache();
  return *c;
}

/// Row-major C (M x N, ldc = N, batch stride M * N) = A (M x K) @ B (K x N), batched. In
/// cuBLASLt's column-major terms: C^T (N x M) = B^T (N x K) @ A^T (K x M).
void lt_matmul(Dtype dt, int64_t M, int64_t N, int64_t K, int64_t batch, const void* a,
               const Layout& la, int64_t sa, const void* b, const Layout& lb, int64_t sb, void* c) {
  cuda::DeviceContext& ctx = cuda::current_context();
  const cudaDataType_t t = cuda_type(dt);
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
  const cublasOperation_t op_a = lb.transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = la.transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
  HT_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(desc.h, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
  HT_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(desc.h, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
  using LayoutHandle = LtHandle<cublasLtMatrixLayout_t, decltype(&cublasLtMatrixLayoutDestroy)>;
  LayoutHandle lay_a(&cublasLtMatrixLayoutDestroy), lay_b(&cublasLtMatrixLayoutDestroy),
      lay_c(&cublasLtMatrixLayoutDestroy);
  const auto nb = static_cast<int32_t>(batch);
  // Stored shapes (before the op): B^T is N x K as stored when B is plain, K x N when
  // transposed; likewise A^T.
  set_layout(lay_a.h, t, lb.transposed ? K : N, lb.transposed ? N : K, lb.ld, nb, sb);
  set_layout(lay_b.h, t, la.transposed ? M : K, la.transposed ? K : M, la.ld, nb, sa);
  set_layout(lay_c.h, t, N, M, N, nb, M * N);

  const uint32_t al_a = alignment(b), al_b = alignment(a), al_c = alignment(c);
  std::ostringstream key;
  key << ctx.index << ' ' << static_cast<int>(dt) << ' ' << static_cast<int>(compute) << ' ' << M
      << ' ' << N << ' ' << K << ' ' << batch << ' ' << la.transposed << la.ld << ' ' << sa << ' '
      << lb.transposed << lb.ld << ' ' << sb << ' ' << al_a << ' ' << al_b << ' ' << al_c;
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
      fail("[matmul] cuBLASLt has no algorithm for ", dtype_name(dt), " M=", M, " N=", N, " K=", K,
           " batch=", batch, " on cuda:", ctx.index);
    algo = result.algo;
    AlgoCache& cache = algo_cache();
    std::lock_guard<std::mutex> lk(cache.mu);
    cache.algos.emplace(key.str(), algo);
  }
  const float one_f = 1, zero_f = 0;
  const double one_d = 1, zero_d = 0;
  const void* alpha = f64 ? static_cast<const void*>(&one_d) : &one_f;
  const void* beta = f64 ? static_cast<const void*>(&zero_d) : &zero_f;
  HT_CUBLAS_CHECK(cublasLtMatmul(ctx.lt, desc.h, alpha, b, lay_a.h, a, lay_b.h, beta, c, lay_c.h, c,
                                 lay_c.h, &algo, ctx.lt_workspace, ctx.lt_workspace_bytes,
                                 ctx.stream));
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
    lt_matmul(compute, m, N, K, batch, element(A.arr, 0), A.layout, A.batch_stride,
              element(B.arr, 0), B.layout, B.batch_stride, c.raw());
  }
  if (dt != compute) cuda::copy_strided(c, y);
}

}  // namespace hetrain
