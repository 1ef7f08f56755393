// A batch of matrices times one matrix: folded into one GEMM (the batch becomes rows).
#include <gtest/gtest.h>

#include <cmath>

#include "hetrain/graph/autodiff.h"
#include "hetrain/graph/ops.h"
#include "testing.h"

using namespace hetrain;
using hetrain::testing::check_grad_fd;
using hetrain::testing::expect_close;

TEST(MatmulBatch, FoldedBatchMatchesPerBatchProducts) {
  Generator gen(5);
  Tensor a = randn({2, 3, 4, 5}, Dtype::f64, gen), b = randn({5, 3}, Dtype::f64, gen);
  Tensor y = matmul(a, b);
  EXPECT_EQ(y.shape(), (Shape{2, 3, 4, 3}));
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t j = 0; j < 3; ++j) {
      Tensor ai = squeeze(squeeze(slice(slice(a, 0, i, i + 1), 1, j, j + 1), 0), 0);
      Tensor yi = squeeze(squeeze(slice(slice(y, 0, i, i + 1), 1, j, j + 1), 0), 0);
      expect_close(yi, matmul(ai, b).to_vector<double>(), 1e-12, 1e-12);
    }
  // 1-D right operand and a non-contiguous batch (the fold copies it).
  Tensor v = randn({5}, Dtype::f64, gen);
  EXPECT_EQ(matmul(a, v).shape(), (Shape{2, 3, 4}));
  check_grad_fd([](const std::vector<Tensor>& x) { return matmul(x[0], x[1]); }, {a, b});
  check_grad_fd([](const std::vector<Tensor>& x) { return matmul(transpose(x[0], 0, 2), x[1]); },
                {randn({4, 3, 2, 5}, Dtype::f64, gen), b});
  check_grad_fd([](const std::vector<Tensor>& x) { return matmul(x[0], x[1]); },
                {randn({2, 3, 5}, Dtype::f64, gen), v});
  // An empty batch.
  EXPECT_EQ(matmul(zeros({0, 4, 5}), zeros({5, 3})).shape(), (Shape{0, 4, 3}));
}

TEST(MatmulBatch, Bf16WeightGradientRoundsOnce) {
  // The gradient of a weight shared by a batch must accumulate over the batch in f32 and round
  // once; rounding each batch's product to bf16 first and summing lost up to 0.04 on entries of
  // 0.15 here (PyTorch parity case with (2, 32, 96) @ (96, 48)).
  Generator gen(11);
  Tensor a = randn({2, 32, 96}, Dtype::bf16, gen), w = randn({96, 48}, Dtype::bf16, gen);
  Tensor g = randn({2, 32, 48}, Dtype::bf16, gen);
  Tensor a_leaf = a.detach(), w_leaf = w.detach();
  w_leaf.requires_grad_();
  Tensor gw = grad({matmul(a_leaf, w_leaf)}, {w_leaf}, {g})[0];
  ASSERT_EQ(gw.dtype(), Dtype::bf16);
  Tensor exact = matmul(transpose(reshape(cast(a, Dtype::f64), {64, 96}), 0, 1),
                        reshape(cast(g, Dtype::f64), {64, 48}));
  std::vector<double> got = gw.to_vector<double>(), want = exact.to_vector<double>();
  for (size_t i = 0; i < got.size(); ++i)  // half an ulp of bf16 (8 significant bits)
    ASSERT_LE(std::abs(got[i] - want[i]), std::ldexp(std::abs(want[i]), -8) + 1e-6) << i;
}
