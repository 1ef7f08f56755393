// bf16 attention on oneDNN's batched bf16 matmul (eval_attention.cpp): the strided batched GEMM
// against an f64 reference, then attention's values and gradients against the f32 reference
// composition on the same bf16 values, across tiles and groups of batch-heads.
//
// Tolerance of the attention checks: the products take bf16 operands, so the probabilities and
// dS are rounded to bf16 (2^-9 relative each) before their products, and the results are rounded
// to bf16 once more. An output row is a convex combination of v's rows, so its error stays near
// 2^-8 max|v|; the gradients sum such terms over a row or a column. We allow 2^-5 of the largest
// reference value; a wrong tile, head, scale or mask is off by far more.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "backends/cpu/gemm.h"
#include "cpu_test_support.h"
#include "graph/prims/attention.h"
#include "hetrain/base/cpu_features.h"
#include "hetrain/base/error.h"
#include "hetrain/base/thread_pool.h"
#include "hetrain/graph/autodiff.h"
#include "hetrain/graph/ops.h"
#include "hetrain/memory/allocator.h"

using namespace hetrain;

namespace {

bool has_bf16_attention() { return cpu::bf16_gemm_path() == cpu::Bf16GemmPath::onednn; }

/// The attention path set for a scope (the batched products run on any CPU with oneDNN bf16, not
/// only where they are the default), the previous one restored after.
using AttentionPathScope =
    hetrain::testing::SettingScope<cpu::Bf16AttentionPath, &cpu::set_bf16_attention_path>;

/// seq() of test_attention.cpp, rounded to dt.
Tensor seq(const Shape& shape, int64_t a, Dtype dt) {
  std::vector<double> v(static_cast<size_t>(numel(shape)));
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = static_cast<double>((static_cast<int64_t>(i) * 37 + a) % 101) / 50.0 - 1.0;
  return cast(from_vector(v, shape), dt).eval();
}

/// max |got - want| <= rel * max |want|.
void expect_near_scaled(const Tensor& got, const Tensor& want, double rel,
                        const std::string& what) {
  const std::vector<double> g = got.to_vector<double>(), w = want.to_vector<double>();
  ASSERT_EQ(g.size(), w.size()) << what;
  double worst = 0, big = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    ASSERT_TRUE(std::isfinite(g[i])) << what << " at " << i;
    worst = std::max(worst, std::abs(g[i] - w[i]));
    big = std::max(big, std::abs(w[i]));
  }
  EXPECT_GT(big, 0.0) << what;
  EXPECT_LE(worst, rel * big) << what << ": largest error " << worst << ", largest value " << big;
}

/// A batch of attention problems: q, k, v shapes and the mask.
struct Case {
  Shape q, k, v;
  bool causal;
};

/// bf16 attention's output and gradients against the f32 reference composition on the same
/// (bf16-exact) values.
void expect_close_to_f32(const Case& c) {
  const std::string what = shape_str(c.q) + (c.causal ? " causal" : "");
  std::vector<Tensor> in16 = {seq(c.q, 1, Dtype::bf16), seq(c.k, 2, Dtype::bf16),
                              seq(c.v, 3, Dtype::bf16)};
  std::vector<Tensor> in32;
  for (const Tensor& t : in16) in32.push_back(cast(t, Dtype::f32).eval());
  Shape oshape = c.q;
  oshape.back() = c.v.back();
  const Tensor r = cast(seq(oshape, 5, Dtype::bf16), Dtype::f32).eval();  // exact in bf16
  Tensor o16 = scaled_dot_product_attention(in16[0], in16[1], in16[2], c.causal);
  EXPECT_EQ(o16.dtype(), Dtype::bf16);
  Tensor o32 = scaled_dot_product_attention_reference(in32[0], in32[1], in32[2], c.causal);
  expect_near_scaled(o16, o32, std::ldexp(1.0, -5), what + " output");
  auto [l16, g16] = value_and_grad(
      [&](const std::vector<Tensor>& x) {
        return sum(cast(scaled_dot_product_attention(x[0], x[1], x[2], c.causal), Dtype::f32) * r);
      },
      in16);
  auto [l32, g32] = value_and_grad(
      [&](const std::vector<Tensor>& x) {
        return sum(scaled_dot_product_attention_reference(x[0], x[1], x[2], c.causal) * r);
      },
      in32);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(g16[i].dtype(), Dtype::bf16);
    expect_near_scaled(g16[i], g32[i], std::ldexp(1.0, -5), what + " grad " + std::to_string(i));
  }
}

}  // namespace

TEST(AttentionBf16, BatchedGemmMatchesF64Reference) {
  if (!cpu::onednn_has_bf16_matmul())
    GTEST_SKIP() << "oneDNN has no bf16 matmul on this CPU (needs AVX-512)";
  // Three matrices of a batch inside larger buffers (batch strides past the matrices), A
  // transposed, C accumulated (beta 1) with alpha 0.5: C_b = 0.5 A_b^T B_b + C_b.
  const int64_t batch = 3, M = 37, N = 20, K = 45, sa = K * M + 7, sb = K * N + 3, sc = M * 24;
  std::vector<BFloat16> a(static_cast<size_t>(batch * sa)), b(static_cast<size_t>(batch * sb));
  std::vector<float> c(static_cast<size_t>(batch * sc));
  auto val = [](int64_t i, int64_t m) {
    return static_cast<float>((i * 29 + m) % 61) / 32.0f - 1.0f;
  };
  for (size_t i = 0; i < a.size(); ++i) a[i].bits = float_to_bf16(val(static_cast<int64_t>(i), 1));
  for (size_t i = 0; i < b.size(); ++i) b[i].bits = float_to_bf16(val(static_cast<int64_t>(i), 2));
  for (size_t i = 0; i < c.size(); ++i) c[i] = val(static_cast<int64_t>(i), 3);
  const std::vector<float> c0 = c;
  cpu::batched_gemm_onednn(Dtype::bf16, Dtype::f32, batch, M, N, K, 0.5f, {a.data(), sa, M, true},
                           {b.data(), sb, N, false}, 1.0f, c.data(), sc, 24);
  for (int64_t z = 0; z < batch; ++z)
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < 24; ++j) {
        const size_t at = static_cast<size_t>(z * sc + i * 24 + j);
        if (j >= N) {  // past the matrix's columns: untouched
          EXPECT_EQ(c[at], c0[at]);
          continue;
        }
        double s = 0;
        for (int64_t k = 0; k < K; ++k)
          s += static_cast<double>(bf16_to_float(a[static_cast<size_t>(z * sa + k * M + i)].bits)) *
               bf16_to_float(b[static_cast<size_t>(z * sb + k * N + j)].bits);
        EXPECT_NEAR(c[at], 0.5 * s + c0[at], 1e-4 * K)
            << "batch " << z << " (" << i << ", " << j << ")";
      }
}

TEST(AttentionBf16, ValuesAndGradientsCloseToF32OnTheSameValues) {
  if (!has_bf16_attention())
    GTEST_SKIP() << "no bf16 matmul unit here (AMX or AVX512-BF16): bf16 attention computes in "
                    "f32, as Attention.HalfPrecisionComputesInF32 checks for f16";
  AttentionPathScope batched(cpu::Bf16AttentionPath::batched);
  // 40 batch-heads of 300 rows: two groups (32 + 8) of 128 x 256 tiles; Lq < Lk; few rows.
  const Case cases[] = {
      {{40, 300, 16}, {40, 300, 16}, {40, 300, 8}, true},
      {{2, 3, 150, 16}, {2, 3, 300, 16}, {2, 3, 300, 8}, false},
      {{3, 7, 8}, {3, 7, 8}, {3, 7, 8}, true},
  };
  for (const Case& c : cases) expect_close_to_f32(c);
  // q with no rows: an empty output, and empty gradients.
  {
    Tensor q = seq({2, 0, 8}, 1, Dtype::bf16), k = seq({2, 5, 8}, 2, Dtype::bf16);
    Tensor v = seq({2, 5, 4}, 3, Dtype::bf16);
    Tensor o = scaled_dot_product_attention(q, k, v, false).eval();
    EXPECT_EQ(o.shape(), (Shape{2, 0, 4}));
    auto [l0, g0] = value_and_grad(
        [&](const std::vector<Tensor>& x) {
          return sum(cast(scaled_dot_product_attention(x[0], x[1], x[2], false), Dtype::f32));
        },
        {q, k, v});
    EXPECT_EQ(l0.item<double>(), 0.0);
    for (double x : g0[1].to_vector<double>()) EXPECT_EQ(x, 0.0);
  }
  // The packed (N, L, 3D) layout with 4 heads against the same values split into heads.
  const int64_t N = 2, L = 70, D = 24, H = 4, d = D / H;
  Tensor qkv16 = seq({N, L, 3 * D}, 1, Dtype::bf16);
  Tensor qkv32 = cast(qkv16, Dtype::f32).eval();
  auto parts = split(qkv32, {D, D, D}, 2);
  auto head = [&](const Tensor& t) { return transpose(reshape(t, {N, L, H, d}), 1, 2); };
  Tensor ref = reshape(transpose(scaled_dot_product_attention_reference(
                                     head(parts[0]), head(parts[1]), head(parts[2]), true),
                                 1, 2),
                       {N, L, D});
  expect_near_scaled(scaled_dot_product_attention_packed(qkv16, H, true), ref, std::ldexp(1.0, -5),
                     "packed output");
  const Tensor r = cast(seq({N, L, D}, 5, Dtype::bf16), Dtype::f32).eval();
  auto [lp, gp] = value_and_grad(
      [&](const std::vector<Tensor>& x) {
        return sum(cast(scaled_dot_product_attention_packed(x[0], H, true), Dtype::f32) * r);
      },
      {qkv16});
  auto [lr, gr] = value_and_grad(
      [&](const std::vector<Tensor>& x) {
        auto p = split(x[0], {D, D, D}, 2);
        return sum(reshape(transpose(scaled_dot_product_attention_reference(head(p[0]), head(p[1]),
                                                                            head(p[2]), true),
                                     1, 2),
                           {N, L, D}) *
                   r);
      },
      {qkv32});
  expect_near_scaled(gp[0], gr[0], std::ldexp(1.0, -5), "packed grad");
}

TEST(AttentionBf16, GroupWorkspaceStaysBoundedForLongRows) {
  if (!has_bf16_attention())
    GTEST_SKIP() << "no bf16 matmul unit here (AMX or AVX512-BF16): no batch-head groups";
  AttentionPathScope batched(cpu::Bf16AttentionPath::batched);
  // 40 batch-heads of 512 x 128: 1.7 MB of workspace each in the backward, over the 2 MiB a group
  // aims at, so every group holds one head and each of the two threads has one group in flight:
  // about 3.4 MB, where the 40 heads as one group would take 68 MB. The values must still be
  // those of the f32 composition.
  const int threads = num_threads();
  set_num_threads(2);
  HostAllocator& a = host_allocator();
  a.reset_peak();
  expect_close_to_f32({{40, 512, 128}, {40, 512, 128}, {40, 512, 128}, true});
  const int64_t peak = a.stats().peak[static_cast<size_t>(MemoryTag::workspace)];
  set_num_threads(threads);
  EXPECT_GT(peak, int64_t{3} << 19) << "a group's workspace is counted";
  EXPECT_LE(peak, int64_t{5} << 20) << "one head a group and thread, and the f32 reference's";
}

TEST(AttentionBf16, ResultsDoNotDependOnTheThreadCount) {
  if (!has_bf16_attention())
    GTEST_SKIP() << "no bf16 matmul unit here (AMX or AVX512-BF16): no batch-head groups";
  AttentionPathScope batched(cpu::Bf16AttentionPath::batched);
  // 37 batch-heads of 70 rows of 24: groups of 16 (16 + 16 + 5), spread over 1, 2 or 3 threads;
  // the output and the three gradients must be the same bits each time.
  const Shape shape = {37, 70, 24};
  const std::vector<Tensor> in = {seq(shape, 1, Dtype::bf16), seq(shape, 2, Dtype::bf16),
                                  seq(shape, 3, Dtype::bf16)};
  const Tensor r = cast(seq(shape, 5, Dtype::bf16), Dtype::f32).eval();
  const int threads = num_threads();
  std::vector<std::vector<double>> first;
  for (int t : {1, 2, 3}) {
    set_num_threads(t);
    auto [loss, g] = value_and_grad(
        [&](const std::vector<Tensor>& x) {
          return sum(cast(scaled_dot_product_attention(x[0], x[1], x[2], true), Dtype::f32) * r);
        },
        in);
    std::vector<std::vector<double>> got = {loss.to_vector<double>()};
    for (const Tensor& gi : g) got.push_back(gi.to_vector<double>());
    if (first.empty())
      first = got;
    else
      for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], first[i]) << t << " threads, " << i;
  }
  set_num_threads(threads);
}

TEST(AttentionBf16, PathIsBatchedOnlyWithAmxAndEachPathRunsWhenSet) {
  // The default: batched products where the CPU has AMX, the f32 kernels elsewhere (AVX512-BF16
  // included, where they are faster for attention's small products).
  if (std::getenv("HETRAIN_BF16_ATTENTION") == nullptr) {
    const bool batched = has_bf16_attention() && cpu_features().amx_bf16;
    EXPECT_EQ(cpu::bf16_attention_path(),
              batched ? cpu::Bf16AttentionPath::batched : cpu::Bf16AttentionPath::f32);
  }
  // The f32 path computes on the operands converted: bit for bit the f32 attention of the same
  // values, rounded to bf16 once. The batched path rounds the probabilities to bf16 before their
  // product, so somewhere its output differs from that.
  const Shape shape = {6, 33, 16};
  const Tensor q = seq(shape, 1, Dtype::bf16), k = seq(shape, 2, Dtype::bf16);
  const Tensor v = seq(shape, 3, Dtype::bf16);
  const Tensor want = cast(scaled_dot_product_attention(cast(q, Dtype::f32), cast(k, Dtype::f32),
                                                        cast(v, Dtype::f32), true),
                           Dtype::bf16)
                          .eval();
  auto differs = [&] {
    const Tensor o = scaled_dot_product_attention(q, k, v, true).eval();
    EXPECT_EQ(o.dtype(), Dtype::bf16);
    const std::vector<double> a = o.to_vector<double>(), b = want.to_vector<double>();
    size_t n = 0;
    for (size_t i = 0; i < a.size(); ++i) n += a[i] != b[i];
    return n;
  };
  {
    AttentionPathScope f32(cpu::Bf16AttentionPath::f32);
    EXPECT_EQ(differs(), 0U) << "the f32 path is the f32 attention rounded once";
  }
  if (!has_bf16_attention()) {
    EXPECT_THROW(cpu::set_bf16_attention_path(cpu::Bf16AttentionPath::batched), Error);
    return;
  }
  AttentionPathScope batched(cpu::Bf16AttentionPath::batched);
  EXPECT_GT(differs(), 0U) << "the batched path rounds the probabilities to bf16";
}
