#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "hetrain/base/error.h"
#include "hetrain/training/nn.h"
#include "hetrain/training/trainer.h"
#include "testing.h"

using namespace hetrain;
using hetrain::testing::expect_close;

TEST(Modules, LinearInitAndNames) {
  Generator g(3);
  nn::Linear l(100, 7, true, g);
  auto names = l.named_parameters();
  ASSERT_EQ(names.size(), 2u);
  EXPECT_EQ(names[0].first, "weight");
  EXPECT_EQ(names[1].first, "bias");
  EXPECT_EQ(l.num_parameters(), 707);
  // torch.nn.Linear: U(-1/sqrt(in), 1/sqrt(in)).
  auto w = l.weight().to_vector<double>();
  double lo = 1, hi = -1;
  for (double v : w) {
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  EXPECT_GE(lo, -0.1);
  EXPECT_LE(hi, 0.1);
  EXPECT_LT(lo, -0.09);
  EXPECT_GT(hi, 0.09);
  EXPECT_TRUE(l.weight().requires_grad());
}

TEST(Modules, SequentialNamesAndStateDictErrors) {
  Generator g(1);
  auto m = nn::make_mlp(4, {8}, 3, g);
  auto names = m->named_parameters();
  ASSERT_EQ(names.size(), 4u);
  EXPECT_EQ(names[0].first, "1.weight");
  EXPECT_EQ(names[3].first, "3.bias");
  auto sd = m->state_dict();
  Generator g2(2);
  auto other = nn::make_mlp(4, {8}, 3, g2);
  other->load_state_dict(sd);
  expect_close(other->state_dict()["1.weight"], sd["1.weight"].to_vector<double>(), 0, 0);
  // A different model: every problem is listed, and nothing is loaded.
  auto wrong = nn::make_mlp(4, {5}, 3, g2);
  auto before = wrong->state_dict()["1.weight"].to_vector<double>();
  try {
    wrong->load_state_dict(sd);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("shape mismatch: 1.weight checkpoint (8, 4) vs model (5, 4)"),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find("shape mismatch: 3.weight checkpoint (3, 8) vs model (3, 5)"),
              std::string::npos)
        << msg;
  }
  expect_close(wrong->state_dict()["1.weight"], before, 0, 0);
  sd.erase("3.bias");
  sd["extra"] = zeros({1});
  try {
    other->load_state_dict(sd);
    FAIL();
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("missing: 3.bias"), std::string::npos) << msg;
    EXPECT_NE(msg.find("unexpected: extra"), std::string::npos) << msg;
  }
}

// Reference: torch.nn.BatchNorm2d(3) in f64 on x = 3*sin(arange(24)).reshape(2,3,2,2), with
// weight (1, 2, 0.5), bias (0, -1, 0.25); one training forward, then eval.
TEST(Modules, BatchNormMatchesTorch) {
  std::vector<double> xs(24);
  for (int i = 0; i < 24; ++i) xs[static_cast<size_t>(i)] = 3 * std::sin(static_cast<double>(i));
  Tensor x = from_vector(xs, {2, 3, 2, 2});
  nn::BatchNorm2d bn(3);
  auto params = bn.named_parameters();
  std::map<std::string, Tensor> sd = bn.state_dict();
  sd["weight"] = from_vector<double>({1.0, 2.0, 0.5}, {3});
  sd["bias"] = from_vector<double>({0.0, -1.0, 0.25}, {3});
  bn.load_state_dict(sd);
  Tensor y = bn.forward(cast(x, Dtype::f32));
  expect_close(
      y, {-0.8617786115526602, 0.8363045708867076,    0.9731779065031386,  -0.5769993182453863,
          -2.3290797399766654, -3.0789742251859193,   -0.5579204043292539, 2.9162364661330806,
          0.8388759745511314,  0.4592264079248449,    -0.1696249075780545, -0.4695149725806272,
          -1.944579402856197,  -0.013884160131278238, 1.1372608342224249,  0.45049818117325047,
          -0.5894111634128131, -3.0881501386240124,   -2.3075045152712024, 1.0348037206667855,
          0.7886192827615649,  0.7384437402152687,    0.1823553211612451,  -0.3683808464553733},
      1e-5, 1e-5);
  auto st = bn.state_dict();
  expect_close(st["running_mean"],
               {0.12811416503893644, -0.11957124431642059, 0.028199797133369033}, 1e-6, 1e-6);
  expect_close(st["running_var"], {1.152576453313489, 1.1988950297458791, 1.4944567875175943}, 1e-6,
               1e-6);
  EXPECT_EQ(st["num_batches_tracked"].item<int64_t>(), 1);
  bn.eval();
  auto ye = bn.forward(cast(x, Dtype::f32)).to_vector<double>();
  expect_close(std::vector<double>(ye.begin(), ye.begin() + 6),
               {-0.11933295500386425, 2.2320515106394123, 2.4215839425353076, 0.2750090968723276,
                -4.92866457034567, -6.036236580832088},
               1e-5, 1e-5);
}

TEST(Modules, BatchNormAddReluIsReluOfSum) {
  // forward_add_relu(x, s) = relu(forward(x) + s) in training (one fused kernel) and in eval
  // (running statistics); a residual of another shape is an error in both, never a broadcast.
  std::vector<double> xs(48), ss(48);
  for (int i = 0; i < 48; ++i) {
    xs[static_cast<size_t>(i)] = 3 * std::sin(static_cast<double>(i));
    ss[static_cast<size_t>(i)] = std::cos(0.7 * static_cast<double>(i));
  }
  Tensor x = cast(from_vector(xs, {2, 3, 2, 4}), Dtype::f32);
  Tensor s = cast(from_vector(ss, {2, 3, 2, 4}), Dtype::f32);
  for (bool train : {true, false}) {
    nn::BatchNorm2d a(3), b(3);
    a.train(train), b.train(train);
    const auto fused = a.forward_add_relu(x, s).to_vector<double>();
    const auto composite = relu(b.forward(x) + s).to_vector<double>();
    ASSERT_EQ(fused.size(), composite.size());
    for (size_t i = 0; i < fused.size(); ++i)
      EXPECT_NEAR(fused[i], composite[i], 1e-6) << (train ? "train " : "eval ") << i;
    EXPECT_GT(std::count(fused.begin(), fused.end(), 0.0), 4);  // the relu cuts some
    try {
      a.forward_add_relu(x, zeros({2, 3, 1, 1}));
      ADD_FAILURE() << "expected an error";
    } catch (const Error& e) {
      EXPECT_EQ(
          std::string(e.what()),
          "[BatchNorm2d] residual must have the input's shape (2, 3, 2, 4), got (2, 3, 1, 1)");
    }
  }
}

TEST(TrainConfig, PresetsFlagsAndErrors) {
  auto c = training::preset_config("gpt-mini");
  EXPECT_EQ(c.model, "gpt");
  training::apply_setting(c, "batch_size", "16", "test");
  training::apply_setting(c, "hidden", "[3, 4]", "test");
  EXPECT_EQ(c.batch_size, 16);
  EXPECT_EQ(c.hidden, (std::vector<int64_t>{3, 4}));
  EXPECT_THROW(training::preset_config("fashion-rnn"), Error);
  try {
    training::apply_setting(c, "lr", "fast", "flag --lr");
    FAIL();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "[train] flag --lr: 'lr' expects a finite number, got 'fast'");
  }
  try {
    training::apply_setting(c, "lerning-rate", "1", "config x.toml");
    FAIL();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "[train] config x.toml: unknown setting 'lerning-rate'");
  }
  c.width = 130;
  EXPECT_THROW(training::validate(c), Error);  // not divisible by heads
}
