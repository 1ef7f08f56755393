// bf16 GEMM through oneDNN's matmul primitive. oneDNN picks its kernel when the primitive
// is created, by what the CPU has: AMX tiles, AVX512-BF16, or (on CPUs with neither) an
// emulation. Primitives are cached by shape and layout, so a training loop creates each
// one once.
//
// Unlike the f32 GEMMs (gemm_blocks), the call runs whole on OpenMP's team (the pool's, so
// nothing else runs beside it; base/thread_pool.h). On
// gemm_blocks' blocks, single-threaded, gpt-mini's bf16 step was 1.03x faster with 2 threads
// and 1.16x slower with 1 on an AMX Xeon, and blocks sized by the thread count give other
// bits on another thread count (oneDNN picks other kernels for the block shapes)
// (docs/PERFORMANCE.md, 2026-12-05).
//
// Each primitive runs on a scratchpad the caller passes (user mode). In oneDNN's default
// library mode every primitive shares one scratchpad per thread that created primitives, sized
// at creation, so a cached primitive run on another pool thread can overrun that thread's
// smaller one: with the GEMM split over the pool that way, gpt-mini trained to a loss of 4.98
// instead of 3.38 in 30 steps.
#include <atomic>
#include <bit>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <tuple>
#include <unordered_map>

#include "backends/cpu/compute_buffers.h"
#include "backends/cpu/gemm.h"
#include "hetrain/base/cpu_features.h"
#include "hetrain/base/error.h"

namespace hetrain::cpu {

namespace {

/// What a cached primitive is for: dtypes of A/B and C, batch, M, N, K, A's and B's (batch
/// stride, ld, transposed), C's batch stride and ld, alpha's bits, beta.
using Key = std::tuple<int, int, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, bool,
                       int64_t, int64_t, bool, int64_t, int64_t, uint32_t, bool>;

/// A matmul primitive and the size of the scratchpad each run gets (its own, so the primitive
/// may run on any thread, and on two at once).
struct MatmulPlan {
  dnnl::matmul prim;
  dnnl::memory::desc scratch;
};

struct OneDnn {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  std::mutex mu;
  std::map<Key, std::shared_ptr<const MatmulPlan>> cache;
};

OneDnn& onednn() {
  // Never destroyed: primitives may be in use by static tensors released at exit.
  static OneDnn* o = new OneDnn();
  return *o;
}

/// A rows x cols matrix descriptor; transposed means stored column-major with leading
/// dimension ld.
dnnl::memory::desc matrix_desc(int64_t rows, int64_t cols, bool transposed, int64_t ld,
                               dnnl::memory::data_type dt) {
  dnnl::memory::dims strides = transposed ? dnnl::memory::dims{1, ld} : dnnl::memory::dims{ld, 1};
  return dnnl::memory::desc({rows, cols}, dt, strides);
}

/// The same for a batch of such matrices, batch_stride elements apart (2D for a batch of one).
dnnl::memory::desc batch_desc(int64_t batch, int64_t rows, int64_t cols, bool transposed,
                              int64_t ld, int64_t batch_stride, dnnl::memory::data_type dt) {
  if (batch == 1) return matrix_desc(rows, cols, transposed, ld, dt);
  dnnl::memory::dims strides = transposed ? dnnl::memory::dims{batch_stride, 1, ld}
                                          : dnnl::memory::dims{batch_stride, ld, 1};
  return dnnl::memory::desc({batch, rows, cols}, dt, strides);
}

dnnl::memory::data_type onednn_dtype(Dtype d) {
  if (d == Dtype::bf16) return dnnl::memory::data_type::bf16;
  if (d == Dtype::f32) return dnnl::memory::data_type::f32;
  fail("[matmul] oneDNN's matmul here takes bf16 or f32, not ", dtype_name(d));
}

}  // namespace

void batched_gemm_onednn(Dtype ab, Dtype c, int64_t batch, int64_t M, int64_t N, int64_t K,
                         float alpha, const BatchOperand& A, const BatchOperand& B, float beta,
                         void* C, int64_t batch_stride_c, int64_t ldc) {
  if (batch == 0 || M == 0 || N == 0) return;
  HT_ASSERT(beta == 0.0f || beta == 1.0f);
  OneDnn& o = onednn();
  const auto a_md = batch_desc(batch, M, K, A.transposed, A.ld, A.batch_stride, onednn_dtype(ab));
  const auto b_md = batch_desc(batch, K, N, B.transposed, B.ld, B.batch_stride, onednn_dtype(ab));
  const auto c_md = batch_desc(batch, M, N, false, ldc, batch_stride_c, onednn_dtype(c));
  const Key key{static_cast<int>(ab),
                static_cast<int>(c),
                batch,
                M,
                N,
                K,
                A.batch_stride,
                A.ld,
                A.transposed,
                B.batch_stride,
                B.ld,
                B.transposed,
                batch_stride_c,
                ldc,
                std::bit_cast<uint32_t>(alpha),
                beta != 0.0f};
  std::shared_ptr<const MatmulPlan> plan;
  {
    std::lock_guard<std::mutex> lk(o.mu);
    auto it = o.cache.find(key);
    if (it != o.cache.end()) plan = it->second;
  }
  if (!plan) {
    try {
      dnnl::primitive_attr attr;
      attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
      if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
      if (beta != 0.0f) {
        dnnl::post_ops po;
        po.append_sum(1.0f);
        attr.set_post_ops(po);
      }
      const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, b_md, c_md), attr, o.engine);
      plan = std::make_shared<const MatmulPlan>(MatmulPlan{dnnl::matmul(pd), pd.scratchpad_desc()});
    } catch (const dnnl::error& e) {
      fail("[matmul] oneDNN has no ", dtype_name(ab), " matmul for batch=", batch, " M=", M,
           " N=", N, " K=", K, ": ", e.what());
    }
    std::lock_guard<std::mutex> lk(o.mu);
    o.cache.emplace(key, plan);
  }
  // oneDNN takes non-const handles; it only reads A and B.
  dnnl::memory a(a_md, o.engine, const_cast<void*>(A.p));
  dnnl::memory b(b_md, o.engine, const_cast<void*>(B.p));
  dnnl::memory cm(c_md, o.engine, C);
  std::unordered_map<int, dnnl::memory> args{
      {DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, cm}};
  Array scratch;
  if (const size_t bytes = plan->scratch.get_size(); bytes > 0) {
    scratch = workspace({static_cast<int64_t>((bytes + 3) / 4)}, Dtype::f32);
    args.emplace(DNNL_ARG_SCRATCHPAD, dnnl::memory(plan->scratch, o.engine, scratch.raw()));
  }
  dnnl::stream s(o.engine);
  plan->prim.execute(s, args);
  s.wait();
}

void gemm_bf16_onednn(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const BFloat16* A,
                      int64_t lda, const BFloat16* B, int64_t ldb, void* C, bool c_bf16,
                      int64_t ldc) {
  batched_gemm_onednn(Dtype::bf16, c_bf16 ? Dtype::bf16 : Dtype::f32, 1, M, N, K, 1.0f,
                      {A, 0, lda, ta}, {B, 0, ldb, tb}, 0.0f, C, 0, ldc);
}

std::string bf16_gemm_impl_name(int64_t M, int64_t N, int64_t K) {
  using dt = dnnl::memory::data_type;
  try {
    dnnl::matmul::desc d(matrix_desc(M, K, false, K, dt::bf16),
                         matrix_desc(K, N, false, N, dt::bf16),
                         matrix_desc(M, N, false, N, dt::bf16));
    return dnnl::matmul::primitive_desc(d, onednn().engine).impl_info_str();
  } catch (const dnnl::error&) {
    return "";  // oneDNN 2.x has no bf16 matmul below AVX-512 (AVX2 CPUs)
  }
}

Isa onednn_isa() {
  const dnnl::cpu_isa isa = dnnl::get_effective_cpu_isa();
  using dnnl::cpu_isa;
  for (const cpu_isa wide :
       {cpu_isa::avx512_mic, cpu_isa::avx512_mic_4ops, cpu_isa::avx512_core,
        cpu_isa::avx512_core_vnni, cpu_isa::avx512_core_bf16, cpu_isa::avx512_core_amx})
    if (isa == wide) return Isa::avx512;
  for (const cpu_isa avx2 : {cpu_isa::avx2, cpu_isa::avx2_vnni})
    if (isa == avx2) return Isa::avx2;
  return Isa::baseline;
}

bool onednn_has_bf16_matmul() {
  static const bool has = !bf16_gemm_impl_name(64, 64, 64).empty();
  return has;
}

Bf16GemmPath bf16_gemm_rule_path() {
  // oneDNN's bf16 kernels pay where the CPU computes in bf16 (AMX, AVX512-BF16); on a
  // plain AVX-512 CPU they convert internally, like our f32 path. On AVX2 CPUs oneDNN 2.6
  // has no bf16 matmul at all (docs/PERFORMANCE.md), so convert + sgemm is the only path.
  // With AVX512-BF16 alone the dot instruction may still lose to the f32 FMAs (an Intel Xeon
  // whose AMX was not exposed: gpt-mini's bf16 step 99 ms against 81 converted), so 'hetrain
  // bench' measures.
  const CpuFeatures& f = cpu_features();
  return (f.amx_bf16 || f.avx512bf16) && onednn_has_bf16_matmul() ? Bf16GemmPath::onednn
                                                                  : Bf16GemmPath::convert_sgemm;
}

PathChoice& bf16_gemm_choice() {
  static_assert(static_cast<int>(Bf16GemmPath::onednn) == 0);
  static PathChoice c("HETRAIN_BF16_GEMM", {"onednn", "sgemm"}, "onednn or sgemm",
                      [] { return static_cast<int>(bf16_gemm_rule_path()); });
  return c;
}

Bf16GemmPath bf16_gemm_path() {
  const auto p = static_cast<Bf16GemmPath>(bf16_gemm_choice().get());
  return onednn_has_bf16_matmul() ? p : Bf16GemmPath::convert_sgemm;
}

namespace {
Bf16AttentionPath default_bf16_attention_path() {
  if (bf16_gemm_path() != Bf16GemmPath::onednn) return Bf16AttentionPath::f32;
  if (const char* env = std::getenv("HETRAIN_BF16_ATTENTION")) {
    if (std::strcmp(env, "batched") == 0) return Bf16AttentionPath::batched;
    if (std::strcmp(env, "f32") == 0) return Bf16AttentionPath::f32;
    fail("HETRAIN_BF16_ATTENTION must be batched or f32, got '", env, "'");
  }
  // Attention's products are small (gpt-mini's: 128 batch-heads of 64x64 by 64x32). On AMX the
  // batched bf16 matmul beats the f32 kernels (gpt-mini's bf16 step 1.04x on a Xeon); with
  // AVX512-BF16 alone it loses to them (the step 1.04x the other way on a Zen 4), as the dot
  // instruction's rate does not pay for the batched calls and the head-major copies.
  return cpu_features().amx_bf16 ? Bf16AttentionPath::batched : Bf16AttentionPath::f32;
}
std::atomic<int> g_attention_path{-1};  // -1: not chosen yet
}  // namespace

Bf16AttentionPath bf16_attention_path() {
  // Not kept: the bf16 GEMM path it follows may be measured after a first call.
  const int p = g_attention_path.load(std::memory_order_relaxed);
  return p < 0 ? default_bf16_attention_path() : static_cast<Bf16AttentionPath>(p);
}

Bf16AttentionPath set_bf16_attention_path(Bf16AttentionPath p) {
  const Bf16AttentionPath old = bf16_attention_path();
  if (p == Bf16AttentionPath::batched && bf16_gemm_path() != Bf16GemmPath::onednn)
    fail("[attention] batched bf16 products need oneDNN's bf16 matmul, which this CPU lacks");
  g_attention_path.store(static_cast<int>(p), std::memory_order_relaxed);
  return old;
}

}  // namespace hetrain::cpu
