// Optimizer trajectories against torch.optim (PyTorch 1.13, f64), from:
//   p = [1, -2, 3, 0.5]; x = [0.5, 1.5, -1, 2]; y = [1, 0, 2, -1]
//   5 steps of loss = sum((p*x - y)^2), optional clip_grad_norm_(1.0) before each step.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "hetrain/base/error.h"
#include "hetrain/training/optim.h"
#include "testing.h"

using namespace hetrain;
using hetrain::testing::expect_close;

namespace {
std::vector<double> run(
    const std::function<std::unique_ptr<optim::Optimizer>(optim::NamedParams)>& make,
    double clip = 0) {
  Tensor p = from_vector<double>({1.0, -2.0, 3.0, 0.5}, {4}).requires_grad_();
  Tensor x = from_vector<double>({0.5, 1.5, -1.0, 2.0}, {4});
  Tensor y = from_vector<double>({1.0, 0.0, 2.0, -1.0}, {4});
  auto opt = make({{"p", &p}});
  for (int i = 0; i < 5; ++i) {
    opt->zero_grad();
    Tensor loss = sum(square(p * x - y));
    loss.backward();
    if (clip > 0) optim::clip_grad_norm({&p}, clip);
    opt->step();
  }
  EXPECT_TRUE(p.is_leaf());
  EXPECT_TRUE(p.requires_grad());
  return p.to_vector<double>();
}
}  // namespace

TEST(Optim, SgdMatchesTorch) {
  auto sgd = [](optim::SgdOptions o) {
    return [o](optim::NamedParams ps) { return std::make_unique<optim::SGD>(ps, o); };
  };
  hetrain::testing::expect_close(
      run(sgd({.lr = 0.05})),
      {1.118904306640625, -0.5591631054687499, 0.9524499999999997, -0.42224}, 1e-12, 1e-12, "sgd");
  hetrain::testing::expect_close(
      run(sgd({.lr = 0.05, .momentum = 0.9, .weight_decay = 0.01})),
      {1.3030647608310015, 1.3198273591681284, -2.154688704663494, -1.2272104619185564}, 1e-12,
      1e-12, "sgd momentum + weight decay");
  hetrain::testing::expect_close(
      run(sgd({.lr = 0.05, .momentum = 0.9, .nesterov = true})),
      {1.3796844769393555, 0.8432484918771482, -2.5229084195, -0.6651358016000001}, 1e-12, 1e-12,
      "sgd nesterov");
  hetrain::testing::expect_close(
      run(sgd({.lr = 0.05, .momentum = 0.5, .dampening = 0.3})),
      {1.148822018711914, -0.1549189472480469, 0.40367954500000014, -0.658283264}, 1e-12, 1e-12,
      "sgd dampening");
}

TEST(Optim, AdamWMatchesTorch) {
  auto adamw = [](optim::AdamWOptions o) {
    return [o](optim::NamedParams ps) { return std::make_unique<optim::AdamW>(ps, o); };
  };
  hetrain::testing::expect_close(
      run(adamw({.lr = 0.1, .weight_decay = 0.1})),
      {1.4345000156634407, -1.415566479233036, 2.3641700703459154, -0.006204765124292022}, 1e-12,
      1e-10, "adamw");
  hetrain::testing::expect_close(
      run(adamw({.lr = 0.1, .beta1 = 0.8, .beta2 = 0.99, .eps = 1e-6, .weight_decay = 0.01}), 1.0),
      {1.4875130736306095, -1.4911848955212665, 2.483407109554304, 0.005232170723428811}, 1e-12,
      1e-10, "adamw + clipping");
}

TEST(Optim, StateDictRoundTripAndErrors) {
  Tensor p = from_vector<float>({1, 2}, {2}).requires_grad_();
  optim::AdamW opt({{"w", &p}}, {});
  p.set_grad(from_vector<float>({0.5, -0.5}, {2}));
  opt.step();
  auto st = opt.state_dict();
  ASSERT_EQ(st.size(), 2u);
  EXPECT_TRUE(st.count("exp_avg.w"));
  optim::AdamW other({{"w", &p}}, {});
  other.load_state_dict(st, opt.steps());
  EXPECT_EQ(other.steps(), 1);
  EXPECT_THROW(other.load_state_dict({{"exp_avg.nope", zeros({2})}}, 1), Error);
  EXPECT_THROW(other.load_state_dict({{"exp_avg.w", zeros({3})}}, 1), Error);
  EXPECT_THROW(optim::AdamW({{"w", &p}}, {.beta1 = 1.0}), Error);
}

TEST(Optim, StateEntriesFindTheirParameterByName) {
  // Another optimizer over the same parameters listed in another order takes each entry by its
  // parameter's name, not its position.
  Tensor a = from_vector<float>({1, 2}, {2}).requires_grad_();
  Tensor b = from_vector<float>({3, 4, 5}, {3}).requires_grad_();
  Tensor c = from_vector<float>({-1, 6}, {2}).requires_grad_();
  optim::AdamW opt({{"a", &a}, {"b", &b}, {"c", &c}}, {});
  a.set_grad(from_vector<float>({0.5, -0.5}, {2}));
  b.set_grad(from_vector<float>({1, 2, 3}, {3}));
  c.set_grad(from_vector<float>({-2, 0.25}, {2}));
  opt.step();
  const auto st = opt.state_dict();
  ASSERT_EQ(st.size(), 6u);
  optim::AdamW other({{"c", &c}, {"a", &a}, {"b", &b}}, {});
  other.load_state_dict(st, opt.steps());
  const auto back = other.state_dict();
  ASSERT_EQ(back.size(), st.size());
  for (const auto& [key, t] : st) {
    ASSERT_TRUE(back.count(key)) << key;
    EXPECT_EQ(back.at(key).to_vector<float>(), t.to_vector<float>()) << key;
  }
  // An entry for a parameter of another shape is refused, naming the entry.
  try {
    other.load_state_dict({{"exp_avg.b", zeros({2})}}, 1);
    FAIL() << "a (2) entry for the (3) parameter b was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("exp_avg.b"), std::string::npos) << e.what();
  }
}

TEST(Optim, Schedules) {
  optim::LrSchedule c{
      .kind = "cosine", .base_lr = 1.0, .warmup_steps = 10, .total_steps = 110, .min_lr = 0.1};
  EXPECT_DOUBLE_EQ(c.at(0), 0.1);
  EXPECT_DOUBLE_EQ(c.at(9), 1.0);
  EXPECT_DOUBLE_EQ(c.at(10), 1.0);
  EXPECT_NEAR(c.at(60), 0.55, 1e-12);
  EXPECT_NEAR(c.at(110), 0.1, 1e-12);
  EXPECT_NEAR(c.at(500), 0.1, 1e-12);
  optim::LrSchedule s{.kind = "step", .base_lr = 1.0, .step_size = 3, .gamma = 0.5};
  EXPECT_DOUBLE_EQ(s.at(2), 1.0);
  EXPECT_DOUBLE_EQ(s.at(3), 0.5);
  EXPECT_DOUBLE_EQ(s.at(7), 0.25);
  optim::LrSchedule bad{.kind = "linear"};
  EXPECT_THROW(bad.at(0), Error);
}

// The fused AdamW kernel against the update written out in f64, for f32 and bf16 tensors
// large enough to be split across threads, with and without weight decay.
TEST(Optim, FusedAdamWMatchesFormula) {
  const int64_t n = 40000;
  std::vector<double> p(n), g(n), m(n), v(n);
  for (int64_t i = 0; i < n; ++i) {
    double t = static_cast<double>(i);
    p[i] = std::sin(t * 0.37), g[i] = std::cos(t * 0.11) * 1e-2;
    m[i] = std::sin(t * 0.05) * 1e-3, v[i] = 1e-5 * (1.5 + std::cos(t * 0.29));
  }
  for (double wd : {0.0, 0.1}) {
    AdamWStepArgs a{3e-3, 0.9, 0.95, 1e-8, wd, 1 - std::pow(0.9, 3), 1 - std::pow(0.95, 3)};
    for (Dtype dt : {Dtype::f32, Dtype::bf16}) {
      auto mk = [&](const std::vector<double>& x) { return cast(from_vector<double>(x, {n}), dt); };
      auto r = adamw_update(mk(p), mk(g), mk(m), mk(v), a);
      auto po = cast(r[0], Dtype::f64).to_vector<double>();
      auto mo = cast(r[1], Dtype::f64).to_vector<double>();
      // Inputs as the kernel saw them (rounded to dt), then the update in f64.
      auto pr = cast(mk(p), Dtype::f64).to_vector<double>();
      auto gr = cast(mk(g), Dtype::f64).to_vector<double>();
      auto mr = cast(mk(m), Dtype::f64).to_vector<double>();
      auto vr = cast(mk(v), Dtype::f64).to_vector<double>();
      const double tol = dt == Dtype::f32 ? 1e-6 : 1e-2;
      for (int64_t i = 0; i < n; i += 997) {
        double mi = 0.9 * mr[i] + 0.1 * gr[i];
        double vi = 0.95 * vr[i] + 0.05 * gr[i] * gr[i];
        double pi =
            pr[i] * (1 - a.lr * wd) - a.lr / a.bias_correction1 * mi /
                                          (std::sqrt(vi) / std::sqrt(a.bias_correction2) + a.eps);
        ASSERT_NEAR(po[i], pi, tol * (std::abs(pi) + 1e-3)) << "element " << i;
        // scaled by the terms, not the (possibly cancelling) sum
        ASSERT_NEAR(mo[i], mi, tol * (0.9 * std::abs(mr[i]) + 0.1 * std::abs(gr[i]) + 1e-9))
            << "element " << i;
      }
    }
  }
}

TEST(Optim, FusedAdamWRejectsMismatchedState) {
  Tensor p = zeros({4, 3}), g = zeros({4, 3}), m = zeros({3, 4}), v = zeros({4, 3});
  try {
    adamw_update(p, g, m, v, AdamWStepArgs{});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("exp_avg is f32 (3, 4), param is f32 (4, 3)"),
              std::string::npos)
        << e.what();
  }
}

// A Linear layer's weight gradient comes out contiguous (no copy at the leaf) and correct.
TEST(Optim, LinearWeightGradientIsContiguous) {
  Tensor w = from_vector<double>({1, 2, 3, 4, 5, 6}, {2, 3}).requires_grad_();
  Tensor x = from_vector<double>({1, -1, 2, 0.5, 3, -2, 1, 1, 1, 0, 2, -1}, {4, 3});
  sum(square(linear(x, w, Tensor()))).backward();
  const Array& a = w.grad().array();
  EXPECT_TRUE(a.contiguous());
  // dL/dW = 2 (x Wᵀ)ᵀ x
  std::vector<double> xv = x.to_vector<double>(), wv = {1, 2, 3, 4, 5, 6}, expect(6, 0.0);
  for (int r = 0; r < 4; ++r)
    for (int o = 0; o < 2; ++o) {
      double y = 0;
      for (int k = 0; k < 3; ++k) y += xv[r * 3 + k] * wv[o * 3 + k];
      for (int k = 0; k < 3; ++k) expect[o * 3 + k] += 2 * y * xv[r * 3 + k];
    }
  expect_close(w.grad().to_vector<double>(), expect, 1e-12, 1e-12, "dW");
}
