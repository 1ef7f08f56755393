// Import-time fusion: a table of rules, each recognising the subgraph of elementary ONNX ops an
// exporter writes for one of Hetrain's fused ops (tanh-GELU, causal attention on a packed QKV
// projection) and replacing it by one node of the private domain "hetrain", built as that fused
// op. A Hetrain GPT exported and imported back then runs the same kernels as the module (bit
// for bit); a subgraph that differs in any node, constant or outside use is left as it is.
#include <cmath>
#include <optional>

#include "hetrain/base/error.h"
#include "hetrain/graph/ops.h"
#include "interop/onnx_ops.h"

namespace hetrain::interop {

namespace {

/// The graph as the rules read it: each value's producer and how many nodes (or graph
/// outputs) read it.
struct GraphView {
  const onnx::GraphProto& g;
  std::map<std::string, int> producer;
  std::map<std::string, int> uses;

  explicit GraphView(const onnx::GraphProto& graph) : g(graph) {
    for (int k = 0; k < g.node_size(); ++k) {
      for (const auto& o : g.node(k).output()) producer[o] = k;
      for (const auto& i : g.node(k).input()) ++uses[i];
    }
    for (const auto& o : g.output()) ++uses[o.name()];
  }
  /// The node of type `op` that makes `name`, or -1.
  /// A node with fewer inputs than its op reads (a malformed file) matches nothing.
  int def(const std::string& name, const char* op) const {
    static const std::map<std::string, int> arity = {
        {"Mul", 2},  {"Add", 2},   {"MatMul", 2},  {"Where", 3},    {"Reshape", 2},
        {"Tanh", 1}, {"Split", 1}, {"Softmax", 1}, {"Transpose", 1}};
    auto it = producer.find(name);
    if (it == producer.end()) return -1;
    const auto& n = g.node(it->second);
    auto a = arity.find(op);
    return n.op_type() == op && n.domain().empty() &&
                   (a == arity.end() || n.input_size() >= a->second)
               ? it->second
               : -1;
  }
  /// Input i of node k, "" when the node has fewer (the rules run before arity is checked).
  const std::string& in(int k, int i) const {
    static const std::string none;
    const auto& n = g.node(k);
    return i < n.input_size() ? n.input(i) : none;
  }
  int count(const std::string& name) const {
    auto it = uses.find(name);
    return it == uses.end() ? 0 : it->second;
  }
  /// The value of a Constant node's one-element float or integer tensor.
  std::optional<double> scalar(const std::string& name) const {
    const std::optional<std::vector<double>> v = values(name);
    if (!v || v->size() != 1) return std::nullopt;
    return (*v)[0];
  }
  std::optional<std::vector<double>> values(const std::string& name) const {
    const int k = def(name, "Constant");
    if (k < 0) return std::nullopt;
    for (const auto& a : g.node(k).attribute())
      if (a.name() == "value" && a.t().dims_size() <= 1) {
        const Tensor t = tensor_from_proto(a.t(), "", "Constant");
        return t.to_vector<double>();
      }
    return std::nullopt;
  }
  std::vector<int64_t> perm(int k) const {
    for (const auto& a : g.node(k).attribute())
      if (a.name() == "perm") return {a.ints().begin(), a.ints().end()};
    return {};
  }
};

bool near(std::optional<double> v, double want) {
  return v && std::abs(*v - want) <= 1e-6 * std::max(1.0, std::abs(want));
}

/// A match: the nodes it replaces (the root last) and the node that replaces them.
struct Match {
  std::vector<int> nodes;
  onnx::NodeProto fused;
};

/// Operand of binary node k other than the one produced by op `op` (itself returned in `at`).
std::optional<std::string> other_of(const GraphView& v, int k, const char* op, int& at) {
  const auto& n = v.g.node(k);
  if (n.input_size() != 2) return std::nullopt;
  for (int s = 0; s < 2; ++s)
    if ((at = v.def(n.input(s), op)) >= 0) return n.input(1 - s);
  return std::nullopt;
}

/// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))): the exporter's tanh-GELU before opset 20.
std::optional<Match> gelu_tanh(const GraphView& v, int root) {
  const auto& r = v.g.node(root);
  if (r.op_type() != "Mul" || !r.domain().empty() || r.input_size() != 2) return std::nullopt;
  int half = -1, plus1 = -1, tanh_k = -1, scaled = -1, inner = -1, cubic = -1, x3 = -1, x2 = -1;
  for (int s = 0; s < 2 && half < 0; ++s) {
    half = v.def(r.input(s), "Mul");
    plus1 = v.def(r.input(1 - s), "Add");
    if (half < 0 || plus1 < 0) half = -1;
  }
  if (half < 0) return std::nullopt;
  const int xs = near(v.scalar(v.in(half, 1)), 0.5)   ? 0
                 : near(v.scalar(v.in(half, 0)), 0.5) ? 1
                                                      : -1;
  if (xs < 0) return std::nullopt;
  const std::string x = v.in(half, xs);
  auto one = other_of(v, plus1, "Tanh", tanh_k);
  if (!one || !near(v.scalar(*one), 1.0)) return std::nullopt;
  scaled = v.def(v.in(tanh_k, 0), "Mul");
  if (scaled < 0) return std::nullopt;
  auto c = other_of(v, scaled, "Add", inner);
  if (!c || !near(v.scalar(*c), std::sqrt(2.0 / M_PI))) return std::nullopt;
  auto xi = other_of(v, inner, "Mul", cubic);
  if (!xi || *xi != x) return std::nullopt;
  auto c3 = other_of(v, cubic, "Mul", x3);
  if (!c3 || !near(v.scalar(*c3), 0.044715)) return std::nullopt;
  auto xo = other_of(v, x3, "Mul", x2);
  if (!xo || *xo != x || v.in(x2, 0) != x || v.in(x2, 1) != x) return std::nullopt;
  Match m;
  m.nodes = {x2, x3, cubic, inner, scaled, tanh_k, half, plus1, root};
  m.fused.set_op_type("GeluTanh");
  m.fused.add_input(x);
  return m;
}

/// The exporter's causal attention on a packed projection qkv (B, T, 3D): Split into q, k, v,
/// each viewed as heads, softmax(q k^T * scale, masked by `keep`) v, heads merged to (B, T, D).
std::optional<Match> causal_attention(const GraphView& v, int root) {
  const auto& r = v.g.node(root);
  if (r.op_type() != "Reshape" || !r.domain().empty() || r.input_size() != 2) return std::nullopt;
  const int merge = v.def(r.input(0), "Transpose");
  if (merge < 0 || v.perm(merge) != std::vector<int64_t>{0, 2, 1, 3}) return std::nullopt;
  const int pv = v.def(v.in(merge, 0), "MatMul");
  if (pv < 0) return std::nullopt;
  const int sm = v.def(v.in(pv, 0), "Softmax");
  if (sm < 0) return std::nullopt;
  for (const auto& a : v.g.node(sm).attribute())
    if (a.name() == "axis" && a.i() != -1 && a.i() != 3) return std::nullopt;
  const int wh = v.def(v.in(sm, 0), "Where");
  if (wh < 0) return std::nullopt;
  const std::optional<double> fill = v.scalar(v.in(wh, 2));
  if (!fill || !std::isinf(*fill) || *fill > 0) return std::nullopt;
  const std::string keep = v.in(wh, 0);
  const int mul = v.def(v.in(wh, 1), "Mul");
  if (mul < 0) return std::nullopt;
  int qk = -1;
  const std::optional<std::string> scale_name = other_of(v, mul, "MatMul", qk);
  const std::optional<double> scale = scale_name ? v.scalar(*scale_name) : std::nullopt;
  if (!scale) return std::nullopt;
  // q, k^T, v: Transpose(Reshape(Split output s, (0, 0, heads, d))) with perms 0213, 0231, 0213.
  std::vector<int> nodes;
  std::string qkv;
  int64_t heads = 0, d = 0;
  auto head_view = [&](const std::string& name, std::vector<int64_t> perm, int part) {
    const int t = v.def(name, "Transpose");
    if (t < 0 || v.perm(t) != perm) return false;
    const int rs = v.def(v.in(t, 0), "Reshape");
    if (rs < 0) return false;
    auto shape = v.values(v.in(rs, 1));
    if (!shape || shape->size() != 4 || (*shape)[0] != 0 || (*shape)[1] != 0) return false;
    for (int i : {2, 3})  // a whole, positive count of heads and head width
      if (!((*shape)[i] >= 1 && (*shape)[i] <= double{1 << 24}) ||
          (*shape)[i] != std::floor((*shape)[i]))
        return false;
    const int sp = v.def(v.in(rs, 0), "Split");
    if (sp < 0 || v.g.node(sp).output_size() != 3 || v.g.node(sp).output(part) != v.in(rs, 0))
      return false;
    if (qkv.empty()) {
      qkv = v.in(sp, 0);
      heads = static_cast<int64_t>((*shape)[2]);
      d = static_cast<int64_t>((*shape)[3]);
      nodes.push_back(sp);
    } else if (qkv != v.in(sp, 0) || static_cast<double>(heads) != (*shape)[2] ||
               static_cast<double>(d) != (*shape)[3]) {
      return false;
    }
    nodes.push_back(rs), nodes.push_back(t);
    return true;
  };
  if (!head_view(v.in(qk, 0), {0, 2, 1, 3}, 0) || !head_view(v.in(qk, 1), {0, 2, 3, 1}, 1) ||
      !head_view(v.in(pv, 1), {0, 2, 1, 3}, 2))
    return std::nullopt;
  const auto& split = v.g.node(nodes[0]);
  for (const auto& a : split.attribute())
    if (a.name() == "axis" && a.i() != 2 && a.i() != -1) return std::nullopt;
  if (split.input_size() > 1) {
    auto sizes = v.values(split.input(1));
    if (!sizes || *sizes != std::vector<double>(3, static_cast<double>(heads * d)))
      return std::nullopt;
  }
  auto merged = v.values(r.input(1));
  if (!merged || *merged != std::vector<double>{0, 0, static_cast<double>(heads * d)})
    return std::nullopt;
  nodes.insert(nodes.end(), {qk, mul, wh, sm, pv, merge, root});
  Match m;
  m.nodes = nodes;
  m.fused.set_op_type("CausalAttention");
  m.fused.add_input(qkv);
  m.fused.add_input(keep);
  auto* a = m.fused.add_attribute();
  a->set_name("heads");
  a->set_type(onnx::AttributeProto::INT);
  a->set_i(heads);
  a = m.fused.add_attribute();
  a->set_name("scale");
  a->set_type(onnx::AttributeProto::FLOAT);
  a->set_f(static_cast<float>(*scale));
  return m;
}

using Rule = std::optional<Match> (*)(const GraphView&, int);
constexpr Rule kRules[] = {gelu_tanh, causal_attention};

}  // namespace

void fuse_onnx_graph(onnx::GraphProto& g, std::vector<int>& versions) {
  std::vector<bool> gone(static_cast<size_t>(g.node_size()), false);
  std::map<int, onnx::NodeProto> replace;  // root index -> fused node
  const GraphView v(g);
  for (int root = 0; root < g.node_size(); ++root)
    for (Rule rule : kRules) {
      if (g.node(root).output_size() != 1) break;  // every rule's root makes one value
      std::optional<Match> m = rule(v, root);
      if (!m) continue;
      // Every value the match consumes inside itself must have no reader outside it.
      bool ok = true;
      std::map<std::string, int> inside;
      for (int k : m->nodes)
        for (const auto& i : g.node(k).input()) ++inside[i];
      for (int k : m->nodes) {
        ok = ok && !gone[static_cast<size_t>(k)];
        if (k != root)
          for (const auto& o : g.node(k).output()) ok = ok && v.count(o) == inside[o];
      }
      if (!ok) continue;
      for (int k : m->nodes) gone[static_cast<size_t>(k)] = true;
      m->fused.set_domain(kOnnxFusedDomain);
      m->fused.set_name(g.node(root).name());
      m->fused.add_output(g.node(root).output(0));
      replace[root] = m->fused;
      break;
    }
  if (replace.empty()) return;
  onnx::GraphProto out = g;
  out.clear_node();
  std::vector<int> kept;
  for (int k = 0; k < g.node_size(); ++k) {
    if (auto it = replace.find(k); it != replace.end()) {
      *out.add_node() = it->second;
      kept.push_back(1);
    } else if (!gone[static_cast<size_t>(k)]) {
      *out.add_node() = g.node(k);
      kept.push_back(versions[static_cast<size_t>(k)]);
    }
  }
  g = std::move(out);
  versions = std::move(kept);
}

namespace {

std::vector<Tensor> fused_gelu_tanh(const OnnxNodeCtx& c) { return {gelu(c.in.at(0), "tanh")}; }

/// The fused kernel where the mask is the causal one (a constant after folding), else the
/// subgraph's own computation.
std::vector<Tensor> fused_causal_attention(const OnnxNodeCtx& c) {
  const Tensor& qkv = c.in.at(0);
  const Tensor& keep = c.in.at(1);
  const int64_t heads = c.attr_int("heads", 1);
  const double scale = c.attr_float("scale", 1);
  if (heads < 1) fail(c.where(), "heads must be at least 1, got ", heads);
  if (qkv.ndim() != 3 || heads > qkv.shape()[2] || qkv.shape()[2] % (3 * heads) != 0)
    fail(c.where(), "qkv must be (B, T, 3 D) with D a multiple of ", heads, " heads, got ",
         shape_str(qkv.shape()));
  const int64_t T = qkv.shape()[1], D = qkv.shape()[2] / 3, d = D / heads;
  bool causal =
      keep.dtype() == Dtype::boolean && keep.shape() == Shape{T, T} && keep.node()->prim == nullptr;
  if (causal) {
    const std::vector<int64_t> k = keep.to_vector<int64_t>();
    for (int64_t i = 0; causal && i < T; ++i)
      for (int64_t j = 0; causal && j < T; ++j)
        causal = (k[static_cast<size_t>(i * T + j)] != 0) == (j <= i);
  }
  // The default scale 1/sqrt(d) as the module passes it (none), when the file's f32 is it.
  const double def = 1.0 / std::sqrt(static_cast<double>(d));
  std::optional<double> s;
  if (static_cast<float>(def) != static_cast<float>(scale)) s = scale;
  if (causal) return {scaled_dot_product_attention_packed(qkv, heads, true, s)};
  std::vector<Tensor> parts = split(qkv, {D, D, D}, 2);
  const int64_t B = qkv.shape()[0];
  auto view = [&](const Tensor& t) { return permute(reshape(t, {B, T, heads, d}), {0, 2, 1, 3}); };
  Tensor q = view(parts[0]), k = view(parts[1]), v = view(parts[2]);
  Tensor scores = matmul(q, permute(k, {0, 1, 3, 2})) * scalar(scale, qkv.dtype());
  scores = where(keep, scores, scalar(-INFINITY, qkv.dtype()));
  Tensor y = permute(matmul(softmax(scores, -1), v), {0, 2, 1, 3});
  return {reshape(y, {B, T, D})};
}

}  // namespace

const std::map<std::string, OnnxOpDef>& onnx_fused_op_table() {
  static const std::map<std::string, OnnxOpDef> table = {
      {"GeluTanh", {{1}, {1}, fused_gelu_tanh}},
      {"CausalAttention", {{1}, {1}, fused_causal_attention}},
  };
  return table;
}

}  // namespace hetrain::interop
