// The fusion pass: every rule gives the same bits as the nodes it replaces, on random small
// graphs of convolution gradients (branch sums, downsampling pairs, relu masks), and fires
// where it should.
#include <gtest/gtest.h>

#include <random>

#include "hetrain/graph/autodiff.h"
#include "hetrain/graph/ops.h"
#include "hetrain/graph/primitive.h"
#include "hetrain/runtime/fusion.h"

namespace hetrain {
namespace {

// A random block over x (N, C, H, W): one to three convolution branches (3x3 stride 1 or 2,
// 1x1 stride 2), an optional elementwise branch x * r, an optional relu on x first; the loss
// sums every branch against fixed random cotangents.
std::vector<std::vector<double>> run(uint64_t seed, bool fused, int* rewritten) {
  std::mt19937_64 rng(seed);
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<uint64_t>(n)); };
  const Dtype dt = pick(2) ? Dtype::f32 : Dtype::f64;
  const int64_t C = 4 + pick(5), H = 9 + pick(8), W = 9 + pick(8), N = 1 + pick(3);
  Generator gen(seed);
  Tensor x = randn({N, C, H, W}, dt, gen).eval();
  const bool relu_first = pick(2);
  Tensor h = relu_first ? relu(x) : x;
  Tensor loss;
  std::vector<Tensor> wrt = {x};
  const int branches = 1 + pick(3);
  const bool downsample = pick(2);
  for (int b = 0; b < branches; ++b) {
    // In a downsampling block every convolution has stride 2: a 3x3 then 1x1 shortcuts.
    const int64_t k = downsample && b > 0 ? 1 : 3, s = downsample ? 2 : 1 + pick(2);
    Tensor w = randn({2 + pick(6), C, k, k}, dt, gen).eval();
    wrt.push_back(w);
    Tensor y = conv2d(h, w, {}, {s, s}, {k / 2, k / 2});
    Tensor term = sum(y * randn(y.shape(), dt, gen));
    loss = loss.defined() ? loss + term : term;
  }
  if (pick(2)) loss = loss + sum(h * randn(h.shape(), dt, gen));
  runtime::set_fusion_enabled(fused);
  std::vector<Tensor> g = grad({loss}, wrt);
  *rewritten = fused ? runtime::fuse({g[0]}) : 0;
  std::vector<std::vector<double>> out;
  for (const Tensor& t : g) out.push_back(t.to_vector<double>());
  runtime::set_fusion_enabled(true);
  return out;
}

TEST(Fusion, RandomConvolutionGradientGraphsGiveTheSameBitsFusedOrNot) {
  int fired = 0;
  for (uint64_t seed = 1; seed <= 40; ++seed) {
    int unused = 0, rewritten = 0;
    const auto want = run(seed, false, &unused);
    const auto got = run(seed, true, &rewritten);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i)
      EXPECT_EQ(got[i], want[i]) << "seed " << seed << " gradient " << i;
    fired += rewritten > 0;
  }
  // Most of the graphs have a sum or a mask on x's gradient for the rules to take.
  EXPECT_GE(fired, 15);
}

TEST(Fusion, RulesRewriteTheSumAndMaskNodes) {
  const Dtype dt = Dtype::f32;
  Generator gen(3);
  Tensor x = randn({2, 8, 12, 12}, dt, gen).eval(), r = randn({2, 8, 12, 12}, dt, gen).eval();
  Tensor w1 = randn({6, 8, 3, 3}, dt, gen).eval(), w2 = randn({6, 8, 1, 1}, dt, gen).eval();
  auto y1 = [&] { return conv2d(x, w1, {}, {2, 2}, {1, 1}); };
  auto y2 = [&] { return conv2d(x, w2, {}, {2, 2}, {0, 0}); };
  Tensor c1 = randn(y1().shape(), dt, gen), c2 = randn(y2().shape(), dt, gen);
  // Two input gradients and an addend: one node with both windows and the addend.
  Tensor dx = grad({sum(y1() * c1) + sum(y2() * c2) + sum(x * r)}, {x})[0];
  EXPECT_STREQ(dx.node()->prim->name(), "add");
  EXPECT_EQ(runtime::fuse({dx}), 2);
  EXPECT_STREQ(dx.node()->prim->name(), "conv2d_backward_input");
  EXPECT_EQ(dx.node()->inputs.size(), 5u);  // g, w, g2, w2, addend
  // A gradient that someone else holds is not absorbed: its value stays visible.
  Tensor alone = grad({sum(y1() * c1)}, {x})[0];
  Tensor held = alone + r;
  EXPECT_EQ(runtime::fuse({held}), 0);
  EXPECT_STREQ(held.node()->prim->name(), "add");
  // bf16 sums stay separate adds (the addend kernels are exact in f32 and f64 only).
  Tensor xb = cast(x, Dtype::bf16), wb = cast(w1, Dtype::bf16);
  Tensor db = grad({sum(conv2d(xb, wb, {}, {1, 1}, {1, 1})) + sum(xb * cast(r, Dtype::bf16))},
                   {xb})[0];
  EXPECT_EQ(runtime::fuse({db}), 0);
}

}  // namespace
}  // namespace hetrain
