// ONNX export and import: Hetrain -> ONNX -> Hetrain round trips, gradients through imported
// graphs, the unsupported-op report, bad files, and tensor files.
#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "hetrain/base/error.h"
#include "hetrain/graph/ops.h"
#include "hetrain/interop/onnx.h"
#include "hetrain/training/nn.h"
#include "hetrain/training/trainer.h"
#include "testing.h"

using namespace hetrain;
namespace fs = std::filesystem;

namespace {

class OnnxTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "hetrain_onnx_XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

training::TrainConfig small_config(const std::string& preset) {
  training::TrainConfig cfg = training::preset_config(preset);
  cfg.hidden = {24, 16};
  cfg.widths = {4, 8};
  cfg.blocks = 1;
  cfg.layers = 2, cfg.width = 16, cfg.heads = 2, cfg.context = 8;
  cfg.seed = 7;
  return cfg;
}

/// BatchNorm running statistics away from (0, 1), so the export must carry them.
void randomise_buffers(nn::Module& m) {
  Generator gen(99);
  for (auto& [name, t] : m.named_buffers()) {
    if (name.ends_with("running_mean")) *t = randn(t->shape(), Dtype::f32, gen).detach();
    if (name.ends_with("running_var")) *t = rand(t->shape(), 0.5, 2.0, Dtype::f32, gen).detach();
  }
}

Tensor model_input(const training::TrainConfig& cfg, int64_t batch, int64_t seq, uint64_t seed) {
  Generator gen(seed);
  if (cfg.model == "gpt")
    return cast(rand({batch, seq}, 0, 256, Dtype::f32, gen), Dtype::i64).eval().detach();
  return randn({batch, 1, 28, 28}, Dtype::f32, gen);
}

std::vector<float> values(const Tensor& t) { return t.to_vector<float>(); }

/// Exports cfg's model, imports it and compares both forwards on two batch sizes.
void round_trip(const training::TrainConfig& cfg, const std::string& file, bool bitwise) {
  auto model = training::build_model(cfg);
  randomise_buffers(*model);
  model->eval();
  interop::OnnxExportInfo info = interop::export_onnx(cfg, *model, file);
  EXPECT_TRUE(info.checked);
  EXPECT_EQ(info.opset, 17);
  EXPECT_EQ(info.ir_version, 8);
  interop::OnnxModel m = interop::load_onnx(file);
  ASSERT_EQ(m.inputs().size(), 1u);
  EXPECT_EQ(m.inputs()[0].name, cfg.model == "gpt" ? "ids" : "image");
  EXPECT_EQ(m.inputs()[0].dim_params[0], "batch");
  EXPECT_EQ(m.outputs()[0].name, "logits");
  // Every state-dict tensor but num_batches_tracked is an initializer of the same name.
  std::map<std::string, Tensor> params(m.parameters().begin(), m.parameters().end());
  for (auto& [name, t] : model->state_dict()) {
    if (name.ends_with("num_batches_tracked")) continue;
    ASSERT_TRUE(params.count(name)) << name;
    EXPECT_EQ(values(params[name]), values(t)) << name;
  }
  NoGradScope ng;
  for (auto [batch, seq] : {std::pair<int64_t, int64_t>{5, cfg.context}, {2, 3}}) {
    Tensor x = model_input(cfg, batch, seq, 11 + static_cast<uint64_t>(batch));
    std::vector<float> want = values(model->forward(x));
    std::vector<float> got = values(m.forward({x})[0]);
    if (bitwise) {
      EXPECT_EQ(got, want) << cfg.model << " batch " << batch;
    } else {
      std::vector<double> g(got.begin(), got.end()), w(want.begin(), want.end());
      hetrain::testing::expect_close(g, w, 1e-5, 1e-4, cfg.model);
    }
  }
}

TEST_F(OnnxTest, MlpRoundTripIsBitwise) {
  round_trip(small_config("fashion-mlp"), path("mlp.onnx"), true);
}
TEST_F(OnnxTest, CnnRoundTripIsBitwise) {
  round_trip(small_config("fashion-cnn"), path("cnn.onnx"), true);
}
// --fold-bn: every BatchNormalization folded into its convolution (randomised running
// statistics, so the fold matters); the graph has no BatchNormalization node left, the folded
// initializers replace the convolution and BN tensors, and the outputs agree with the module
// (one multiply fewer per element: not bit for bit).
TEST_F(OnnxTest, CnnExportFoldsBatchNorm) {
  training::TrainConfig cfg = small_config("fashion-cnn");
  auto model = training::build_model(cfg);
  randomise_buffers(*model);
  model->eval();
  interop::OnnxExportOptions opt;
  opt.fold_bn = true;
  interop::export_onnx(cfg, *model, path("fold.onnx"), opt);
  interop::OnnxModel m = interop::load_onnx(path("fold.onnx"));
  std::map<std::string, int64_t> ops = m.op_counts();
  EXPECT_EQ(ops.count("BatchNormalization"), 0u);
  std::map<std::string, Tensor> params(m.parameters().begin(), m.parameters().end());
  EXPECT_TRUE(params.count("stem.0.weight_bn_folded") && params.count("stem.0.bias_bn_folded"));
  EXPECT_EQ(params.count("stem.1.running_mean") + params.count("stem.0.weight"), 0u);
  int64_t bn = 0;
  for (auto& [name, t] : model->state_dict()) bn += name.ends_with("running_mean");
  EXPECT_EQ(ops["Conv"], bn);
  NoGradScope ng;
  for (int64_t batch : {5, 2}) {
    Tensor x = model_input(cfg, batch, 0, 21 + static_cast<uint64_t>(batch));
    hetrain::testing::expect_close(m.forward({x})[0].to_vector<double>(),
                                   model->forward(x).to_vector<double>(), 1e-5, 1e-4, "folded");
  }
}

// Attention and the tanh GELU are exported as ONNX's elementary ops; the importer's fusion
// rules recognise them and build Hetrain's fused ops again, so the round trip is bit for bit.
TEST_F(OnnxTest, GptRoundTripIsBitwise) {
  training::TrainConfig cfg = small_config("gpt-mini");
  round_trip(cfg, path("gpt.onnx"), true);
  std::map<std::string, int64_t> ops = interop::load_onnx(path("gpt.onnx")).op_counts();
  EXPECT_EQ(ops["hetrain.CausalAttention"], cfg.layers);
  EXPECT_EQ(ops["hetrain.GeluTanh"], cfg.layers);
  EXPECT_EQ(ops.count("Softmax") + ops.count("Tanh"), 0u);
}

TEST_F(OnnxTest, GradientsThroughImportedGraphMatchTheModule) {
  for (const char* preset : {"fashion-mlp", "fashion-cnn"}) {
    training::TrainConfig cfg = small_config(preset);
    auto model = training::build_model(cfg);
    randomise_buffers(*model);
    model->eval();
    interop::export_onnx(cfg, *model, path("g.onnx"));
    interop::OnnxModel m = interop::load_onnx(path("g.onnx"));
    Tensor x = model_input(cfg, 3, 0, 5);
    Generator gen(3);
    Tensor w = randn({3, 10}, Dtype::f32, gen);
    sum(model->forward(x) * w).backward();
    sum(m.forward({x})[0] * w).backward();
    std::map<std::string, Tensor> imported(m.parameters().begin(), m.parameters().end());
    for (auto& [name, p] : model->named_parameters()) {
      ASSERT_TRUE(imported[name].grad().defined()) << name;
      std::vector<float> a = values(p->grad()), b = values(imported[name].grad());
      std::vector<double> da(a.begin(), a.end()), db(b.begin(), b.end());
      hetrain::testing::expect_close(db, da, 1e-6, 1e-5, std::string(preset) + " " + name);
    }
  }
}

TEST_F(OnnxTest, ExternalDataAndOpsetChoice) {
  training::TrainConfig cfg = small_config("gpt-mini");
  auto model = training::build_model(cfg);
  model->eval();
  interop::OnnxExportOptions opt;
  opt.opset = 20;
  opt.external_data = true;
  interop::OnnxExportInfo info = interop::export_onnx(cfg, *model, path("e.onnx"), opt);
  EXPECT_TRUE(info.external_data);
  EXPECT_EQ(info.ir_version, 9);
  ASSERT_TRUE(fs::exists(path("e.onnx.data")));
  EXPECT_GE(static_cast<int64_t>(fs::file_size(path("e.onnx.data"))), info.parameter_bytes);
  EXPECT_LT(static_cast<int64_t>(fs::file_size(path("e.onnx"))), info.parameter_bytes);
  interop::OnnxModel m = interop::load_onnx(path("e.onnx"));
  EXPECT_EQ(m.op_counts()["Gelu"], cfg.layers);  // one node from opset 20
  EXPECT_EQ(m.num_parameters(), model->num_parameters());
  // The weights are read back from the data file.
  NoGradScope ng;
  Tensor x = model_input(cfg, 2, 4, 1);
  std::vector<float> got = values(m.forward({x})[0]), want = values(model->forward(x));
  std::vector<double> g(got.begin(), got.end()), w(want.begin(), want.end());
  hetrain::testing::expect_close(g, w, 1e-5, 1e-4);
  // Without the data file: an error naming it.
  fs::remove(path("e.onnx.data"));
  try {
    interop::load_onnx(path("e.onnx"));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("e.onnx.data"), std::string::npos) << e.what();
  }
  // Opsets out of range, and a gpt below LayerNormalization's opset.
  opt.opset = 22;
  EXPECT_THROW(interop::export_onnx(cfg, *model, path("x.onnx"), opt), Error);
  opt.opset = 16;
  EXPECT_THROW(interop::export_onnx(cfg, *model, path("x.onnx"), opt), Error);
  EXPECT_FALSE(fs::exists(path("x.onnx")));
}

// Past the threshold the weights go beside the model whatever the flag says (protobuf cannot
// write a message of 2 GiB); the threshold is lowered here so a small model crosses it.
TEST_F(OnnxTest, ExternalDataIsAutomaticPastTheThreshold) {
  EXPECT_LT(interop::OnnxExportOptions{}.external_threshold_bytes, int64_t{2} << 30);
  training::TrainConfig cfg = small_config("fashion-mlp");
  auto model = training::build_model(cfg);
  randomise_buffers(*model);
  model->eval();
  interop::OnnxExportOptions opt;
  ASSERT_FALSE(opt.external_data);
  int64_t bytes = interop::export_onnx(cfg, *model, path("below.onnx"), opt).parameter_bytes;
  EXPECT_GE(bytes, model->num_parameters() * 4);
  opt.external_threshold_bytes = bytes + 1;  // one byte short of the threshold: inline
  interop::OnnxExportInfo below = interop::export_onnx(cfg, *model, path("below.onnx"), opt);
  EXPECT_FALSE(below.external_data);
  EXPECT_FALSE(fs::exists(path("below.onnx.data")));
  opt.external_threshold_bytes = bytes;  // reached: external
  interop::OnnxExportInfo at = interop::export_onnx(cfg, *model, path("at.onnx"), opt);
  EXPECT_TRUE(at.external_data);
  ASSERT_TRUE(fs::exists(path("at.onnx.data")));
  EXPECT_GE(static_cast<int64_t>(fs::file_size(path("at.onnx.data"))), at.parameter_bytes);
  EXPECT_LT(static_cast<int64_t>(fs::file_size(path("at.onnx"))), at.parameter_bytes);
  // Both files give the same outputs, bit for bit (the same f32 weights, read back either way).
  NoGradScope ng;
  Tensor x = model_input(cfg, 3, 0, 7);
  std::vector<float> a = values(interop::load_onnx(path("below.onnx")).forward({x})[0]);
  std::vector<float> b = values(interop::load_onnx(path("at.onnx")).forward({x})[0]);
  std::vector<float> want = values(model->forward(x));
  EXPECT_EQ(a, b);
  ASSERT_EQ(a.size(), want.size());
  std::vector<double> da(a.begin(), a.end()), dw(want.begin(), want.end());
  hetrain::testing::expect_close(da, dw, 1e-6, 1e-5);
}

TEST_F(OnnxTest, ExporterRefusesAModelItDoesNotDescribe) {
  training::TrainConfig cfg = small_config("fashion-mlp");
  auto model = training::build_model(cfg);
  cfg.hidden = {24};  // one Linear fewer than the module has
  try {
    interop::export_onnx(cfg, *model, path("m.onnx"));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("does not know how to express"), std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(fs::exists(path("m.onnx")));
}

// ---- the importer on hand-made models -------------------------------------------------------

onnx::ModelProto tiny_model(int opset, const std::vector<std::string>& ops) {
  onnx::ModelProto m;
  m.set_ir_version(8);
  auto* os = m.add_opset_import();
  os->set_version(opset);
  auto* g = m.mutable_graph();
  g->set_name("t");
  auto* in = g->add_input();
  in->set_name("x");
  auto* tt = in->mutable_type()->mutable_tensor_type();
  tt->set_elem_type(onnx::TensorProto::FLOAT);
  tt->mutable_shape()->add_dim()->set_dim_value(2);
  tt->mutable_shape()->add_dim()->set_dim_param("n");
  std::string prev = "x";
  for (size_t i = 0; i < ops.size(); ++i) {
    auto* n = g->add_node();
    n->set_op_type(ops[i]);
    n->set_name("n" + std::to_string(i));
    n->add_input(prev);
    n->add_input(prev);
    prev = "v" + std::to_string(i);
    n->add_output(prev);
  }
  auto* out = g->add_output();
  out->set_name(prev);
  out->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::FLOAT);
  return m;
}

void save(const onnx::ModelProto& m, const std::string& p) {
  std::ofstream f(p, std::ios::binary);
  m.SerializeToOstream(&f);
}

std::string load_error(const std::string& p) {
  try {
    interop::load_onnx(p);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST_F(OnnxTest, EveryUnsupportedOpIsListedAtOnce) {
  onnx::ModelProto m = tiny_model(17, {"Add", "FancyOp", "Mul", "OtherOp", "FancyOp"});
  auto* custom = m.mutable_graph()->add_node();
  custom->set_op_type("Thing");
  custom->set_domain("com.example");
  save(m, path("u.onnx"));
  std::string err = load_error(path("u.onnx"));
  EXPECT_NE(err.find("3 unsupported"), std::string::npos) << err;
  EXPECT_NE(err.find("FancyOp (opset 17, op type not implemented): 2 node(s) 'n1', 'n4'"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("OtherOp"), std::string::npos) << err;
  EXPECT_NE(err.find("com.example::Thing"), std::string::npos) << err;
  // A version whose semantics differ: Add-1 (opset 5) had the legacy broadcast attribute.
  save(tiny_model(5, {"Add", "Mul"}), path("v.onnx"));
  err = load_error(path("v.onnx"));
  EXPECT_NE(err.find("Add-1 (opset 5, this version not implemented)"), std::string::npos) << err;
  EXPECT_NE(err.find("Mul-1"), std::string::npos) << err;
}

TEST_F(OnnxTest, BadFilesGiveClearErrors) {
  onnx::ModelProto m = tiny_model(17, {"Add"});
  save(m, path("good.onnx"));
  // Truncated.
  std::string bytes = m.SerializeAsString();
  std::ofstream(path("trunc.onnx"), std::ios::binary) << bytes.substr(0, bytes.size() / 2);
  EXPECT_NE(load_error(path("trunc.onnx")).find("not a valid ONNX model (truncated or corrupt"),
            std::string::npos)
      << load_error(path("trunc.onnx"));
  // Wrong IR version.
  m.set_ir_version(99);
  save(m, path("ir.onnx"));
  EXPECT_NE(load_error(path("ir.onnx")).find("IR version 99 is not supported"), std::string::npos);
  // Missing file.
  EXPECT_NE(load_error(path("none.onnx")).find("none.onnx"), std::string::npos);
  // Shape mismatch at the input: the fixed dimension 2 is checked, the symbolic one is not.
  interop::OnnxModel good = interop::load_onnx(path("good.onnx"));
  EXPECT_EQ(good.forward({ones({2, 5})})[0].to_vector<float>(), std::vector<float>(10, 2.0f));
  try {
    good.forward({ones({3, 5})});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("input 'x' expects (2, n) f32, got (3, 5) f32"),
              std::string::npos)
        << e.what();
  }
  // A node reading a value nothing defines.
  onnx::ModelProto dangling = tiny_model(17, {"Add"});
  dangling.mutable_graph()->mutable_node(0)->set_input(1, "ghost");
  save(dangling, path("d.onnx"));
  try {
    interop::load_onnx(path("d.onnx")).forward({ones({2, 2})});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[Add 'n0'] reads 'ghost'"), std::string::npos)
        << e.what();
  }
}

TEST_F(OnnxTest, TensorFilesRoundTrip) {
  Tensor a = arange(0, 6, 1, Dtype::f32) * 0.5;
  Tensor b = reshape(arange(0, 6, 1, Dtype::i64), {2, 3});
  interop::write_npy(path("a.npy"), a);
  interop::write_tensor_pb(path("b.pb"), b, "b");
  Tensor a2 = interop::read_tensor_file(path("a.npy"));
  Tensor b2 = interop::read_tensor_file(path("b.pb"));
  EXPECT_EQ(a2.shape(), (Shape{6}));
  EXPECT_EQ(a2.to_vector<float>(), a.to_vector<float>());
  EXPECT_EQ(b2.dtype(), Dtype::i64);
  EXPECT_EQ(b2.shape(), (Shape{2, 3}));
  EXPECT_EQ(b2.to_vector<int64_t>(), b.to_vector<int64_t>());
  // The .npy header is NumPy's: magic, version 1.0, a dict padded to 64 bytes.
  std::ifstream f(path("a.npy"), std::ios::binary);
  std::string s((std::istreambuf_iterator<char>(f)), {});
  EXPECT_EQ(s.substr(0, 8), std::string("\x93NUMPY\x01\x00", 8));
  EXPECT_NE(s.find("'descr': '<f4', 'fortran_order': False, 'shape': (6,)"), std::string::npos);
  EXPECT_EQ((s.size() - 6 * 4) % 64, 0u);
  // Corrupt files name themselves.
  std::ofstream(path("bad.npy"), std::ios::binary) << s.substr(0, s.size() - 3);
  EXPECT_THROW(interop::read_tensor_file(path("bad.npy")), Error);
  EXPECT_THROW(interop::read_tensor_file(path("a.txt")), Error);
  // A directory is refused as an output; a device is written through.
  EXPECT_THROW(interop::write_npy(dir_.string(), a), Error);
  EXPECT_NO_THROW(interop::write_npy("/dev/null", a));
}

// Sizes taken from the file (initializer dims, graph input dims, shapes read by Reshape,
// Expand, ConstantOfShape, Range's count, external data offsets, window attributes) are bounded
// before any arithmetic on them, each with an error naming the tensor or node (the fuzzer found
// a signed overflow in numel() from an initializer's dims).
TEST_F(OnnxTest, SizesFromTheFileAreBounded) {
  auto expect_error = [&](const onnx::ModelProto& m, const std::string& want, bool run) {
    save(m, path("b.onnx"));
    try {
      interop::OnnxModel model = interop::load_onnx(path("b.onnx"));
      if (run) model.forward({ones({2, 2})});
      ADD_FAILURE() << "no error, wanted " << want;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  };
  // An initializer whose dims multiply past int64.
  onnx::ModelProto m = tiny_model(17, {"Add"});
  auto* init = m.mutable_graph()->add_initializer();
  init->set_name("w");
  init->set_data_type(onnx::TensorProto::FLOAT);
  for (int64_t d : {int64_t{1} << 32, int64_t{1} << 32, int64_t{8}}) init->add_dims(d);
  expect_error(m, "initializer 'w': shape (4294967296, 4294967296, 8) has more than 2^40", false);
  init->clear_dims();
  init->add_dims(-3);
  expect_error(m, "initializer 'w': dimension -3 in (-3) is outside [0, 2^40]", false);
  // External data with an offset that is not a byte count.
  init->clear_dims();
  init->add_dims(2);
  init->set_data_location(onnx::TensorProto::EXTERNAL);
  auto* kv = init->add_external_data();
  kv->set_key("location"), kv->set_value("w.bin");
  kv = init->add_external_data();
  kv->set_key("offset"), kv->set_value("99999999999999999999");
  expect_error(m, "external data 'offset' is '99999999999999999999', not a byte count", false);
  // A graph input with a negative fixed dimension.
  m = tiny_model(17, {"Add"});
  m.mutable_graph()
      ->mutable_input(0)
      ->mutable_type()
      ->mutable_tensor_type()
      ->mutable_shape()
      ->mutable_dim(0)
      ->set_dim_value(-7);
  expect_error(m, "graph input/output 'x' has dimension -7", false);
  // Shapes computed while building: Reshape, Expand, ConstantOfShape targets, Range's count.
  auto with_ints = [&](const std::string& op, const std::vector<int64_t>& v) {
    onnx::ModelProto r = tiny_model(17, {op});
    r.mutable_graph()->mutable_node(0)->set_input(1, "s");
    interop::write_tensor_pb(path("s.pb"), from_vector(v, {static_cast<int64_t>(v.size())}), "s");
    std::ifstream sf(path("s.pb"), std::ios::binary);
    EXPECT_TRUE(r.mutable_graph()->add_initializer()->ParseFromIstream(&sf));
    return r;
  };
  expect_error(
      with_ints("Reshape", {int64_t{1} << 62, 4, -1}),
      "[Reshape 'n0'] shape: dimension 4611686018427387904 in (4611686018427387904, 4, 1) is "
      "outside [0, 2^40]",
      true);
  expect_error(with_ints("Expand", {int64_t{1} << 31, int64_t{1} << 31, 1, 1}),
               "[Expand 'n0'] shape: shape (2147483648, 2147483648, 2, 2) has more than 2^40",
               true);
  expect_error(with_ints("Expand", {3, 2}), "[Expand 'n0'] cannot broadcast (2, 2) to (3, 2)",
               true);
  onnx::ModelProto cos = with_ints("ConstantOfShape", {int64_t{1} << 30, int64_t{1} << 30, 4});
  cos.mutable_graph()->mutable_node(0)->clear_input();
  cos.mutable_graph()->mutable_node(0)->add_input("s");
  expect_error(cos, "[ConstantOfShape 'n0'] shape: shape (1073741824, 1073741824, 4) has more",
               true);
  onnx::ModelProto range = with_ints("Range", {0});
  auto* rn = range.mutable_graph()->mutable_node(0);
  rn->clear_input();
  for (const char* in : {"s", "lim", "s"}) rn->add_input(in);
  interop::write_tensor_pb(path("lim.pb"), scalar(1e30, Dtype::f64), "lim");
  std::ifstream lf(path("lim.pb"), std::ios::binary);
  ASSERT_TRUE(range.mutable_graph()->add_initializer()->ParseFromIstream(&lf));
  rn->set_input(2, "one");
  interop::write_tensor_pb(path("one.pb"), scalar(1, Dtype::f64), "one");
  std::ifstream of(path("one.pb"), std::ios::binary);
  ASSERT_TRUE(range.mutable_graph()->add_initializer()->ParseFromIstream(&of));
  range.mutable_graph()->mutable_initializer(0)->set_data_type(onnx::TensorProto::DOUBLE);
  range.mutable_graph()->mutable_initializer(0)->set_raw_data(std::string(8, '\0'));
  range.mutable_graph()->mutable_initializer(0)->clear_dims();
  expect_error(range, "[Range 'n0'] start 0, limit 1e+30 and delta 1 give 1e+30 elements", true);
  // A window attribute: strides of 0 would divide by zero.
  onnx::ModelProto pool = tiny_model(17, {"MaxPool"});
  auto* pn = pool.mutable_graph()->mutable_node(0);
  pn->mutable_input()->RemoveLast();
  pool.mutable_graph()->mutable_input(0)->mutable_type()->mutable_tensor_type()->clear_shape();
  auto* ks = pn->add_attribute();
  ks->set_name("kernel_shape"), ks->set_type(onnx::AttributeProto::INTS);
  ks->add_ints(1), ks->add_ints(1);
  auto* st = pn->add_attribute();
  st->set_name("strides"), st->set_type(onnx::AttributeProto::INTS);
  st->add_ints(0), st->add_ints(1);
  save(pool, path("p.onnx"));
  try {
    interop::load_onnx(path("p.onnx")).forward({ones({1, 1, 2, 2})});
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[MaxPool 'n0'] strides value 0 is outside [1, 2^40]"),
              std::string::npos)
        << e.what();
  }
}

// Pow of an integer base is computed in floating point and truncated to the base's type
// (ONNX's reference: np.power(x, y).astype(x.dtype)); found by the random-input comparison with
// onnxruntime (the node tests' exponents are whole numbers) and the output-type check.
TEST_F(OnnxTest, IntegerPowTruncatesToTheBaseType) {
  onnx::ModelProto m = tiny_model(15, {"Pow"});
  auto* g = m.mutable_graph();
  auto* tt = g->mutable_input(0)->mutable_type()->mutable_tensor_type();
  tt->set_elem_type(onnx::TensorProto::INT32);
  tt->mutable_shape()->mutable_dim(1)->set_dim_value(2);
  g->mutable_node(0)->set_input(1, "y");
  interop::write_tensor_pb(path("y.pb"), from_vector<float>({-0.5f, 0.5f, 2.5f, 2.0f}, {2, 2}),
                           "y");
  onnx::TensorProto* y = g->add_initializer();
  std::ifstream yf(path("y.pb"), std::ios::binary);
  ASSERT_TRUE(y->ParseFromIstream(&yf));
  g->mutable_output(0)->mutable_type()->mutable_tensor_type()->set_elem_type(
      onnx::TensorProto::INT32);
  save(m, path("pow.onnx"));
  Tensor out = interop::load_onnx(path("pow.onnx"))
                   .forward({from_vector<int32_t>({2, 3, 4, -2}, {2, 2})})[0];
  EXPECT_EQ(out.dtype(), Dtype::i32);
  // 2^-0.5 = 0.71, 3^0.5 = 1.73, 4^2.5 = 32, (-2)^2 = 4; an exponent cast to int first gives
  // 1, 1, 16, 4.
  EXPECT_EQ(out.to_vector<int32_t>(), (std::vector<int32_t>{0, 1, 32, 4}));
  // An integer exponent: the output is the base's integer type too.
  interop::write_tensor_pb(path("y.pb"), from_vector<int32_t>({0, 1, 3, 2}, {2, 2}), "y");
  std::ifstream yi(path("y.pb"), std::ios::binary);
  ASSERT_TRUE(y->ParseFromIstream(&yi));
  save(m, path("pow_int.onnx"));
  out = interop::load_onnx(path("pow_int.onnx"))
            .forward({from_vector<int32_t>({2, 3, 4, -2}, {2, 2})})[0];
  EXPECT_EQ(out.dtype(), Dtype::i32);
  EXPECT_EQ(out.to_vector<int32_t>(), (std::vector<int32_t>{1, 3, 64, 4}));
}

// A subgraph whose intermediate value is read elsewhere (here a graph output) is not fused: it
// runs as ONNX's elementary ops and agrees with the fused import. A mask that is not the causal
// one (here j >= i) still fuses, and the fused node computes it as the subgraph does.
TEST_F(OnnxTest, FusionRulesKeepOtherSubgraphs) {
  training::TrainConfig cfg = small_config("gpt-mini");
  cfg.layers = 1;
  auto model = training::build_model(cfg);
  model->eval();
  interop::export_onnx(cfg, *model, path("g.onnx"));
  onnx::ModelProto mp;
  {
    std::ifstream f(path("g.onnx"), std::ios::binary);
    ASSERT_TRUE(mp.ParseFromIstream(&f));
  }
  auto variant = [&](bool anti_causal, bool softmax_output) {
    onnx::ModelProto v = mp;
    for (auto& n : *v.mutable_graph()->mutable_node()) {
      if (anti_causal && n.op_type() == "GreaterOrEqual") n.set_op_type("LessOrEqual");
      if (softmax_output && n.op_type() == "Softmax") {
        auto* o = v.mutable_graph()->add_output();
        o->set_name(n.output(0));
        o->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::FLOAT);
      }
    }
    const std::string p = path("v" + std::to_string(anti_causal) + std::to_string(softmax_output));
    save(v, p);
    return interop::load_onnx(p);
  };
  NoGradScope ng;
  Tensor x = model_input(cfg, 2, cfg.context, 3);
  for (bool anti : {false, true}) {
    interop::OnnxModel fused = variant(anti, false), plain = variant(anti, true);
    EXPECT_EQ(fused.op_counts()["hetrain.CausalAttention"], 1);
    EXPECT_EQ(plain.op_counts()["hetrain.CausalAttention"], 0);
    EXPECT_EQ(plain.op_counts()["Softmax"], 1);
    hetrain::testing::expect_close(plain.forward({x})[0].to_vector<double>(),
                                   fused.forward({x})[0].to_vector<double>(), 1e-5, 1e-4,
                                   anti ? "anti-causal" : "causal");
  }
  // The anti-causal model is another function.
  EXPECT_NE(values(variant(true, false).forward({x})[0]),
            values(variant(false, false).forward({x})[0]));
}

}  // namespace
