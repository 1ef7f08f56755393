// Models exported by PyTorch (tests/data/torch_onnx, written by tools/gen_torch_onnx_fixtures.py
// with torch.onnx): an MLP, a small ResNet, a GPT-2 block and two GPTs (explicit attention with
// tanh-GELU; scaled_dot_product_attention with erf-GELU) import, run within 1e-5 of PyTorch's
// output, and one fine-tuning step's gradients equal PyTorch's. The GPTs' attention and GELU
// are fused at import into Hetrain's causal attention and GELU.
#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "hetrain/graph/ops.h"
#include "hetrain/graph/primitive.h"
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
TEST(OnnxTorchTest, GptExplicitAttentionMatchesPyTorch) { check_against_torch("gpt_explicit"); }
TEST(OnnxTorchTest, GptSdpaMatchesPyTorch) { check_against_torch("gpt_sdpa"); }

// The fusion rules recognise PyTorch's spellings: every layer's attention becomes one
// CausalAttention node that runs the packed causal sdpa kernel, every GELU one GELU node; no
// Softmax, Tanh or Erf is left. The GPT-2 block (the same attention, tanh-GELU) too.
TEST(OnnxTorchTest, PyTorchAttentionAndGeluAreFused) {
  struct Case {
    std::string name, gelu;
    int64_t layers, matmuls;  // matmuls: the projections (and the GPTs' head)
  };
  for (const Case& k :
       {Case{"gpt_explicit", "hetrain.GeluTanh", 2, 9}, Case{"gpt_sdpa", "hetrain.GeluErf", 2, 9},
        Case{"gpt2_block", "hetrain.GeluTanh", 1, 4}}) {
    interop::OnnxModel m = interop::load_onnx((fixture(k.name) / "model.onnx").string());
    auto ops = m.op_counts();
    EXPECT_EQ(ops["hetrain.CausalAttention"], k.layers) << k.name;
    EXPECT_EQ(ops[k.gelu], k.layers) << k.name;
    // Only the projections remain matrix products (sdpa's export sizes its mask from a view of
    // k: that Split and Reshape stay, read for their shapes).
    for (const char* op : {"Softmax", "Tanh", "Erf", "MatMul"})
      EXPECT_EQ(ops[op], op == std::string("MatMul") ? k.matmuls : 0) << k.name << " " << op;
    // Built, the attention is the causal sdpa kernel on the packed projection.
    const Tensor x = interop::read_tensor_file((fixture(k.name) / "input_0.npy").string());
    NoGradScope ng;
    const Tensor y = m.forward({x})[0];
    std::vector<Node*> stack = {y.node()};
    std::set<Node*> seen;
    int64_t sdpa = 0;
    while (!stack.empty()) {
      Node* n = stack.back();
      stack.pop_back();
      if (!n || !seen.insert(n).second) continue;
      if (n->prim && std::string(n->prim->name()) == "sdpa") ++sdpa;
      for (const auto& t : n->inputs) stack.push_back(t.node());
    }
    EXPECT_EQ(sdpa, k.layers) << k.name;
  }
}

// A mask other than the causal one (Trilu's upper flipped: j >= i) still fuses, and the fused
// node then computes the subgraph as written (PyTorch's dropped-where-true mask and sdpa's
// additive one, its scaled q and k); with the softmax also a graph output nothing fuses. Both
// agree, and differ from the causal model.
TEST(OnnxTorchTest, FusedAttentionWithAnotherMaskComputesTheSubgraph) {
  std::string tmpl = (fs::temp_directory_path() / "hetrain_onnx_mask_XXXXXX").string();
  ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
  const fs::path dir = tmpl;
  for (const std::string name : {"gpt_explicit", "gpt_sdpa"}) {
    onnx::ModelProto mp;
    {
      std::ifstream f(fixture(name) / "model.onnx", std::ios::binary);
      ASSERT_TRUE(mp.ParseFromIstream(&f));
    }
    auto variant = [&](bool flip, bool softmax_output) {
      onnx::ModelProto v = mp;
      for (auto& n : *v.mutable_graph()->mutable_node()) {
        if (flip && n.op_type() == "Trilu")
          for (auto& a : *n.mutable_attribute())
            if (a.name() == "upper") a.set_i(1);
        if (softmax_output && n.op_type() == "Softmax") {
          auto* o = v.mutable_graph()->add_output();
          o->set_name(n.output(0));
          o->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::FLOAT);
        }
      }
      const fs::path p = dir / (name + std::to_string(flip) + std::to_string(softmax_output));
      std::ofstream f(p, std::ios::binary);
      EXPECT_TRUE(v.SerializeToOstream(&f));
      f.close();
      return interop::load_onnx(p.string());
    };
    const Tensor x = interop::read_tensor_file((fixture(name) / "input_0.npy").string());
    interop::OnnxModel causal = variant(false, false), fused = variant(true, false),
                       plain = variant(true, true);
    EXPECT_EQ(fused.op_counts()["hetrain.CausalAttention"], 2) << name;
    EXPECT_EQ(plain.op_counts()["hetrain.CausalAttention"], 0) << name;
    EXPECT_EQ(plain.op_counts()["Softmax"], 2) << name;
    const std::vector<double> a = doubles(plain.forward({x})[0]),
                              b = doubles(fused.forward({x})[0]);
    hetrain::testing::expect_close(a, b, 1e-5, 1e-4, name + " another mask");
    EXPECT_NE(a, doubles(causal.forward({x})[0])) << name;
  }
  fs::remove_all(dir);
}

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
