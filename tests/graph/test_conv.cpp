// conv2d, max_pool2d, avg_pool2d: values against PyTorch 1.13 and a direct loop, gradients
// against finite differences, error messages.
#include <gtest/gtest.h>

#include <cmath>

#include "hetrain/base/error.h"
#include "hetrain/graph/autodiff.h"
#include "hetrain/graph/ops.h"
#include "testing.h"

using namespace hetrain;
using hetrain::testing::check_grad_fd;
using hetrain::testing::expect_close;

namespace {

// The same deterministic values as seq() in the PyTorch snippets below:
//   def seq(shape, a):
//       n = prod(shape)
//       return torch.tensor([((i * 37 + a) % 101) / 50.0 - 1.0 for i in range(n)],
//                           dtype=torch.float64).reshape(shape)
std::vector<double> seq_values(const Shape& shape, int64_t a) {
  std::vector<double> v(static_cast<size_t>(numel(shape)));
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = static_cast<double>((static_cast<int64_t>(i) * 37 + a) % 101) / 50.0 - 1.0;
  return v;
}
Tensor seq(const Shape& shape, int64_t a, Dtype dt = Dtype::f64) {
  return cast(from_vector(seq_values(shape, a), shape), dt);
}

/// Direct 7-loop convolution, the hand-written reference.
std::vector<double> conv_direct(const Tensor& x, const Tensor& w, const Tensor& b,
                                std::array<int64_t, 2> s, std::array<int64_t, 2> p) {
  auto xv = x.to_vector<double>(), wv = w.to_vector<double>();
  auto bv = b.defined() ? b.to_vector<double>() : std::vector<double>();
  const int64_t N = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
  const int64_t O = w.size(0), kh = w.size(2), kw = w.size(3);
  const int64_t Ho = (H + 2 * p[0] - kh) / s[0] + 1, Wo = (W + 2 * p[1] - kw) / s[1] + 1;
  std::vector<double> y;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < O; ++o)
      for (int64_t oh = 0; oh < Ho; ++oh)
        for (int64_t ow = 0; ow < Wo; ++ow) {
          double acc = bv.empty() ? 0.0 : bv[static_cast<size_t>(o)];
          for (int64_t c = 0; c < C; ++c)
            for (int64_t i = 0; i < kh; ++i)
              for (int64_t j = 0; j < kw; ++j) {
                int64_t ih = oh * s[0] - p[0] + i, iw = ow * s[1] - p[1] + j;
                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                acc += xv[static_cast<size_t>(((n * C + c) * H + ih) * W + iw)] *
                       wv[static_cast<size_t>(((o * C + c) * kh + i) * kw + j)];
              }
          y.push_back(acc);
        }
  return y;
}

template <class F>
void expect_error(F&& f, const std::string& msg) {
  try {
    f();
    FAIL() << "expected an error: " << msg;
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), msg);
  }
}

}  // namespace

TEST(Conv2d, MatchesPyTorch) {
  // x = seq((1, 2, 4, 5), 3); w = seq((3, 2, 3, 3), 17); b = seq((3,), 5)
  // F.conv2d(x, w, b, stride=(2, 1), padding=(1, 1))
  const std::vector<double> want = {
      -0.0476, -1.4772, -1.7412, -0.5104, -0.8412, -2.718,  -1.0036, 0.3792,  -2.7224, -0.8316,
      0.15,    1.0704,  -1.6272, 1.2504,  0.6704,  -1.2476, 2.764,   0.2944,  -2.5792, 1.62,
      1.5192,  -1.1088, 1.5168,  1.5568,  -0.5652, 2.6872,  0.3504,  -2.2952, 2.816,   0.5972};
  for (Dtype dt : {Dtype::f64, Dtype::f32, Dtype::bf16}) {
    Tensor y = conv2d(seq({1, 2, 4, 5}, 3, dt), seq({3, 2, 3, 3}, 17, dt), seq({3}, 5, dt), {2, 1},
                      {1, 1});
    EXPECT_EQ(y.shape(), (Shape{1, 3, 2, 5}));
    EXPECT_EQ(y.dtype(), dt);
    double tol = dt == Dtype::f64 ? 1e-12 : dt == Dtype::f32 ? 1e-5 : 0.08;
    expect_close(y, want, tol, tol, std::string(dtype_name(dt)));
  }
}

TEST(Conv2d, MatchesDirectLoopAcrossShapes) {
  struct Case {
    Shape x, w;
    std::array<int64_t, 2> s, p;
    bool bias;
  };
  const Case cases[] = {
      {{3, 4, 9, 7}, {5, 4, 3, 3}, {1, 1}, {1, 1}, true},   // same padding
      {{2, 3, 8, 8}, {6, 3, 1, 1}, {1, 1}, {0, 0}, true},   // pointwise: no im2col
      {{5, 2, 7, 9}, {3, 2, 2, 3}, {3, 2}, {0, 2}, false},  // stride > kernel, wide padding
      {{1, 1, 1, 1}, {2, 1, 3, 3}, {1, 1}, {1, 1}, true},   // window mostly padding
      {{2, 3, 6, 5}, {4, 3, 5, 5}, {2, 2}, {2, 2}, true},
  };
  for (const Case& c : cases) {
    Tensor x = seq(c.x, 1, Dtype::f32), w = seq(c.w, 2, Dtype::f32);
    Tensor b = c.bias ? seq({c.w[0]}, 3, Dtype::f32) : Tensor();
    Tensor y = conv2d(x, w, b, {c.s[0], c.s[1]}, {c.p[0], c.p[1]});
    expect_close(y, conv_direct(x, w, b, c.s, c.p), 1e-4, 1e-5, shape_str(c.x));
  }
}

TEST(Conv2d, NonContiguousInput) {
  Tensor x = seq({2, 3, 6, 5}, 4, Dtype::f32);
  Tensor xt = transpose(transpose(x, 2, 3) * 1.0, 2, 3);  // same values, permuted strides
  Tensor w = seq({4, 3, 3, 3}, 9, Dtype::f32);
  expect_close(conv2d(xt, w, {}, {1, 1}, {1, 1}), conv_direct(x, w, {}, {1, 1}, {1, 1}), 1e-4,
               1e-5);
}

TEST(Conv2d, GradientsMatchFiniteDifferences) {
  struct Case {
    Shape x, w;
    std::vector<int64_t> s, p;
  };
  const Case cases[] = {
      {{2, 2, 5, 4}, {3, 2, 3, 3}, {1, 1}, {1, 1}},
      {{2, 3, 4, 4}, {2, 3, 1, 1}, {1, 1}, {0, 0}},
      {{3, 2, 7, 6}, {2, 2, 2, 3}, {3, 2}, {1, 2}},
  };
  for (const Case& c : cases) {
    auto f = [&](const std::vector<Tensor>& in) { return conv2d(in[0], in[1], in[2], c.s, c.p); };
    check_grad_fd(f, {seq(c.x, 1), seq(c.w, 2), seq({c.w[0]}, 3)}, 1e-6, 1e-6);
  }
}

TEST(Conv2d, SecondOrderGradient) {
  // The backward primitives have vjps too: check d/dx of sum(dL/dw * r) by differences.
  Tensor r = seq({2, 2, 3, 3}, 8);
  auto g = [&](const std::vector<Tensor>& in) {
    Tensor x = in[0], w = in[1].detach().requires_grad_();
    auto dw = grad({sum(square(conv2d(x, w, {}, {2, 1}, {1, 0})))}, {w})[0];
    return dw * r;
  };
  check_grad_fd(g, {seq({2, 2, 5, 4}, 1), seq({2, 2, 3, 3}, 2)}, 1e-6, 1e-6, {0});
}

TEST(Conv2d, HalfPrecisionConvertsToF32) {
  Tensor x = seq({2, 3, 6, 6}, 1, Dtype::f16), w = seq({4, 3, 3, 3}, 2, Dtype::f16);
  Tensor y = conv2d(x, w, {}, {1, 1}, {1, 1});
  EXPECT_EQ(y.dtype(), Dtype::f16);
  expect_close(y, conv_direct(x, w, {}, {1, 1}, {1, 1}), 1e-2, 1e-2);
  Tensor xl = x.detach().requires_grad_();
  sum(conv2d(xl, w, {}, {1, 1}, {1, 1})).backward();
  EXPECT_EQ(xl.grad().dtype(), Dtype::f16);
  Tensor x32 = cast(x, Dtype::f32).detach().requires_grad_();
  sum(conv2d(x32, cast(w, Dtype::f32), {}, {1, 1}, {1, 1})).backward();
  expect_close(xl.grad(), x32.grad().to_vector<double>(), 1e-2, 1e-2);
}

TEST(Conv2d, BadShapesGiveClearErrors) {
  expect_error(
      [] {
        conv2d(zeros({2, 3, 8, 8}), zeros({5, 4, 3, 3}));
      },
      "[conv2d] input has 3 channels but weight expects 4: x (2, 3, 8, 8), w (5, 4, 3, 3)");
  expect_error(
      [] {
        conv2d(zeros({3, 8, 8}), zeros({5, 3, 3, 3}));
      },
      "[conv2d] input must be 4-D (N, C, H, W), got (3, 8, 8)");
  expect_error(
      [] {
        conv2d(zeros({1, 3, 8, 8}), zeros({5, 3, 3, 3}), zeros({4}));
      },
      "[conv2d] bias must have shape (5) for weight (5, 3, 3, 3), got (4)");
  expect_error(
      [] {
        conv2d(zeros({1, 3, 2, 8}), zeros({5, 3, 5, 3}), {}, {1, 1}, {1, 0});
      },
      "[conv2d] kernel (5, 3) is larger than the padded input (4, 8) of input "
      "(1, 3, 2, 8)");
  expect_error(
      [] {
        conv2d(zeros({1, 3, 8, 8}), zeros({5, 3, 3, 3}), {}, {0, 1});
      },
      "[conv2d] stride must be positive, got (0, 1)");
  expect_error(
      [] {
        conv2d(zeros({1, 3, 8, 8}), zeros({5, 3, 3, 3}), {}, {1, 1}, {1, 2, 3});
      },
      "[conv2d] padding must have 1 or 2 values, got 3");
}

TEST(Pool2d, MaxMatchesPyTorch) {
  // x = seq((1, 2, 5, 5), 7); F.max_pool2d(x, 3, 2, 1)
  const std::vector<double> want = {0.82, 0.62, 0.08, 0.88, 0.88, 0.68, 0.88, 0.88, 0.74,
                                    0.2,  0.94, 0.4,  0.8,  1,    1,    0.86, 0.86, 0.66};
  for (Dtype dt : {Dtype::f64, Dtype::f32, Dtype::bf16}) {
    Tensor y = max_pool2d(seq({1, 2, 5, 5}, 7, dt), {3}, {2}, {1});
    EXPECT_EQ(y.shape(), (Shape{1, 2, 3, 3}));
    expect_close(y, want, dt == Dtype::bf16 ? 1e-2 : 1e-7, 1e-6);
  }
  // 3-D input and the default stride (= kernel).
  expect_close(max_pool2d(reshape(arange(0, 16, 1), {1, 4, 4}), {2}), {5, 7, 13, 15});
}

TEST(Pool2d, MaxGradientGoesToFirstMaximum) {
  // xo = torch.ones(1, 1, 2, 3, requires_grad=True)
  // F.max_pool2d(xo, 2, 1).sum().backward(); xo.grad -> [[1, 1, 0], [0, 0, 0]]
  Tensor x = ones({1, 1, 2, 3}).requires_grad_();
  sum(max_pool2d(x, {2}, {1})).backward();
  expect_close(x.grad(), {1, 1, 0, 0, 0, 0});
}

TEST(Pool2d, AvgMatchesPyTorch) {
  // x = seq((1, 2, 5, 5), 7); F.avg_pool2d(x, 3, 2, 1)  (count_include_pad=True)
  const std::vector<double> want = {
      -0.068888889, -0.14888889, -0.20444444, 0.11777778,  -0.06,       -0.19777778,
      0.15111111,   0.068888889, 0.015555556, -0.15111111, 0.064444444, -0.062222222,
      -0.11777778,  0.035555556, 0.015555556, 0.068888889, 0.057777778, -0.066666667};
  for (Dtype dt : {Dtype::f64, Dtype::f32, Dtype::f16}) {
    Tensor y = avg_pool2d(seq({1, 2, 5, 5}, 7, dt), {3}, {2}, {1});
    expect_close(y, want, dt == Dtype::f16 ? 2e-3 : 1e-7, 1e-6);
  }
}

TEST(Pool2d, GradientsMatchFiniteDifferences) {
  // seq has distinct values in each window, so max is differentiable at these points.
  for (auto ksp :
       {std::tuple<int64_t, int64_t, int64_t>{3, 2, 1}, {2, 2, 0}, {3, 1, 1}, {2, 3, 1}}) {
    const int64_t k = std::get<0>(ksp), s = std::get<1>(ksp), p = std::get<2>(ksp);
    check_grad_fd([&](const std::vector<Tensor>& in) { return max_pool2d(in[0], {k}, {s}, {p}); },
                  {seq({2, 2, 6, 7}, 5)}, 1e-6, 1e-6);
    check_grad_fd([&](const std::vector<Tensor>& in) { return avg_pool2d(in[0], {k}, {s}, {p}); },
                  {seq({2, 2, 6, 7}, 5)}, 1e-6, 1e-6);
  }
  // Non-square windows and strides.
  check_grad_fd(
      [&](const std::vector<Tensor>& in) {
        return max_pool2d(in[0], {2, 3}, {1, 2}, {1, 1});
      },
      {seq({1, 3, 5, 6}, 9)}, 1e-6, 1e-6);
  check_grad_fd(
      [&](const std::vector<Tensor>& in) {
        return avg_pool2d(in[0], {2, 3}, {1, 2}, {1, 1});
      },
      {seq({1, 3, 5, 6}, 9)}, 1e-6, 1e-6);
}

TEST(Pool2d, BadArgumentsGiveClearErrors) {
  expect_error(
      [] {
        max_pool2d(zeros({1, 1, 4, 4}), {2}, {}, {2});
      },
      "[max_pool2d] padding (2, 2) must be at most half the kernel (2, 2)");
  expect_error(
      [] {
        avg_pool2d(zeros({4, 4}), {2});
      },
      "[avg_pool2d] input must be 3-D (C, H, W) or 4-D (N, C, H, W), got (4, 4)");
  expect_error(
      [] {
        max_pool2d(zeros({1, 1, 2, 4}), {3});
      },
      "[max_pool2d] kernel (3, 3) is larger than the padded input (2, 4) of input "
      "(1, 1, 2, 4)");
  expect_error(
      [] {
        avg_pool2d(zeros({1, 1, 4, 4}), {});
      },
      "[avg_pool2d] kernel must have 1 or 2 values, got 0");
}
