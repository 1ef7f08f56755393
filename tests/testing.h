// Helpers shared by the test binaries.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "hetrain/base/error.h"
#include "hetrain/graph/autodiff.h"
#include "hetrain/graph/ops.h"

namespace hetrain::testing {

/// n values in [-1, 1) from a fixed linear congruential sequence started at seed: the same
/// inputs on every machine, without a generator.
inline std::vector<float> lcg_values(int64_t n, uint32_t seed) {
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) {
    seed = seed * 1664525u + 1013904223u;
    x = static_cast<float>(seed >> 8) / 8388608.0f - 1.0f;
  }
  return v;
}

/// The message of the hetrain::Error f throws, or "no error".
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

inline void expect_close(const std::vector<double>& got, const std::vector<double>& want,
                         double atol, double rtol, const std::string& what = "") {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(want[i])) {
      EXPECT_TRUE(std::isnan(got[i])) << what << " [" << i << "]";
      continue;
    }
    EXPECT_NEAR(got[i], want[i], atol + rtol * std::abs(want[i])) << what << " [" << i << "]";
  }
}

inline void expect_close(const Tensor& got, const std::vector<double>& want, double atol = 1e-6,
                         double rtol = 1e-5, const std::string& what = "") {
  expect_close(got.to_vector<double>(), want, atol, rtol, what);
}

/// Checks the gradient of sum(f(inputs) * w) (w a fixed random weight) against central
/// finite differences in f64.
inline void check_grad_fd(const std::function<Tensor(const std::vector<Tensor>&)>& f,
                          std::vector<Tensor> inputs, double eps = 1e-6, double tol = 1e-5,
                          std::vector<int> check = {}) {
  for (auto& x : inputs) x = x.detach();
  Generator gen(1234);
  Tensor y0 = f(inputs);
  Tensor w = randn(y0.shape(), Dtype::f64, gen);
  auto objective = [&](const std::vector<Tensor>& in) { return sum(f(in) * w); };
  auto [val, grads] = value_and_grad(objective, inputs);
  if (check.empty())
    for (size_t i = 0; i < inputs.size(); ++i)
      if (is_floating(inputs[i].dtype())) check.push_back(static_cast<int>(i));
  for (int k : check) {
    auto base = inputs[static_cast<size_t>(k)].to_vector<double>();
    std::vector<double> num(base.size());
    for (size_t j = 0; j < base.size(); ++j) {
      auto plus = base, minus = base;
      plus[j] += eps;
      minus[j] -= eps;
      auto in_p = inputs, in_m = inputs;
      in_p[static_cast<size_t>(k)] = from_vector(plus, inputs[static_cast<size_t>(k)].shape());
      in_m[static_cast<size_t>(k)] = from_vector(minus, inputs[static_cast<size_t>(k)].shape());
      num[j] = (objective(in_p).item<double>() - objective(in_m).item<double>()) / (2 * eps);
    }
    expect_close(grads[static_cast<size_t>(k)].to_vector<double>(), num, tol, tol,
                 "grad of input " + std::to_string(k));
  }
}

}  // namespace hetrain::testing
