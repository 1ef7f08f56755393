// layer_norm / rms_norm over more than one trailing dimension: weight and bias gradients keep
// the shape of normalized_shape (found by the PyTorch parity suite).
#include <gtest/gtest.h>

#include "hetrain/graph/autodiff.h"
#include "hetrain/graph/ops.h"
#include "testing.h"

using namespace hetrain;
using hetrain::testing::check_grad_fd;

TEST(NormShapes, MultiDimNormalizedShapeGradients) {
  Generator gen(21);
  Tensor x = randn({2, 3, 4}, Dtype::f64, gen), w = randn({3, 4}, Dtype::f64, gen),
         b = randn({3, 4}, Dtype::f64, gen);
  auto [y, g] = value_and_grad(
      [](const std::vector<Tensor>& in) {
        return sum(square(layer_norm(in[0], {3, 4}, in[1], in[2])));
      },
      {x, w, b});
  EXPECT_EQ(g[1].shape(), (Shape{3, 4}));
  EXPECT_EQ(g[2].shape(), (Shape{3, 4}));
  check_grad_fd(
      [](const std::vector<Tensor>& in) {
        return layer_norm(in[0], {3, 4}, in[1], in[2]);
      },
      {x, w, b});
  check_grad_fd(
      [](const std::vector<Tensor>& in) {
        return rms_norm(in[0], {3, 4}, in[1]);
      },
      {x, w});
}
