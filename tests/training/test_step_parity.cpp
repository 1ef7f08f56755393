// One training step of each model from identical weights and batch against PyTorch: the loss
// and every parameter gradient. Reference: tools/gen_train_parity.py (PyTorch 1.13, f32).
#include <gtest/gtest.h>

#include "hetrain/interop/safetensors.h"
#include "hetrain/training/nn.h"
#include "testing.h"

using namespace hetrain;

namespace {

std::string data_path() {
  const char* env = std::getenv("HETRAIN_SOURCE_DIR");
  return std::string(env ? env : HETRAIN_SOURCE_DIR) + "/tests/data/train_parity.safetensors";
}

void check_step(const std::string& prefix, nn::Module& model, bool language) {
  static const safetensors::File file = safetensors::load(data_path());
  std::map<std::string, Tensor> weights;
  const std::string wp = prefix + ".w.";
  for (const auto& [name, t] : file.tensors)
    if (name.rfind(wp, 0) == 0) weights[name.substr(wp.size())] = t;
  model.load_state_dict(weights);
  model.train();
  Tensor x = file.tensors.at(prefix + ".x"), y = file.tensors.at(prefix + ".y");
  Tensor logits = model.forward(x);
  Tensor loss = language
                    ? cross_entropy(reshape(logits, {-1, logits.shape().back()}), reshape(y, {-1}))
                    : cross_entropy(logits, y);
  loss.backward();
  // f32 throughout; PyTorch's reduction orders differ from ours, hence the tolerance.
  EXPECT_NEAR(loss.item<double>(), file.tensors.at(prefix + ".loss").item<double>(), 1e-5)
      << prefix;
  int checked = 0;
  for (auto& [name, p] : model.named_parameters()) {
    auto it = file.tensors.find(prefix + ".grad." + name);
    ASSERT_NE(it, file.tensors.end()) << prefix << ": no reference gradient for " << name;
    ASSERT_TRUE(p->grad().defined()) << prefix << ": no gradient for " << name;
    hetrain::testing::expect_close(p->grad().to_vector<double>(), it->second.to_vector<double>(),
                                   2e-5, 2e-4, prefix + " grad " + name);
    ++checked;
  }
  EXPECT_EQ(checked, static_cast<int>(model.named_parameters().size()));
}

}  // namespace

TEST(StepParity, Mlp) {
  auto m = nn::make_mlp(64, {16}, 10);
  check_step("mlp", *m, false);
}

TEST(StepParity, ResNetWithBatchNorm) {
  nn::ResNet m(1, 10, {4, 8}, 1);
  check_step("cnn", m, false);
}

TEST(StepParity, Gpt) {
  nn::Gpt m({.vocab = 32, .context = 8, .layers = 2, .heads = 2, .dim = 16});
  check_step("gpt", m, true);
}
