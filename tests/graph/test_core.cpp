#include <gtest/gtest.h>

#include "hetrain/base/error.h"
#include "hetrain/graph/autodiff.h"
#include "hetrain/graph/ops.h"
#include "hetrain/memory/allocator.h"
#include "testing.h"

using namespace hetrain;
using hetrain::testing::check_grad_fd;
using hetrain::testing::expect_close;

TEST(Core, ArithmeticAndBroadcast) {
  Tensor a = from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor b = from_vector<float>({10, 20, 30}, {3});
  expect_close(a + b, {11, 22, 33, 14, 25, 36});
  expect_close(a * 2.0 - 1.0, {1, 3, 5, 7, 9, 11});
  expect_close(transpose(a, 0, 1) + 0.0, {1, 4, 2, 5, 3, 6});
  expect_close(sum(a, {0}), {5, 7, 9});
  expect_close(sum(a, {1}), {6, 15});
  expect_close(mean(a), {3.5});
  expect_close(max(a, {1}), {3, 6});
  expect_close(argmax(from_vector<float>({1, 9, 3, 7, 2, 8}, {2, 3}), 1), {1, 2});
}

TEST(Core, BroadcastErrorNamesOpAndShapes) {
  Tensor a = zeros({2, 3}), b = zeros({4, 3});
  try {
    add(a, b);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "[add] shapes (2, 3) and (4, 3) do not broadcast");
  }
  try {
    matmul(zeros({32, 64}), zeros({32, 10}));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "[matmul] inner dimensions differ: (32, 64) @ (32, 10)");
  }
}

TEST(Core, MatmulFoldsTransposes) {
  Tensor a = from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor b = from_vector<float>({1, 0, 2, 1, 0, 3}, {3, 2});
  expect_close(matmul(a, b), {5, 11, 14, 23});
  // a^T^T @ b through views: same result, no copy needed.
  Tensor at = transpose(transpose(a, 0, 1), 0, 1);
  expect_close(matmul(at, b), {5, 11, 14, 23});
  expect_close(matmul(transpose(b, 0, 1), transpose(a, 0, 1)), {5, 14, 11, 23});
  // batched with broadcasting
  Tensor x = reshape(arange(0, 12, 1), {2, 2, 3});
  Tensor y = matmul(x, b);
  EXPECT_EQ(y.shape(), (Shape{2, 2, 2}));
  expect_close(y, {2, 7, 11, 19, 20, 31, 29, 43});
}

TEST(Core, PermutationUndoingAnotherGivesTheSourceBack) {
  Tensor a = reshape(arange(0, 24, 1), {2, 3, 4});
  // The transpose of a transpose, and a 3-cycle followed by its inverse: the source itself.
  EXPECT_EQ(transpose(transpose(a, 0, 2), 0, 2).node(), a.node());
  Tensor p = permute(a, {1, 2, 0});
  EXPECT_EQ(permute(p, {2, 0, 1}).node(), a.node());
  // The same cycle twice is a new view with its own order of elements.
  Tensor q = permute(p, {1, 2, 0});
  EXPECT_NE(q.node(), a.node());
  EXPECT_EQ(q.shape(), (Shape{4, 2, 3}));
  expect_close(slice(q, 0, 1, 2) + 0.0, {1, 5, 9, 13, 17, 21});
  // Gradients flow through the pair as through no view at all.
  Generator gen(3);
  check_grad_fd(
      [](const std::vector<Tensor>& x) {
        return permute(permute(x[0], {1, 0}), {1, 0}) * x[0];
      },
      {randn({3, 2}, Dtype::f64, gen)});
}

TEST(Core, ViewsShareStorage) {
  Tensor a = arange(0, 24, 1);
  Tensor v = slice(reshape(a, {2, 3, 4}), 2, 1, 4, 2);
  EXPECT_EQ(v.shape(), (Shape{2, 3, 2}));
  expect_close(v, {1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23});
  EXPECT_EQ(v.array().buffer.get(), a.array().buffer.get());
  Tensor p = permute(reshape(a, {2, 3, 4}), {2, 0, 1});
  EXPECT_EQ(p.array().buffer.get(), a.array().buffer.get());
  expect_close(slice(p, 0, 3, 4), {3, 7, 11, 15, 19, 23});
  auto parts = split(arange(0, 5, 1), {2, 3});
  expect_close(parts[1], {2, 3, 4});
  expect_close(concat({parts[1], parts[0]}), {2, 3, 4, 0, 1});
}

TEST(Core, CastRoundsToNearestEven) {
  Tensor x = from_vector<float>({1.0f + 1.0f / 256, 1.0f + 3.0f / 256, 65520.0f}, {3});
  auto b = cast(x, Dtype::bf16).to_vector<double>();
  EXPECT_EQ(b[0], 1.0);
  EXPECT_EQ(b[1], 1.0 + 4.0 / 256);
  auto h = cast(x, Dtype::f16).to_vector<double>();
  EXPECT_TRUE(std::isinf(h[2]));
}

TEST(Core, RandomIsReproducibleAndDistributed) {
  Generator g1(42), g2(42);
  auto a = randn({10000}, Dtype::f32, g1).to_vector<double>();
  auto b = randn({10000}, Dtype::f32, g2).to_vector<double>();
  EXPECT_EQ(a, b);
  double m = 0, v = 0;
  for (double x : a) m += x;
  m /= static_cast<double>(a.size());
  for (double x : a) v += (x - m) * (x - m);
  v /= static_cast<double>(a.size());
  EXPECT_NEAR(m, 0.0, 0.03);
  EXPECT_NEAR(v, 1.0, 0.05);
  // The next draw differs from the first.
  auto c = randn({10000}, Dtype::f32, g1).to_vector<double>();
  EXPECT_NE(a, c);
}

TEST(Autodiff, BackwardFillsLeafGrads) {
  Tensor w = from_vector<float>({1, -2, 3, 0.5}, {2, 2}).requires_grad_();
  Tensor x = from_vector<float>({1, 2, 3, 4, 5, 6}, {3, 2});
  Tensor loss = sum(relu(matmul(x, w)));
  loss.backward();
  // d/dw sum(relu(xw)) = x^T @ (xw > 0)
  // xw = [[7, -1], [15, -4], [23, -7]] -> mask [[1,0],[1,0],[1,0]]
  expect_close(w.grad(), {9, 0, 12, 0});
  EXPECT_FLOAT_EQ(loss.item<float>(), 45.0f);
  EXPECT_TRUE(w.grad().evaluated());
  // Grads accumulate like PyTorch.
  Tensor loss2 = sum(matmul(x, w));
  loss2.backward();
  expect_close(w.grad(), {18, 9, 24, 12});
}

TEST(Autodiff, ItemBeforeBackwardKeepsGraph) {
  Tensor w = from_vector<double>({0.5, -1.5}, {2}).requires_grad_();
  Tensor loss = sum(exp(w));
  EXPECT_NEAR(loss.item<double>(), std::exp(0.5) + std::exp(-1.5), 1e-12);
  loss.backward();
  expect_close(w.grad(), {std::exp(0.5), std::exp(-1.5)}, 1e-12);
}

TEST(Autodiff, FiniteDifferencesElementwise) {
  Generator g(7);
  Tensor a = randn({3, 4}, Dtype::f64, g), b = randn({4}, Dtype::f64, g);
  Tensor pos = rand({3, 4}, 0.5, 2.0, Dtype::f64, g);
  check_grad_fd([](const auto& in) { return in[0] * in[1] + in[0] / (in[1] * in[1] + 1.0); },
                {a, b});
  check_grad_fd([](const auto& in) { return tanh(in[0]) + sigmoid(in[0]) * silu(in[0]); }, {a});
  check_grad_fd([](const auto& in) { return gelu(in[0]) + gelu(in[0], "tanh"); }, {a});
  // tanh-GELU's fused gradient, differentiated again in both of its inputs.
  check_grad_fd(
      [](const auto& in) {
        const Tensor& x = in[0];
        Tensor y = gelu(x, "tanh") * in[1];
        return grad({sum(y)}, {x})[0] * in[1];
      },
      {a, randn({3, 4}, Dtype::f64, g)});
  check_grad_fd([](const auto& in) { return log(in[0]) + sqrt(in[0]) + rsqrt(in[0]); }, {pos});
  check_grad_fd([](const auto& in) { return pow(in[0], in[1]); }, {pos, b});
  check_grad_fd([](const auto& in) { return abs(in[0]) + maximum(in[0], in[1]); }, {a, b});
  check_grad_fd([](const auto& in) { return where(greater(in[0], in[1]), in[0], in[1] * 3.0); },
                {a, b});
}

TEST(Autodiff, FiniteDifferencesStructural) {
  Generator g(8);
  Tensor a = randn({2, 3, 4}, Dtype::f64, g), m = randn({4, 5}, Dtype::f64, g);
  check_grad_fd([](const auto& in) { return matmul(in[0], in[1]); }, {a, m});
  check_grad_fd(
      [](const auto& in) { return matmul(transpose(in[1], 0, 1), transpose(in[0], 1, 2)); },
      {a, m});
  check_grad_fd(
      [](const auto& in) {
        return sum(in[0], {0, 2}, true) * max(in[0], {1}, true);
      },
      {a});
  check_grad_fd(
      [](const auto& in) { return var(in[0], {1}, 1, true) + mean(in[0], {-1}, true) * 2.0; }, {a});
  check_grad_fd(
      [](const auto& in) {
        return concat({slice(in[0], 2, 0, 4, 2), reshape(permute(in[0], {2, 0, 1}), {2, 3, 4})}, 2);
      },
      {a});
  check_grad_fd(
      [](const auto& in) {
        return min(in[0], {}) + sum(split(in[0], {1, 2}, 1)[1]);
      },
      {a});
}

TEST(Memory, IntermediatesFreedAfterLastUse) {
  auto& alloc = host_allocator();
  Tensor x = ones({1024, 1024});  // 4 MiB
  x.eval();
  alloc.reset_peak();
  auto before = alloc.stats();
  // A chain of 8 elementwise ops: with frees at last use at most ~3 buffers live at once.
  Tensor y = x;
  for (int i = 0; i < 8; ++i) y = y * 1.5 + 1.0;
  y.eval();
  auto after = alloc.stats();
  int64_t act = static_cast<int64_t>(MemoryTag::activations);
  EXPECT_LE(after.peak[act] - before.current[act], 3 * 4 * 1024 * 1024 + 4096);
  EXPECT_NEAR(y.to_vector<float>()[0], 74.88671875, 1e-4);
}

TEST(Core, BackwardFreesActivationsNoGradientNeeds) {
  // A chain of adds: no vjp needs an add's input or output, so backward() may hold only a few
  // of the 24 one-MiB activations at once (it once held all of them until it returned).
  constexpr int64_t kElems = 1 << 18;  // 1 MiB of f32
  Tensor x = full({kElems}, 1.0, Dtype::f32);
  x.eval();
  x.requires_grad_(true);
  Tensor h = x;
  for (int i = 0; i < 24; ++i) h = h + 1.0;
  Tensor loss = sum(h);
  host_allocator().reset_peak();
  const int64_t before = host_allocator().stats().current_total;
  loss.backward();
  const int64_t peak = host_allocator().stats().peak_total - before;
  EXPECT_LT(peak, 8 * kElems * 4) << "peak during backward " << peak << " bytes";
  expect_close(x.grad(), std::vector<double>(static_cast<size_t>(kElems), 1.0));
}
