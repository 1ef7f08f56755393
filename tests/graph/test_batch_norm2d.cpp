// batch_norm2d: values against the composite formula and PyTorch, gradients (including those
// through the returned statistics) against finite differences in f64, dtypes, errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "hetrain/base/error.h"
#include "hetrain/graph/autodiff.h"
#include "hetrain/graph/ops.h"
#include "testing.h"

using namespace hetrain;
using hetrain::testing::check_grad_fd;
using hetrain::testing::expect_close;

namespace {

Tensor seq(const Shape& shape, int64_t a, Dtype dt = Dtype::f64) {
  std::vector<double> v(static_cast<size_t>(numel(shape)));
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = static_cast<double>((static_cast<int64_t>(i) * 37 + a) % 101) / 50.0 - 1.0;
  return cast(from_vector(v, shape), dt);
}

}  // namespace

TEST(BatchNorm2d, MatchesCompositeFormula) {
  Tensor x = seq({3, 4, 5, 6}, 1) * 3.0 + 2.0, w = seq({4}, 2), b = seq({4}, 3);
  auto [y, mean, var] = batch_norm2d(x, w, b, 1e-3);
  Tensor mu = hetrain::mean(x, {0, 2, 3}, true);
  Tensor v = hetrain::mean(square(x - mu), {0, 2, 3}, true);
  Tensor want = (x - mu) * rsqrt(v + 1e-3) * reshape(w, {1, 4, 1, 1}) + reshape(b, {1, 4, 1, 1});
  EXPECT_EQ(y.dtype(), Dtype::f64);
  EXPECT_EQ(mean.shape(), (Shape{4}));
  expect_close(y, want.to_vector<double>(), 1e-12, 1e-12);
  expect_close(mean, reshape(mu, {4}).to_vector<double>(), 1e-12, 1e-12);
  expect_close(var, reshape(v, {4}).to_vector<double>(), 1e-12, 1e-12);
}

TEST(BatchNorm2d, MatchesPyTorch) {
  // x = seq((2, 3, 2, 3), 5); F.batch_norm(x, None, None, seq((3,), 7), seq((3,), 9),
  // training=True, eps=1e-5), with x.grad / weight.grad / bias.grad of (y * seq(y.shape, 11)).sum()
  Tensor x = seq({2, 3, 2, 3}, 5), w = seq({3}, 7), b = seq({3}, 9), r = seq({2, 3, 2, 3}, 11);
  auto f = [&](const std::vector<Tensor>& in) {
    return sum(batch_norm2d(in[0], in[1], in[2])[0] * r);
  };
  auto [val, g] = value_and_grad(f, {x, w, b});
  expect_close(
      batch_norm2d(x, w, b)[0],
      {0.3181941381,  -0.7804106387, -1.8790154155, 0.0212739282,  -1.0773308486, -2.1759356254,
       0.0431769493,  -0.1091644587, -0.2615058668, 0.0020035958,  -0.1503378123, 0.1131716503,
       0.5601059139,  1.3521233111,  -0.0178527274, 0.7741646699,  1.5661820671,  0.1962060286,
       -1.4633271216, 0.4369622221,  -0.6616425547, -1.7602473315, 0.1400420122,  -0.9585627646,
       -0.2038631719, 0.0596462907,  -0.0926951173, -0.2450365254, 0.0184729372,  -0.1338684709,
       -0.3175349858, 0.4744824115,  1.2664998087,  -0.1034762298, 0.6885411675,  1.4805585647},
      1e-9, 1e-9, "y");
  expect_close(
      g[0],
      {3.39187e-05,   1.1798e-06,    -3.15591e-05,  2.50703e-05,   -7.6686e-06,   -4.04075e-05,
       0.0334209841,  -0.0936316102, 0.195166666,   -0.0009175549, -0.1279701492, 0.0917965004,
       -2.9769e-06,   2.06256e-05,   -2.02003e-05,  3.4022e-06,    2.70046e-05,   -1.38213e-05,
       -1.91714e-05,  3.7458e-05,    4.7191e-06,    -2.80198e-05,  2.86097e-05,   -4.1292e-06,
       -0.1726102499, 0.0471563997,  -0.0798961946, 0.2089020817,  0.0128178607,  -0.1142347336,
       -2.9131e-05,   -5.5285e-06,   1.8074e-05,    -2.27519e-05,  8.505e-07,     2.4453e-05},
      1e-9, 1e-9, "dx");
  expect_close(g[1], {6.9511553027, 1.1611457546, 6.9511553027}, 1e-9, 1e-9, "dweight");
  expect_close(g[2], {-0.16, -1.42, 1.36}, 1e-9, 1e-9, "dbias");
}

TEST(BatchNorm2d, GradientsMatchFiniteDifferences) {
  auto y_only = [](const std::vector<Tensor>& in) {
    return batch_norm2d(in[0], in[1], in[2], 1e-4)[0];
  };
  check_grad_fd(y_only, {seq({3, 2, 3, 4}, 1), seq({2}, 2), seq({2}, 3)}, 1e-6, 1e-6);
  // Gradients that flow through the returned mean and variance as well.
  auto with_stats = [](const std::vector<Tensor>& in) {
    auto [y, m, v] = batch_norm2d(in[0], in[1], in[2], 1e-4);
    return y + reshape(m, {1, 3, 1, 1}) * 2.0 + reshape(v, {1, 3, 1, 1}) * reshape(m, {1, 3, 1, 1});
  };
  check_grad_fd(with_stats, {seq({2, 3, 2, 5}, 4), seq({3}, 5), seq({3}, 6)}, 1e-6, 1e-6);
  // A 1x1 image and a single image per batch.
  check_grad_fd(y_only, {seq({4, 2, 1, 1}, 7), seq({2}, 8), seq({2}, 9)}, 1e-6, 1e-6);
  check_grad_fd(y_only, {seq({1, 2, 3, 3}, 7), seq({2}, 8), seq({2}, 9)}, 1e-6, 1e-6);
}

TEST(BatchNorm2d, FusedReluEqualsReluOfBatchNorm) {
  // The fused kernel must give relu(batch_norm2d) bit for bit, forward and every gradient (the
  // mask is recomputed from x in the backward), in f64 and f32; and match finite differences.
  for (Dtype dt : {Dtype::f64, Dtype::f32}) {
    Tensor x = cast(seq({3, 4, 5, 6}, 1) * 3.0 + 0.5, dt), w = seq({4}, 2, dt), b = seq({4}, 3, dt);
    Tensor r = seq({3, 4, 5, 6}, 11, dt);
    auto fused = [&](const std::vector<Tensor>& in) {
      return sum(batch_norm2d(in[0], in[1], in[2], 1e-5, true)[0] * r);
    };
    auto composite = [&](const std::vector<Tensor>& in) {
      return sum(relu(batch_norm2d(in[0], in[1], in[2], 1e-5)[0]) * r);
    };
    Tensor yf = batch_norm2d(x, w, b, 1e-5, true)[0];
    Tensor yc = relu(batch_norm2d(x, w, b, 1e-5)[0]);
    const auto vf = yf.to_vector<double>(), vc = yc.to_vector<double>();
    ASSERT_EQ(vf, vc) << dtype_name(dt);
    // Some of each side of the relu, so that the mask matters.
    const auto zeros = std::count(vf.begin(), vf.end(), 0.0);
    EXPECT_GT(zeros, 60);
    EXPECT_LT(zeros, 300);
    auto gf = value_and_grad(fused, {x, w, b}).second;
    auto gc = value_and_grad(composite, {x, w, b}).second;
    for (size_t k = 0; k < 3; ++k)
      EXPECT_EQ(gf[k].to_vector<double>(), gc[k].to_vector<double>()) << dtype_name(dt) << " " << k;
  }
  auto y_relu = [](const std::vector<Tensor>& in) {
    return batch_norm2d(in[0], in[1], in[2], 1e-4, true)[0];
  };
  check_grad_fd(y_relu, {seq({3, 2, 3, 4}, 1), seq({2}, 2), seq({2}, 3)}, 1e-6, 1e-6);
}

TEST(BatchNorm2d, FusedResidualEqualsReluOfSum) {
  // relu(bn(x) + s) in one pass against the composite, forward and the gradients of x, weight,
  // bias and the residual, with and without the relu, in f64 and f32; and finite differences.
  for (Dtype dt : {Dtype::f64, Dtype::f32}) {
    for (bool relu : {true, false}) {
      Tensor x = cast(seq({3, 4, 5, 6}, 1) * 3.0 + 0.5, dt), w = seq({4}, 2, dt),
             b = seq({4}, 3, dt), s = seq({3, 4, 5, 6}, 7, dt) * 0.8;
      Tensor r = seq({3, 4, 5, 6}, 11, dt);
      auto fused = [&](const std::vector<Tensor>& in) {
        return sum(batch_norm2d(in[0], in[1], in[2], 1e-5, relu, in[3])[0] * r);
      };
      auto composite = [&](const std::vector<Tensor>& in) {
        Tensor y = batch_norm2d(in[0], in[1], in[2], 1e-5)[0] + in[3];
        return sum((relu ? hetrain::relu(y) : y) * r);
      };
      const std::string what = std::string(dtype_name(dt)) + (relu ? " relu" : " plain");
      Tensor yf = batch_norm2d(x, w, b, 1e-5, relu, s)[0];
      Tensor yc = batch_norm2d(x, w, b, 1e-5)[0] + s;
      if (relu) yc = hetrain::relu(yc);
      const double tol = dt == Dtype::f64 ? 1e-12 : 1e-5;
      expect_close(yf, yc.to_vector<double>(), tol, tol, what);
      if (relu) {  // some of each side of the relu, so that the mask matters
        const auto v = yf.to_vector<double>();
        const auto zeros = std::count(v.begin(), v.end(), 0.0);
        EXPECT_GT(zeros, 60) << what;
        EXPECT_LT(zeros, 300) << what;
      }
      auto gf = value_and_grad(fused, {x, w, b, s}).second;
      auto gc = value_and_grad(composite, {x, w, b, s}).second;
      for (size_t k = 0; k < 4; ++k)
        expect_close(gf[k], gc[k].to_vector<double>(), tol * 10, tol * 10,
                     what + " grad " + std::to_string(k));
    }
  }
  auto y_res = [](const std::vector<Tensor>& in) {
    return batch_norm2d(in[0], in[1], in[2], 1e-4, true, in[3])[0];
  };
  check_grad_fd(y_res, {seq({3, 2, 3, 4}, 1), seq({2}, 2), seq({2}, 3), seq({3, 2, 3, 4}, 4)}, 1e-6,
                1e-6);
  try {
    batch_norm2d(zeros({2, 3, 4, 4}), {}, {}, 1e-5, true, zeros({2, 3, 4, 5}));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "[batch_norm2d] residual must have the input's shape (2, 3, 4, 4), got (2, 3, 4, 5)");
  }
}

TEST(BatchNorm2d, LowerPrecisionAndOptionalAffine) {
  Tensor x = seq({4, 3, 5, 5}, 1) * 2.0 + 0.5;
  auto [y64, m64, v64] = batch_norm2d(x);
  auto [y32, m32, v32] = batch_norm2d(cast(x, Dtype::f32));
  EXPECT_EQ(m32.dtype(), Dtype::f32);
  expect_close(y32, y64.to_vector<double>(), 1e-5, 1e-5);
  expect_close(v32, v64.to_vector<double>(), 1e-6, 1e-5);
  auto [y16, m16, v16] = batch_norm2d(cast(x, Dtype::bf16), ones({3}, Dtype::f32));
  EXPECT_EQ(y16.dtype(), Dtype::bf16);
  EXPECT_EQ(m16.dtype(), Dtype::f32);
  expect_close(y16, y64.to_vector<double>(), 0.05, 0.02);
  // Gradients in f32 agree with f64, with and without the fused relu (f32 runs its own vector
  // loop over whole groups of 8 of each 5x5 plane, then the scalar tail).
  for (bool relu : {false, true}) {
    auto grads = [relu](Dtype dt) {
      Tensor x = cast(seq({4, 3, 5, 5}, 1), dt), w = seq({3}, 2, dt), b = seq({3}, 3, dt);
      Tensor r = seq({4, 3, 5, 5}, 6, dt);
      auto f = [&](const std::vector<Tensor>& in) {
        return sum(batch_norm2d(in[0], in[1], in[2], 1e-5, relu)[0] * r);
      };
      return value_and_grad(f, {x, w, b}).second;
    };
    auto g64 = grads(Dtype::f64), g32 = grads(Dtype::f32);
    for (size_t k = 0; k < 3; ++k)
      expect_close(g32[k], g64[k].to_vector<double>(), 1e-4, 1e-4, relu ? "relu" : "plain");
  }
}

TEST(BatchNorm2d, BadArgumentsGiveClearErrors) {
  auto msg = [](auto&& f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(msg([] {
              batch_norm2d(zeros({2, 3, 4}));
            }),
            "[batch_norm2d] input must be 4-D (N, C, H, W), got (2, 3, 4)");
  EXPECT_EQ(msg([] {
              batch_norm2d(zeros({2, 3, 4, 4}), zeros({4}));
            }),
            "[batch_norm2d] weight must have shape (3) for input (2, 3, 4, 4), "
            "got (4)");
  EXPECT_EQ(msg([] {
              batch_norm2d(zeros({0, 3, 4, 4}));
            }),
            "[batch_norm2d] needs at least one value per channel, got input "
            "(0, 3, 4, 4)");
  EXPECT_EQ(msg([] {
              batch_norm2d(zeros({2, 3, 4, 4}, Dtype::i32));
            }),
            "[batch_norm2d] input must be floating point, got i32");
}
