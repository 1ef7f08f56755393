// Optimizer trajectories against torch.optim (PyTorch 1.13, f64), from:
//   p = [1, -2, 3, 0.5]; x = [0.5, 1.5, -1, 2]; y = [1, 0, 2, -1]
//   5 steps of loss = sum((p*x - y)^2), optional clip_grad_norm_(1.0) before each step.
#include <gtest/gtest.h>

#include <functional>

#include "hetrain/base/error.h"
#include "hetrain/training/optim.h"
#include "testing.h"

using namespace hetrain;
using hetrain::testing::expect_close;

namespace {
std::vector<double> run(const std::function<std::unique_ptr<optim::Optimizer>(optim::NamedParams)>& make,
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
  hetrain::testing::expect_close(run(sgd({.lr = 0.05})),
                                 {1.118904306640625, -0.5591631054687499, 0.9524499999999997, -0.42224},
                                 1e-12, 1e-12, "sgd");
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

TEST(Optim, Schedules) {
  optim::LrSchedule c{.kind = "cosine", .base_lr = 1.0, .warmup_steps = 10, .total_steps = 110,
                      .min_lr = 0.1};
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
