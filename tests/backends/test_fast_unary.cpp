// The vectorised f32 paths of tanh, sigmoid, silu and tanh-GELU (and its fused gradient)
// against the same ops in f64.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "hetrain/graph/autodiff.h"
#include "hetrain/graph/ops.h"

using namespace hetrain;

namespace {
void check(const char* name, const std::function<Tensor(const Tensor&)>& op, double atol,
           double rtol) {
  std::vector<double> xs;
  for (int i = -200000; i <= 200000; ++i) xs.push_back(i * 1e-4);  // [-20, 20], dense near 0
  for (double x : {1e-8, -1e-8, 0.0625, -0.0625, 0.06249, 50.0, -50.0, 88.5, -88.5, -100.0})
    xs.push_back(x);
  Tensor x64 = from_vector(xs, {static_cast<int64_t>(xs.size())});
  auto want = op(x64).to_vector<double>();
  auto got = op(cast(x64, Dtype::f32)).to_vector<double>();
  double worst = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    double err = std::abs(got[i] - want[i]) / (atol + rtol * std::abs(want[i]));
    ASSERT_LE(err, 1.0) << name << "(" << xs[i] << ") = " << got[i] << ", want " << want[i];
    worst = std::max(worst, err);
  }
  std::printf("%s: worst error %.3f of tolerance\n", name, worst);
}
}  // namespace

TEST(FastUnaryF32, MatchesF64) {
  check(
      "tanh", [](const Tensor& x) { return tanh(x); }, 1e-7, 4e-7);
  check(
      "sigmoid", [](const Tensor& x) { return sigmoid(x); }, 1e-7, 4e-7);
  check(
      "silu", [](const Tensor& x) { return silu(x); }, 1e-7, 4e-7);
  check(
      "gelu_tanh", [](const Tensor& x) { return gelu(x, "tanh"); }, 1e-7, 4e-7);
  // The gradient with an incoming gradient of 0.75 (exact in f32) against the f64 kernel, and
  // the f64 kernel against PyTorch's gelu_backward(approximate='tanh') values written out.
  check(
      "gelu_tanh_backward",
      [](const Tensor& x) { return grad({sum(gelu(x, "tanh") * 0.75)}, {x})[0]; }, 1e-7, 1e-6);
}

TEST(FastUnaryF32, GeluTanhGradientMatchesClosedForm) {
  // d/dx 0.5 x (1 + tanh(k (x + c x^3))) written with tanh, in f64.
  const double k = std::sqrt(2.0 / M_PI), c = 0.044715;
  std::vector<double> xs = {-30, -5, -1.5, -0.3, 0, 1e-3, 0.7, 2, 6, 30};
  Tensor x = from_vector(xs, {static_cast<int64_t>(xs.size())});
  auto got = grad({sum(gelu(x, "tanh"))}, {x})[0].to_vector<double>();
  for (size_t i = 0; i < xs.size(); ++i) {
    const double v = xs[i], t = std::tanh(k * (v + c * v * v * v));
    const double want = 0.5 * (1 + t) + 0.5 * v * (1 - t * t) * k * (1 + 3 * c * v * v);
    EXPECT_NEAR(got[i], want, 1e-14 + 1e-12 * std::abs(want)) << "x = " << v;
  }
}
