// `hetrain plan --onnx`: an imported model described for the planner. The graph is built for
// one sample (not run) and read node by node: every matrix product and convolution is a layer
// with its FLOPs, norms and elementwise work are memory-bound layers, and the parameter count
// is the file's. A graph that is a GPT (packed causal attention per layer, ids to logits, the
// GPT formula's exact parameter count) is planned as the planner's transformer instead, so
// tensor and pipeline parallelism apply.
#include <algorithm>
#include <filesystem>
#include <set>

#include "cli/onnx_cli.h"
#include "hetrain/base/error.h"
#include "hetrain/graph/ops.h"
#include "hetrain/graph/primitive.h"
#include "hetrain/interop/onnx.h"

namespace hetrain::cli {

namespace {

using planning::ConvLayer;

/// Nodes reachable from the outputs, producers first.
std::vector<Node*> topological(const std::vector<Tensor>& outputs) {
  std::vector<Node*> order;
  std::set<Node*> seen;
  std::vector<std::pair<Node*, size_t>> stack;
  for (const auto& t : outputs)
    if (seen.insert(t.node()).second) stack.emplace_back(t.node(), 0);
  while (!stack.empty()) {
    auto& [n, next] = stack.back();
    if (next < n->inputs.size()) {
      Node* in = n->inputs[next++].node();
      if (in && seen.insert(in).second) stack.emplace_back(in, 0);
      continue;
    }
    order.push_back(n);
    stack.pop_back();
  }
  return order;
}

/// The layer a node of the built graph contributes, per sample (`samples` in the graph), or
/// none (views and work on parameters alone).
std::optional<ConvLayer> layer_of(Node* n, int64_t samples, int block) {
  const std::string op = n->prim->name();
  const Shape out = Tensor(n->shared_from_this(), 0).shape();
  const int64_t numel = hetrain::numel(out) / samples;
  const int64_t last = out.empty() ? 1 : std::max<int64_t>(1, out.back());
  ConvLayer l;
  l.block = block;
  if (op == "matmul") {  // (..., M, K) x (..., K, N): 2 K per output element
    const Shape& a = n->inputs[0].shape();
    l.kind = ConvLayer::Kind::conv;
    l.in = a.back(), l.out = last, l.out_h = numel / last;
  } else if (op == "conv2d") {  // weight (O, C, kh, kw), output (N, O, oh, ow)
    const Shape& w = n->inputs[1].shape();
    l.kind = ConvLayer::Kind::conv;
    l.in = w[1], l.out = w[0], l.kernel = w[2], l.out_h = out[2], l.out_w = out[3];
    if (w[2] != w[3]) l.in = w[1] * w[3], l.kernel = 1, l.out_h = out[2] * w[2];  // same FLOPs
  } else if (op == "sdpa") {  // scores and values: 2 T d per (query, key) pair and head, twice
    // q (B, H, T, d), or the packed projection (B, T, 3 H d).
    const Shape& q = n->inputs[0].shape();
    const bool packed = q.size() == 3;
    const int64_t b = q[0], t = packed ? q[1] : q[2], width = packed ? q[2] / 3 : q[1] * q[3];
    l.kind = ConvLayer::Kind::conv;
    l.in = width, l.out = t, l.out_h = 2 * b * t / samples;
  } else if (op == "batch_norm2d" || op == "layer_norm" || op == "rms_norm") {
    l.kind = ConvLayer::Kind::batchnorm;
    l.out = op == "batch_norm2d" ? out[1] : last, l.out_h = numel / l.out;
  } else if (!n->prim->is_view()) {
    l.kind = ConvLayer::Kind::activation;
    l.out = last, l.out_h = numel / last;
  } else {
    return std::nullopt;
  }
  l.out_h = std::max<int64_t>(1, l.out_h);
  return l;
}

/// The imported graph as the planner's GPT (planning::gpt_model), when it is one: its attention
/// runs as packed causal sdpa nodes of one width and head count (the import-time fusion rule
/// turns an exported GPT's attention into them), it maps integer ids (1, T) to logits (1, T, V),
/// and the GPT formula gives exactly the file's parameter count. Then the planner splits it into
/// transformer layers (tensor and pipeline parallelism apply); otherwise nullopt.
std::optional<planning::ModelSpec> gpt_of(const std::vector<Node*>& attention, const Tensor& x,
                                          const Tensor& y, int64_t params,
                                          std::optional<int64_t> positions) {
  if (attention.empty() || is_floating(x.dtype()) || x.ndim() != 2 || y.ndim() != 3 ||
      y.shape()[1] != x.shape()[1])
    return std::nullopt;
  const int64_t seq = x.shape()[1], vocab = y.shape()[2];
  int64_t hidden = 0, heads = 0;
  for (Node* n : attention) {
    const Shape& qkv = n->inputs[0].shape();
    const Shape lse = Tensor(n->shared_from_this(), 1).shape();  // (N, heads, T) when packed
    if (qkv.size() != 3 || lse.size() != 3 || qkv[1] != seq) return std::nullopt;
    if (hidden == 0) hidden = qkv[2] / 3, heads = lse[1];
    if (qkv[2] != 3 * hidden || lse[1] != heads) return std::nullopt;
  }
  planning::ModelSpec m =
      planning::gpt_model(static_cast<int64_t>(attention.size()), hidden, heads, seq, vocab);
  m.tf.max_positions = positions.value_or(seq);
  if (m.params() != params) return std::nullopt;
  return m;
}

}  // namespace

planning::ModelSpec onnx_model_spec(const std::string& path, std::optional<int64_t> seq) {
  interop::OnnxModel m = interop::load_onnx(path);
  if (m.inputs().size() != 1)
    fail("[plan] --onnx ", path, ": the planner takes a model with one input, this one has ",
         m.inputs().size());
  const interop::OnnxValueInfo& in = m.inputs()[0];
  const std::optional<int64_t> context = m.context_metadata();
  if (!seq) seq = context;
  Shape shape;
  for (size_t d = 0; d < in.dims.size(); ++d) {
    if (in.dims[d] >= 0) {
      shape.push_back(in.dims[d]);
    } else if (d == 0) {
      shape.push_back(1);  // the batch axis: one sample
    } else if (seq) {
      shape.push_back(*seq);
    } else {
      fail("[plan] --onnx ", path, ": input '", in.name, "' axis ", d, " ('", in.dim_params[d],
           "') has no fixed size; give it with --seq");
    }
  }
  int64_t sample_elements = 1;  // dims are each at most 2^40 (load_onnx checks)
  for (int64_t d : shape) {
    if (d != 0 && sample_elements > (int64_t{1} << 31) / d)
      fail("[plan] --onnx ", path, ": input '", in.name, "' of shape ", shape_str(shape),
           " has more than 2^31 elements");
    sample_elements *= d;
  }
  const int64_t samples = shape.empty() ? 1 : shape[0];
  Tensor x = zeros(shape, in.dtype);  // zeros are valid ids too; nothing below runs
  std::vector<Tensor> outs = m.forward({x});

  planning::ModelSpec spec;
  spec.name = "onnx:" + std::filesystem::path(path).filename().string();
  spec.family = planning::ModelFamily::convnet;
  spec.conv.image = shape.size() == 4 ? shape[2] : 1;
  spec.conv.channels = shape.size() >= 2 ? shape[1] : 1;
  int64_t params = 0;
  for (auto& [name, t] : m.parameters())
    if (is_floating(t.dtype())) params += t.numel();
  spec.conv.params = params;
  // Work on the input's values (not parameters alone, not folded shapes) is the model's.
  std::set<Node*> data = {x.node()};
  int block = 0;
  std::vector<Node*> attention;
  for (Node* n : topological(outs)) {
    if (!n->prim) continue;
    bool on_data = false;
    for (const auto& t : n->inputs) on_data = on_data || data.count(t.node());
    if (!on_data) continue;
    data.insert(n);
    if (std::string(n->prim->name()) == "sdpa") attention.push_back(n);
    if (auto l = layer_of(n, samples, block)) {
      if (l->kind == ConvLayer::Kind::conv) ++block;
      spec.conv.layers.push_back(*l);
    }
  }
  if (spec.conv.layers.empty())
    fail("[plan] --onnx ", path, ": the graph does no work on its input");
  if (outs.size() == 1)
    if (auto gpt = gpt_of(attention, x, outs[0], params, context)) {
      gpt->name = spec.name;
      return *gpt;
    }
  return spec;
}

}  // namespace hetrain::cli
