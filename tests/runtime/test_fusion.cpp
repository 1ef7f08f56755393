// The fusion pass: every rule gives the same bits as the nodes it replaces, on random small
// graphs of convolution gradients (branch sums, downsampling pairs, relu masks), and fires
// where it should.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <unordered_set>

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
  // bf16 sums are not folded into the gradient kernel (its addend form is exact in f32 and f64
  // only): the sum stays an elementwise node (chained with the other branch's product).
  Tensor xb = cast(x, Dtype::bf16), wb = cast(w1, Dtype::bf16);
  Tensor db =
      grad({sum(conv2d(xb, wb, {}, {1, 1}, {1, 1})) + sum(xb * cast(r, Dtype::bf16))}, {xb})[0];
  runtime::fuse({db});
  EXPECT_TRUE(db.node()->prim->is_elementwise()) << db.node()->prim->name();
  // Nor do bf16 convolutions pair, or take a relu mask: the fused forms are f32 kernels, and a
  // plain bf16 convolution runs on oneDNN's bf16 kernels (AMX, AVX512-BF16) without converting.
  Tensor w2b = cast(w2, Dtype::bf16);
  Tensor p1 = conv2d(xb, wb, {}, {2, 2}, {1, 1}), p2 = conv2d(xb, w2b, {}, {2, 2}, {0, 0});
  Tensor pair_sum = sum(p1) + sum(p2);
  EXPECT_EQ(runtime::fuse({pair_sum}), 0);
  EXPECT_EQ(p1.node()->inputs.size(), 2u);
  EXPECT_STREQ(p2.node()->prim->name(), "conv2d");
  Tensor masked = grad({sum(relu(conv2d(relu(xb), wb, {}, {1, 1}, {1, 1})))}, {xb})[0];
  runtime::fuse({masked});
  EXPECT_STRNE(masked.node()->prim->name(), "conv2d_backward_input");
  // The same in f32: paired.
  Tensor q1 = conv2d(x, w1, {}, {2, 2}, {1, 1}), q2 = conv2d(x, w2, {}, {2, 2}, {0, 0});
  Tensor q_sum = sum(q1) + sum(q2);
  EXPECT_GE(runtime::fuse({q_sum}), 1);
  EXPECT_EQ(q1.node()->inputs.size(), 3u);  // x, w1, w2
}

// A random elementwise graph over a few leaves (some broadcast, one a transposed view): unary
// and binary ops, casts through bf16, where; intermediates either used once (so chains form)
// or also by a later node (so they must stay). Returns the output's values and, when asked,
// the gradient with respect to the first leaf.
std::vector<std::vector<double>> run_elementwise(uint64_t seed, bool fused, int* chains) {
  std::mt19937_64 rng(seed);
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<uint64_t>(n)); };
  // Often more than one block (16384 elements) so the blocking is exercised.
  const int64_t A = 1 + pick(4), B = 3 + pick(90), C = 5 + pick(200);
  Generator gen(seed);
  Tensor x = randn({A, B, C}, Dtype::f32, gen).eval();
  std::vector<Tensor> pool = {x, randn({C}, Dtype::f32, gen).eval(),
                              transpose(randn({A, C, B}, Dtype::f32, gen).eval(), 1, 2),
                              randn({A, B, 1}, Dtype::f32, gen).eval()};
  const int nops = 2 + pick(7);
  for (int k = 0; k < nops; ++k) {
    const Tensor& a =
        pool[pool.size() - 1 -
             static_cast<size_t>(pick(std::min<int>(3, static_cast<int>(pool.size()))))];
    const Tensor& b = pool[static_cast<size_t>(pick(static_cast<int>(pool.size())))];
    Tensor y;
    const int op = pick(12);
    switch (op) {
      case 0:
        y = a + b;
        break;
      case 1:
        y = a * b;
        break;
      case 2:
        y = a - b * 0.5;
        break;
      case 3:
        y = gelu(a, "tanh");
        break;
      case 4:
        y = tanh(a);
        break;
      case 5:
        y = relu(a);
        break;
      case 6:
        y = sigmoid(a) * b;
        break;
      case 7:
        y = cast(cast(a, Dtype::bf16) * cast(b, Dtype::bf16), Dtype::f32);
        break;
      case 8:
        y = where(greater(a, b), a, b * 2.0);
        break;
      case 9:
        y = exp(neg(abs(a)));
        break;
      case 10:
        y = maximum(a, b) / (abs(b) + 1.0);
        break;
      default:
        y = square(a) + silu(b);
        break;
    }
    if (y.shape() != x.shape()) y = y + zeros(x.shape());
    pool.push_back(y);
  }
  Tensor out = pool.back();
  for (size_t i = 4; i + 1 < pool.size(); i += 2) out = out + pool[i];  // some stay visible
  runtime::set_fusion_enabled(fused);
  Tensor loss = sum(out * randn(out.shape(), Dtype::f32, gen));
  std::vector<Tensor> g = grad({loss}, {x});
  *chains = 0;
  if (fused) {
    runtime::fuse({out, g[0]});
    std::vector<Node*> stack = {out.node(), g[0].node()};
    std::unordered_set<Node*> seen;
    while (!stack.empty()) {
      Node* n = stack.back();
      stack.pop_back();
      if (!n || !seen.insert(n).second) continue;
      if (n->prim && std::string(n->prim->name()) == "fused_elementwise") ++*chains;
      for (const Tensor& t : n->inputs) stack.push_back(t.node());
    }
  }
  std::vector<std::vector<double>> r = {out.to_vector<double>(), g[0].to_vector<double>()};
  runtime::set_fusion_enabled(true);
  return r;
}

TEST(Fusion, RandomElementwiseGraphsGiveTheSameBitsChainedOrNot) {
  int with_chains = 0;
  for (uint64_t seed = 1; seed <= 60; ++seed) {
    int unused = 0, chains = 0;
    const auto want = run_elementwise(seed, false, &unused);
    const auto got = run_elementwise(seed, true, &chains);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_EQ(got[i].size(), want[i].size());
      for (size_t j = 0; j < got[i].size(); ++j) {
        if (std::isnan(got[i][j]) && std::isnan(want[i][j])) continue;
        ASSERT_EQ(got[i][j], want[i][j])
            << "seed " << seed << (i ? " gradient" : " value") << " element " << j;
      }
    }
    with_chains += chains > 0;
  }
  EXPECT_GE(with_chains, 40);
}

TEST(Fusion, ChainAbsorbsOnlyWhatNoOneElseReads) {
  Generator gen(5);
  Tensor x = randn({4, 3000}, Dtype::f32, gen).eval(), b = randn({3000}, Dtype::f32, gen).eval();
  // bias + activation + scale: one node of three steps over x and b.
  Tensor y = gelu(x + b, "tanh") * 0.5;
  EXPECT_EQ(runtime::fuse({y}), 2);
  ASSERT_STREQ(y.node()->prim->name(), "fused_elementwise");
  EXPECT_EQ(y.node()->prim->attrs(), "add,gelu_tanh,mul");
  // An intermediate someone holds keeps its node: only what follows it chains.
  Tensor h = x + b;
  Tensor z = exp(tanh(h)) + h;
  EXPECT_EQ(runtime::fuse({z}), 2);
  EXPECT_EQ(z.node()->prim->attrs(), "tanh,exp,add");
  EXPECT_STREQ(h.node()->prim->name(), "add");
  // The chain's vjp is its composition's: the gradient through an evaluated chain is the one
  // through the nodes it replaced, bit for bit.
  Tensor xg = x.detach().requires_grad_();
  Tensor c = sigmoid(xg * 3.0 - 1.0);
  EXPECT_EQ(runtime::fuse({c}), 2);
  std::vector<double> fused_grad = grad({sum(c * c)}, {xg})[0].to_vector<double>();
  runtime::set_fusion_enabled(false);
  Tensor plain = sigmoid(xg * 3.0 - 1.0);
  std::vector<double> plain_grad = grad({sum(plain * plain)}, {xg})[0].to_vector<double>();
  runtime::set_fusion_enabled(true);
  EXPECT_EQ(fused_grad, plain_grad);
  // Each step's own finite-difference check holds for the chain too: d/dx sigmoid(3x - 1)^2.
  const float x0 = x.to_vector<float>()[7];
  const double s = 1.0 / (1.0 + std::exp(-(3.0 * x0 - 1.0)));
  EXPECT_NEAR(fused_grad[7], 2.0 * s * s * (1.0 - s) * 3.0, 1e-5);
}

// The primitives of the nodes that `roots` depend on, each node once.
std::vector<const Primitive*> primitives(const std::vector<Tensor>& roots) {
  std::vector<Node*> stack;
  for (const Tensor& t : roots) stack.push_back(t.node());
  std::unordered_set<Node*> seen;
  std::vector<const Primitive*> r;
  while (!stack.empty()) {
    Node* cur = stack.back();
    stack.pop_back();
    if (!cur || !seen.insert(cur).second) continue;
    if (cur->prim) r.push_back(cur->prim.get());
    for (const Tensor& t : cur->inputs) stack.push_back(t.node());
  }
  return r;
}

// Counts the nodes named `name` that `roots` depend on.
int count_nodes(const std::vector<Tensor>& roots, const char* name) {
  int n = 0;
  for (const Primitive* p : primitives(roots)) n += std::string(p->name()) == name;
  return n;
}

// The steps of every fused chain that `roots` depend on (attrs: "add,tanh,mul").
std::vector<size_t> chain_lengths(const std::vector<Tensor>& roots) {
  std::vector<size_t> r;
  for (const Primitive* p : primitives(roots)) {
    if (std::string(p->name()) != "fused_elementwise") continue;
    const std::string a = p->attrs();
    r.push_back(1 + static_cast<size_t>(std::count(a.begin(), a.end(), ',')));
  }
  return r;
}

TEST(Fusion, LongElementwiseRunBecomesBoundedChainsWithTheSameBits) {
  // 300 elementwise nodes in a row, each also reading a tensor of its own: absorbing the whole
  // run into one chain took time quadratic in its length (and a scratch block per step).
  Generator gen(9);
  Tensor x = randn({3, 700}, Dtype::f32, gen).eval();
  std::vector<Tensor> addends;
  for (int i = 0; i < 100; ++i) addends.push_back(randn({3, 700}, Dtype::f32, gen).eval());
  auto build = [&] {
    Tensor y = x;
    for (const Tensor& a : addends) y = tanh(y * 0.75 + a);
    return y;
  };
  runtime::set_fusion_enabled(false);
  const std::vector<float> want = build().to_vector<float>();
  runtime::set_fusion_enabled(true);
  Tensor y = build();
  EXPECT_GT(runtime::fuse({y}), 0);
  const std::vector<size_t> lengths = chain_lengths({y});
  size_t total = 0;
  for (size_t n : lengths) {
    EXPECT_LE(n, runtime::kMaxChainSteps);
    total += n;
  }
  // Every node is in some chain, and the chains are as long as the bound lets them be.
  EXPECT_EQ(total, 300u);
  EXPECT_LE(lengths.size(), (300 + runtime::kMaxChainSteps - 2) / (runtime::kMaxChainSteps - 1));
  EXPECT_EQ(y.to_vector<float>(), want);
}

// A random small network of linear layers (bias or not, an activation or none, a residual add
// or not, f32 or f64) and a convolution with bias and relu; its output and its gradients with
// respect to the input and every weight, evaluated with fusion on or off.
std::vector<std::vector<double>> run_epilogue(uint64_t seed, bool fused, int* epilogues) {
  std::mt19937_64 rng(seed);
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<uint64_t>(n)); };
  const Dtype dt = pick(3) ? Dtype::f32 : Dtype::f64;
  const int64_t N = 1 + pick(4), T = 3 + pick(40), D = 4 + pick(60);
  Generator gen(seed);
  Tensor x = randn({N, T, D}, dt, gen).eval();
  std::vector<Tensor> wrt = {x};
  Tensor h = x;
  for (int layer = 0, layers = 1 + pick(3); layer < layers; ++layer) {
    const int64_t out = pick(2) ? D : 2 + pick(80);
    Tensor w = randn({out, h.shape().back()}, dt, gen).eval();
    Tensor b = pick(4) ? randn({out}, dt, gen).eval() : Tensor();
    wrt.push_back(w);
    if (b.defined()) wrt.push_back(b);
    Tensor y = linear(h, w, b);
    switch (pick(4)) {
      case 0:
        y = gelu(y, "tanh");
        break;
      case 1:
        y = relu(y);
        break;
      case 2:
        y = silu(y) * 0.5;
        break;
      default:
        break;
    }
    if (y.shape() == h.shape() && pick(2)) y = y + h;  // residual
    h = y;
  }
  // A convolution with bias and relu over the features as an image.
  const int64_t C = h.shape().back();
  Tensor img = reshape(h, {N, 1, T, C});
  Tensor wc = randn({2 + pick(4), 1, 3, 3}, dt, gen).eval(),
         bc = randn({wc.shape()[0]}, dt, gen).eval();
  wrt.push_back(wc);
  wrt.push_back(bc);
  Tensor out = relu(conv2d(img, wc, bc, {1, 1}, {1, 1})) + 1.0;
  runtime::set_fusion_enabled(fused);
  Tensor loss = sum(out * randn(out.shape(), dt, gen));
  std::vector<Tensor> g = grad({loss}, wrt);
  std::vector<Tensor> roots = g;
  roots.push_back(out);
  *epilogues = 0;
  if (fused) {
    runtime::fuse(roots);
    *epilogues = count_nodes(roots, "fused_epilogue");
  }
  std::vector<std::vector<double>> r;
  for (const Tensor& t : roots) r.push_back(t.to_vector<double>());
  runtime::set_fusion_enabled(true);
  return r;
}

TEST(Fusion, RandomLinearAndConvGraphsGiveTheSameBitsWithEpiloguesOrNot) {
  int with_epilogues = 0;
  for (uint64_t seed = 1; seed <= 40; ++seed) {
    int unused = 0, epilogues = 0;
    const auto want = run_epilogue(seed, false, &unused);
    const auto got = run_epilogue(seed, true, &epilogues);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i)
      EXPECT_EQ(got[i], want[i]) << "seed " << seed << " output " << i;
    with_epilogues += epilogues > 0;
  }
  // Most graphs have a bias add (with what follows it) on some product for the rule; the relu
  // on the convolution stays apart in training, its backward reading the product.
  EXPECT_GE(with_epilogues, 30);
}

TEST(Fusion, EpilogueTakesTheChainThatAloneReadsTheProduct) {
  Generator gen(9);
  Tensor x = randn({6, 33}, Dtype::f32, gen).eval(), w = randn({40, 33}, Dtype::f32, gen).eval(),
         b = randn({40}, Dtype::f32, gen).eval();
  // linear + bias + gelu: the matmul runs with the chain (add, gelu) as its epilogue.
  Tensor y = gelu(linear(x, w, b), "tanh");
  runtime::fuse({y});
  ASSERT_STREQ(y.node()->prim->name(), "fused_epilogue");
  EXPECT_EQ(y.node()->prim->attrs(), "matmul:add,gelu_tanh");
  EXPECT_EQ(count_nodes({y}, "matmul"), 0);
  // The product held by someone else stays a node of its own: only the chain fuses.
  Tensor p = matmul(x, transpose(w, 0, 1));
  Tensor z = tanh(p + b);
  runtime::fuse({z});
  EXPECT_STREQ(z.node()->prim->name(), "fused_elementwise");
  EXPECT_STREQ(p.node()->prim->name(), "matmul");
  // The fused node's vjp is the composition's: the gradient through an evaluated epilogue node
  // equals the one through the nodes it replaced, bit for bit.
  Tensor xg = x.detach().requires_grad_();
  Tensor f = relu(linear(xg, w, b)) * 2.0;
  runtime::fuse({f});
  ASSERT_STREQ(f.node()->prim->name(), "fused_epilogue");
  const std::vector<double> fused_grad = grad({sum(f * f)}, {xg})[0].to_vector<double>();
  runtime::set_fusion_enabled(false);
  Tensor plain = relu(linear(xg, w, b)) * 2.0;
  const std::vector<double> plain_grad = grad({sum(plain * plain)}, {xg})[0].to_vector<double>();
  runtime::set_fusion_enabled(true);
  EXPECT_EQ(fused_grad, plain_grad);
}

// A chain whose inputs depend on one another (x + softmax(x) * b: softmax is no chain step, so
// the chain reads x and softmax(x)), evaluated in the forward, then differentiated. Its vjp
// gives partial derivatives per input; the gradient through softmax reaches x once, by the
// outer backward (a total derivative from the chain would count that branch twice).
TEST(Fusion, ChainWithDependentInputsDifferentiatesOnce) {
  Generator gen(9);
  const Tensor x0 = randn({3, 5}, Dtype::f32, gen).eval();
  const Tensor b0 = randn({5}, Dtype::f32, gen).eval();
  const Tensor cot = randn({3, 5}, Dtype::f32, gen).eval();
  std::vector<double> grads[2];
  for (int fused = 0; fused < 2; ++fused) {
    runtime::set_fusion_enabled(fused == 1);
    Tensor x = x0.detach().requires_grad_();
    Tensor y = tanh(x + softmax(x, -1) * b0);
    y.eval();  // the forward first: the chain replaces the steps before the backward is built
    if (fused) {
      EXPECT_STREQ(y.node()->prim->name(), "fused_elementwise");
    }
    grads[fused] = grad({sum(y * cot)}, {x})[0].to_vector<double>();
  }
  runtime::set_fusion_enabled(true);
  for (size_t i = 0; i < grads[0].size(); ++i)
    EXPECT_NEAR(grads[1][i], grads[0][i], 1e-6) << "dx " << i;
}

}  // namespace
}  // namespace hetrain
