// ONNX export of Hetrain's model families (mlp, cnn, gpt) in inference form. The graph is
// written from the model's configuration and its state dict: every tensor the graph reads is
// an initializer under its safetensors name, and a state-dict entry the exporter does not use
// is an error (the model has a part the exporter cannot express).
#include <onnx/checker.h>
#include <onnx/shape_inference/implementation.h>

#include <cmath>
#include <filesystem>
#include <set>

#include "hetrain/base/error.h"
#include "hetrain/graph/ops.h"
#include "hetrain/interop/onnx.h"
#include "hetrain/training/nn.h"
#include "hetrain/training/trainer.h"
#include "interop/file_write.h"
#include "interop/onnx_proto.h"

namespace hetrain::interop {

namespace {

/// IR version that goes with an opset (onnx/helper.py's VERSION_TABLE).
int64_t ir_for_opset(int opset) {
  if (opset <= 18) return 8;
  if (opset <= 20) return 9;
  return 10;
}

/// Appends nodes and initializers to a graph, naming values uniquely.
class GraphWriter {
 public:
  GraphWriter(onnx::GraphProto* g, std::map<std::string, Tensor> weights, int opset, bool fold_bn)
      : g_(g), weights_(std::move(weights)), opset_(opset), fold_bn_(fold_bn) {}

  int opset() const { return opset_; }
  bool fold_bn() const { return fold_bn_; }

  /// State-dict tensor `name`, marked as used (its values go into a computed initializer).
  const Tensor& read(const std::string& name) {
    auto it = weights_.find(name);
    if (it == weights_.end()) fail("[onnx export] the model has no tensor '", name, "'");
    used_.insert(name);
    return it->second;
  }
  /// A computed initializer (not a state-dict tensor).
  std::string computed(const std::string& name, const Tensor& t) {
    tensor_to_proto(t, name, g_->add_initializer());
    return name;
  }

  /// The initializer holding state-dict tensor `name` (added on first use).
  std::string weight(const std::string& name) {
    auto it = weights_.find(name);
    if (it == weights_.end()) fail("[onnx export] the model has no tensor '", name, "'");
    if (used_.insert(name).second) tensor_to_proto(it->second, name, g_->add_initializer());
    return name;
  }
  const Shape& weight_shape(const std::string& name) {
    auto it = weights_.find(name);
    if (it == weights_.end()) fail("[onnx export] the model has no tensor '", name, "'");
    return it->second.shape();
  }
  /// State-dict entries no node read (except those inference does not need).
  std::vector<std::string> unused() const {
    std::vector<std::string> out;
    for (const auto& [name, t] : weights_)
      if (!used_.count(name) && !name.ends_with("num_batches_tracked")) out.push_back(name);
    return out;
  }

  /// A node of op over inputs with n outputs named after `hint`; returns the outputs.
  std::vector<std::string> node_n(const std::string& op, const std::vector<std::string>& inputs,
                                  const std::string& hint, int n = 1) {
    onnx::NodeProto* nd = g_->add_node();
    nd->set_op_type(op);
    nd->set_name(unique(hint + "/" + op));
    for (const auto& i : inputs) nd->add_input(i);
    std::vector<std::string> outs;
    for (int k = 0; k < n; ++k) {
      outs.push_back(unique(hint + "/" + op + (n > 1 ? ":" + std::to_string(k) : "")));
      nd->add_output(outs.back());
    }
    last_ = nd;
    return outs;
  }
  std::string node(const std::string& op, const std::vector<std::string>& inputs,
                   const std::string& hint) {
    return node_n(op, inputs, hint)[0];
  }
  // Attributes of the node added last.
  void attr(const std::string& name, int64_t v) {
    auto* a = last_->add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::INT);
    a->set_i(v);
  }
  void attr(const std::string& name, double v) {
    auto* a = last_->add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::FLOAT);
    a->set_f(static_cast<float>(v));
  }
  void attr(const std::string& name, const std::string& v) {
    auto* a = last_->add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::STRING);
    a->set_s(v);
  }
  void attr(const std::string& name, const std::vector<int64_t>& v) {
    auto* a = last_->add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::INTS);
    for (int64_t x : v) a->add_ints(x);
  }
  /// A Constant node holding t.
  std::string constant(const Tensor& t, const std::string& hint) {
    std::string out = node("Constant", {}, hint);
    auto* a = last_->add_attribute();
    a->set_name("value");
    a->set_type(onnx::AttributeProto::TENSOR);
    tensor_to_proto(t, out, a->mutable_t());
    return out;
  }
  std::string ints(const std::vector<int64_t>& v, const std::string& hint) {
    return constant(from_vector(v, {static_cast<int64_t>(v.size())}), hint);
  }
  std::string scalar_f32(double v, const std::string& hint) {
    return constant(scalar(v, Dtype::f32), hint);
  }

 private:
  std::string unique(const std::string& base) {
    int& n = names_[base];
    return n++ ? base + "_" + std::to_string(n - 1) : base;
  }
  onnx::GraphProto* g_;
  std::map<std::string, Tensor> weights_;
  std::set<std::string> used_;
  std::map<std::string, int> names_;
  onnx::NodeProto* last_ = nullptr;
  int opset_;
  bool fold_bn_;
};

void add_value_info(onnx::ValueInfoProto* vi, const std::string& name, Dtype dt,
                    const std::vector<std::string>& dims) {
  vi->set_name(name);
  auto* tt = vi->mutable_type()->mutable_tensor_type();
  tt->set_elem_type(onnx_elem_type(dt));
  for (const auto& d : dims) {
    auto* dim = tt->mutable_shape()->add_dim();
    if (!d.empty() && std::isdigit(static_cast<unsigned char>(d[0])))
      dim->set_dim_value(std::stoll(d));
    else
      dim->set_dim_param(d);
  }
}

// ---- layers -------------------------------------------------------------------------------

/// x @ W^T + b of a Linear named p: Gemm on 2-D inputs, MatMul (+ Add) otherwise.
std::string linear(GraphWriter& w, const std::string& x, const std::string& p, bool rank2) {
  const std::string wt = w.weight(p + ".weight"), b = w.weight(p + ".bias");
  if (rank2) {
    std::string y = w.node("Gemm", {x, wt, b}, p);
    w.attr("transB", int64_t{1});
    return y;
  }
  std::string t = w.node("Transpose", {wt}, p);
  w.attr("perm", std::vector<int64_t>{1, 0});
  return w.node("Add", {w.node("MatMul", {x, t}, p), b}, p);
}

std::string conv(GraphWriter& w, const std::string& x, const std::string& p, int64_t stride,
                 int64_t pad) {
  const Shape& ws = w.weight_shape(p + ".weight");
  std::string y = w.node("Conv", {x, w.weight(p + ".weight")}, p);
  w.attr("kernel_shape", std::vector<int64_t>{ws[2], ws[3]});
  w.attr("strides", std::vector<int64_t>{stride, stride});
  w.attr("pads", std::vector<int64_t>{pad, pad, pad, pad});
  return y;
}

/// Inference BatchNormalization with the running statistics (nn::BatchNorm2d's eps 1e-5).
std::string batch_norm(GraphWriter& w, const std::string& x, const std::string& p) {
  std::string y = w.node("BatchNormalization",
                         {x, w.weight(p + ".weight"), w.weight(p + ".bias"),
                          w.weight(p + ".running_mean"), w.weight(p + ".running_var")},
                         p);
  w.attr("epsilon", 1e-5);
  return y;
}

/// Convolution c then BatchNormalization b: two nodes, or one Conv with b folded in.
std::string conv_bn(GraphWriter& w, const std::string& x, const std::string& c,
                    const std::string& b, int64_t stride, int64_t pad) {
  if (!w.fold_bn()) return batch_norm(w, conv(w, x, c, stride, pad), b);
  const Tensor& wt = w.read(c + ".weight");
  const Tensor scale = w.read(b + ".weight") * rsqrt(w.read(b + ".running_var") + 1e-5);
  const Tensor folded = wt * reshape(scale, {wt.shape()[0], 1, 1, 1});
  const Tensor bias = w.read(b + ".bias") - w.read(b + ".running_mean") * scale;
  std::string y = w.node("Conv",
                         {x, w.computed(c + ".weight_bn_folded", folded.eval()),
                          w.computed(c + ".bias_bn_folded", bias.eval())},
                         c);
  w.attr("kernel_shape", std::vector<int64_t>{wt.shape()[2], wt.shape()[3]});
  w.attr("strides", std::vector<int64_t>{stride, stride});
  w.attr("pads", std::vector<int64_t>{pad, pad, pad, pad});
  return y;
}

std::string layer_norm(GraphWriter& w, const std::string& x, const std::string& p) {
  std::string y =
      w.node("LayerNormalization", {x, w.weight(p + ".weight"), w.weight(p + ".bias")}, p);
  w.attr("axis", int64_t{-1});
  w.attr("epsilon", 1e-5);
  return y;
}

/// GPT-2's tanh-approximated GELU: one Gelu node from opset 20, its formula before.
std::string gelu_tanh(GraphWriter& w, const std::string& x, const std::string& p) {
  if (w.opset() >= 20) {
    std::string y = w.node("Gelu", {x}, p);
    w.attr("approximate", std::string("tanh"));
    return y;
  }
  // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
  std::string x3 = w.node("Mul", {w.node("Mul", {x, x}, p), x}, p);
  std::string inner = w.node("Add", {x, w.node("Mul", {x3, w.scalar_f32(0.044715, p)}, p)}, p);
  std::string t =
      w.node("Tanh", {w.node("Mul", {inner, w.scalar_f32(std::sqrt(2.0 / M_PI), p)}, p)}, p);
  std::string half_x = w.node("Mul", {x, w.scalar_f32(0.5, p)}, p);
  return w.node("Mul", {half_x, w.node("Add", {t, w.scalar_f32(1.0, p)}, p)}, p);
}

// ---- models -------------------------------------------------------------------------------

std::string export_mlp(GraphWriter& w, const training::TrainConfig& cfg, const std::string& x) {
  std::string h = w.node("Flatten", {x}, "0");
  w.attr("axis", int64_t{1});
  int64_t idx = 1;  // make_mlp: 0 Flatten, then Linear, ReLU, ..., Linear
  for (size_t i = 0; i < cfg.hidden.size(); ++i, idx += 2)
    h = w.node("Relu", {linear(w, h, std::to_string(idx), true)}, std::to_string(idx + 1));
  return linear(w, h, std::to_string(idx), true);
}

std::string export_resnet(GraphWriter& w, const training::TrainConfig& cfg, const std::string& x) {
  std::string h = w.node("Relu", {conv_bn(w, x, "stem.0", "stem.1", 1, 1)}, "stem");
  int64_t prev = cfg.widths.at(0), index = 0;
  for (size_t s = 0; s < cfg.widths.size(); ++s) {
    for (int64_t b = 0; b < cfg.blocks; ++b, ++index) {
      const int64_t stride = (s > 0 && b == 0) ? 2 : 1;
      const std::string p = "blocks." + std::to_string(index);
      std::string y = w.node("Relu", {conv_bn(w, h, p + ".conv1", p + ".bn1", stride, 1)}, p);
      y = conv_bn(w, y, p + ".conv2", p + ".bn2", 1, 1);
      std::string shortcut = h;
      if (stride != 1 || prev != cfg.widths[s])
        shortcut = conv_bn(w, h, p + ".shortcut", p + ".bn_shortcut", stride, 0);
      h = w.node("Relu", {w.node("Add", {y, shortcut}, p)}, p);
      prev = cfg.widths[s];
    }
  }
  std::string pooled = w.node("GlobalAveragePool", {h}, "pool");
  std::string flat = w.node("Flatten", {pooled}, "pool");
  w.attr("axis", int64_t{1});
  return linear(w, flat, "head", true);
}

/// Causal self-attention of block p on x (batch, seq, D), the mask `keep` (seq, seq) bool.
std::string attention(GraphWriter& w, const std::string& x, const std::string& p, int64_t heads,
                      int64_t dim, const std::string& keep) {
  const int64_t d = dim / heads;
  std::vector<std::string> qkv =
      w.node_n("Split", {linear(w, x, p + ".qkv", false), w.ints({dim, dim, dim}, p)}, p, 3);
  w.attr("axis", int64_t{2});
  std::string head_shape = w.ints({0, 0, heads, d}, p);
  auto heads_of = [&](const std::string& t, std::vector<int64_t> perm) {
    std::string r = w.node("Transpose", {w.node("Reshape", {t, head_shape}, p)}, p);
    w.attr("perm", perm);
    return r;
  };
  std::string q = heads_of(qkv[0], {0, 2, 1, 3});
  std::string kt = heads_of(qkv[1], {0, 2, 3, 1});
  std::string v = heads_of(qkv[2], {0, 2, 1, 3});
  std::string scores = w.node(
      "Mul",
      {w.node("MatMul", {q, kt}, p), w.scalar_f32(1.0 / std::sqrt(static_cast<double>(d)), p)}, p);
  std::string masked =
      w.node("Where", {keep, scores, w.scalar_f32(-std::numeric_limits<double>::infinity(), p)}, p);
  std::string probs = w.node("Softmax", {masked}, p);
  w.attr("axis", int64_t{-1});
  std::string y = w.node("Transpose", {w.node("MatMul", {probs, v}, p)}, p);
  w.attr("perm", std::vector<int64_t>{0, 2, 1, 3});
  y = w.node("Reshape", {y, w.ints({0, 0, dim}, p)}, p);
  return linear(w, y, p + ".proj", false);
}

std::string export_gpt(GraphWriter& w, const training::TrainConfig& cfg, const std::string& ids) {
  if (w.opset() < 17) fail("[onnx export] gpt needs opset 17 or newer (LayerNormalization)");
  // Positions 0..seq-1 and the causal mask, from the input's shape (a symbolic seq axis).
  std::string seq = w.node(
      "Gather", {w.node("Shape", {ids}, "pos"), w.constant(scalar(1, Dtype::i64), "pos")}, "pos");
  w.attr("axis", int64_t{0});
  std::string pos = w.node(
      "Range",
      {w.constant(scalar(0, Dtype::i64), "pos"), seq, w.constant(scalar(1, Dtype::i64), "pos")},
      "pos");
  std::string rows = w.node("Unsqueeze", {pos, w.ints({1}, "mask")}, "mask");
  std::string cols = w.node("Unsqueeze", {pos, w.ints({0}, "mask")}, "mask");
  std::string keep = w.node("GreaterOrEqual", {rows, cols}, "mask");
  std::string tok = w.node("Gather", {w.weight("wte.weight"), ids}, "wte");
  std::string h =
      w.node("Add", {tok, w.node("Gather", {w.weight("wpe.weight"), pos}, "wpe")}, "embed");
  for (int64_t l = 0; l < cfg.layers; ++l) {
    const std::string p = "blocks." + std::to_string(l);
    h = w.node(
        "Add",
        {h, attention(w, layer_norm(w, h, p + ".ln1"), p + ".attn", cfg.heads, cfg.width, keep)},
        p);
    std::string m = gelu_tanh(w, linear(w, layer_norm(w, h, p + ".ln2"), p + ".fc", false), p);
    h = w.node("Add", {h, linear(w, m, p + ".fc_proj", false)}, p);
  }
  h = layer_norm(w, h, "ln_f");
  std::string head = w.node("Transpose", {w.weight("wte.weight")}, "head");  // tied head
  w.attr("perm", std::vector<int64_t>{1, 0});
  return w.node("MatMul", {h, head}, "head");
}

/// Moves initializer data into `data_file` (relative to the model) and points the
/// initializers at it; returns the file's bytes (64-byte aligned pieces).
std::string externalize(onnx::GraphProto* g, const std::string& data_file) {
  std::string data;
  for (auto& init : *g->mutable_initializer()) {
    data.append((64 - data.size() % 64) % 64, '\0');
    const size_t offset = data.size();
    data += init.raw_data();
    init.clear_raw_data();
    init.set_data_location(onnx::TensorProto::EXTERNAL);
    auto add = [&](const char* k, const std::string& v) {
      auto* e = init.add_external_data();
      e->set_key(k);
      e->set_value(v);
    };
    add("location", data_file);
    add("offset", std::to_string(offset));
    add("length", std::to_string(data.size() - offset));
  }
  return data;
}

}  // namespace

OnnxExportInfo export_onnx(const training::TrainConfig& cfg, nn::Module& model,
                           const std::string& path, const OnnxExportOptions& opt) {
  if (opt.opset < 13 || opt.opset > kOnnxMaxOpset)
    fail("[onnx export] --opset must be between 13 and ", kOnnxMaxOpset, ", got ", opt.opset);
  onnx::ModelProto m;
  OnnxExportInfo info;
  info.opset = opt.opset;
  info.ir_version = ir_for_opset(opt.opset);
  m.set_ir_version(info.ir_version);
  m.set_producer_name(opt.producer);
  m.set_producer_version(HETRAIN_VERSION);
  m.set_model_version(1);
  m.set_doc_string("Hetrain " + cfg.preset + " (" + cfg.model + "), inference form");
  auto meta = [&](const std::string& k, const std::string& v) {
    auto* e = m.add_metadata_props();
    e->set_key(k);
    e->set_value(v);
  };
  meta("hetrain.preset", cfg.preset);
  meta("hetrain.model", cfg.model);
  if (cfg.model == "gpt") meta("hetrain.context", std::to_string(cfg.context));  // seq's bound
  auto* os = m.add_opset_import();
  os->set_domain("");
  os->set_version(opt.opset);
  onnx::GraphProto* g = m.mutable_graph();
  g->set_name("hetrain_" + cfg.model);

  std::map<std::string, Tensor> weights;
  for (auto& [n, t] : model.state_dict()) {
    if (t.dtype() != Dtype::f32 && !n.ends_with("num_batches_tracked"))
      fail("[onnx export] tensor '", n, "' is ", dtype_name(t.dtype()),
           "; the exporter writes f32 models");
    weights[n] = t;
  }
  GraphWriter w(g, std::move(weights), opt.opset, opt.fold_bn);
  std::string out;
  if (cfg.model == "gpt") {
    add_value_info(g->add_input(), "ids", Dtype::i64, {"batch", "seq"});
    out = export_gpt(w, cfg, "ids");
    add_value_info(g->add_output(), "logits", Dtype::f32, {"batch", "seq", "256"});
  } else if (cfg.model == "mlp" || cfg.model == "cnn") {
    add_value_info(g->add_input(), "image", Dtype::f32, {"batch", "1", "28", "28"});
    out = cfg.model == "mlp" ? export_mlp(w, cfg, "image") : export_resnet(w, cfg, "image");
    add_value_info(g->add_output(), "logits", Dtype::f32, {"batch", "10"});
  } else {
    fail("[onnx export] cannot export model family '", cfg.model, "' (mlp, cnn or gpt)");
  }
  // The last node writes the graph output under its documented name.
  g->mutable_node(g->node_size() - 1)->set_output(0, "logits");
  if (auto unused = w.unused(); !unused.empty()) {
    std::string list;
    for (const auto& n : unused) list += "\n  " + n;
    fail("[onnx export] the model has tensors the ", cfg.model,
         " exporter does not know how to express (a model this exporter does not describe):", list);
  }
  for (const auto& i : g->input()) info.inputs.push_back(i.name());
  for (const auto& o : g->output()) info.outputs.push_back(o.name());
  info.nodes = g->node_size();
  info.initializers = g->initializer_size();
  for (const auto& init : g->initializer())
    info.parameter_bytes += static_cast<int64_t>(init.raw_data().size());

  // Check before writing: the structural checker and strict shape inference (Python's
  // check_model(full_check=True)), where Debian's onnx knows the opset.
  if (opt.opset <= onnx::OpSchemaRegistry::DomainToVersionRange::Instance().Map().at("").second) {
    try {
      onnx::checker::check_model(m);
      onnx::ModelProto inferred = m;
      onnx::shape_inference::InferShapes(inferred, onnx::OpSchemaRegistry::Instance(),
                                         onnx::ShapeInferenceOptions(true, 1, false));
    } catch (const std::exception& e) {
      fail("[onnx export] the exported graph fails onnx's checker: ", e.what());
    }
    info.checked = true;
  }

  info.external_data = opt.external_data || info.parameter_bytes >= opt.external_threshold_bytes;
  std::string data;
  if (info.external_data) {
    const std::string data_name = std::filesystem::path(path).filename().string() + ".data";
    data = externalize(g, data_name);
    std::filesystem::path data_path = std::filesystem::path(path).parent_path() / data_name;
    write_file_atomically(data_path.string(), {data}, "[onnx export]");
  }
  std::string bytes;
  if (!m.SerializeToString(&bytes))
    fail("[onnx export] ", path, ": the model does not serialise (", info.parameter_bytes,
         " bytes of weights; use --external-data)");
  write_file_atomically(path, {bytes}, "[onnx export]");
  return info;
}

}  // namespace hetrain::interop
