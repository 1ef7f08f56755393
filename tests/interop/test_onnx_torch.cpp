// Models exported by PyTorch (tests/data/torch_onnx, written by tools/gen_torch_onnx_fixtures.py
// with torch.onnx): an MLP, a small ResNet and a GPT-2 block import, run within 1e-5 of
// PyTorch's output, and one fine-tuning step's gradients equal PyTorch's.
#include <gtest/gtest.h>

#include <filesystem>

#include "hetrain/graph/ops.h"
#include "hetrain/interop/onnx.h"
#include "testing.h"

using namespace hetrain;
namespace fs = std::filesystem;

namespace {

fs::path fixture(const std::string& name) {
  return fs::path(HETRAIN_SOURCE_DIR) / "tests" / "data" / "torch_onnx" / name;
}

std::vector<double> doubles(const Tensor& t) { return t.to_vector<double>(); }

void check_against_torch(const std::string& name) {
  const fs::path d = fixture(name);
  interop::OnnxModel m = interop::load_onnx((d / "model.onnx").string());
  const Tensor x = interop::read_tensor_file((d / "input_0.npy").string());
  const Tensor want = interop::read_tensor_file((d / "output_0.npy").string());
  const Tensor cot = interop::read_tensor_file((d / "cotangent_0.npy").string());
  Tensor y = m.forward({x})[0];
  ASSERT_EQ(y.shape(), want.shape()) << name;
  // The forward in f32 against PyTorch's f32 (different summation orders): 1e-5.
  hetrain::testing::expect_close(doubles(y), doubles(want), 1e-5, 1e-5, name + " output");

  // One fine-tuning step: d/dp sum(output * cotangent) for every parameter PyTorch has.
  sum(y * cot).backward();
  std::map<std::string, Tensor> params(m.parameters().begin(), m.parameters().end());
  int checked = 0;
  for (const auto& f : fs::directory_iterator(d / "grads")) {
    const std::string pname = f.path().stem().string();
    ASSERT_TRUE(params.count(pname)) << name << ": no initializer " << pname;
    const Tensor g = params[pname].grad();
    ASSERT_TRUE(g.defined()) << name << ": no gradient for " << pname;
    const Tensor gw = interop::read_tensor_file(f.path().string());
    ASSERT_EQ(g.shape(), gw.shape()) << pname;
    // Gradients sum over the batch (and positions): atol 1e-5, rtol 1e-4.
    hetrain::testing::expect_close(doubles(g), doubles(gw), 1e-5, 1e-4, name + " grad " + pname);
    ++checked;
  }
  EXPECT_GT(checked, 0) << name;
}

TEST(OnnxTorchTest, MlpMatchesPyTorch) { check_against_torch("mlp"); }
TEST(OnnxTorchTest, ResNetMatchesPyTorch) { check_against_torch("resnet"); }
TEST(OnnxTorchTest, Gpt2BlockMatchesPyTorch) { check_against_torch("gpt2_block"); }

// The files' symbolic axes: the same model at another batch (and sequence) runs too.
TEST(OnnxTorchTest, SymbolicAxesTakeOtherSizes) {
  interop::OnnxModel m = interop::load_onnx((fixture("gpt2_block") / "model.onnx").string());
  ASSERT_EQ(m.inputs()[0].dim_params, (std::vector<std::string>{"batch", "seq", ""}));
  Generator gen(11);
  Tensor x = randn({3, 9, 32}, Dtype::f32, gen);
  Tensor y = m.forward({x})[0];
  EXPECT_EQ(y.shape(), (Shape{3, 9, 32}));
  // Causal: position 0 of the output does not change when later positions do.
  Tensor x2 = concat({slice(x, 1, 0, 1, 1), randn({3, 8, 32}, Dtype::f32, gen)}, 1);
  Tensor y2 = m.forward({x2})[0];
  EXPECT_EQ(slice(y, 1, 0, 1, 1).to_vector<float>(), slice(y2, 1, 0, 1, 1).to_vector<float>());
}

}  // namespace
