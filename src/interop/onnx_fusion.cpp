// Import-time fusion: a table of rules, each recognising the subgraph of elementary ONNX ops an
// exporter writes for one of Hetrain's fused ops (GELU, tanh or erf; causal attention on a
// packed QKV projection) and replacing it by one node of the private domain "hetrain", built as
// that fused op. The rules know Hetrain's own exporter and PyTorch's (torch.onnx: the explicit
// matmul/softmax/mask attention, scaled_dot_product_attention, nn.GELU): a Hetrain GPT exported
// and imported back runs the same kernels as the module (bit for bit), a PyTorch GPT runs
// Hetrain's. A subgraph that differs in any node or constant is left as it is, and so is one
// whose intermediate values are read outside it (other than for their shapes alone).
#include <cmath>
#include <optional>
#include <set>

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
  std::map<std::string, std::vector<int>> readers;
  std::set<std::string> outputs;

  explicit GraphView(const onnx::GraphProto& graph) : g(graph) {
    for (int k = 0; k < g.node_size(); ++k) {
      for (const auto& o : g.node(k).output()) producer[o] = k;
      for (const auto& i : g.node(k).input()) ++uses[i], readers[i].push_back(k);
    }
    for (const auto& o : g.output()) ++uses[o.name()], outputs.insert(o.name());
  }
  /// Whether node k uses its inputs for their shapes alone: Shape, or a view (Transpose,
  /// Reshape, ...) whose values are used that way (depth bounds the walk).
  bool reads_shape_only(int k, int depth = 0) const {
    const auto& n = g.node(k);
    if (n.op_type() == "Shape" && n.domain().empty()) return true;
    static const std::set<std::string> views = {"Transpose", "Reshape",  "Unsqueeze",
                                                "Squeeze",   "Identity", "Flatten"};
    if (depth > 8 || !n.domain().empty() || !views.count(n.op_type())) return false;
    for (const auto& o : n.output()) {
      if (outputs.count(o)) return false;
      auto it = readers.find(o);
      if (it != readers.end())
        for (int r : it->second)
          if (!reads_shape_only(r, depth + 1)) return false;
    }
    return true;
  }
  /// The node of type `op` that makes `name`, or -1.
  /// A node with fewer inputs than its op reads (a malformed file) matches nothing.
  int def(const std::string& name, const char* op) const {
    static const std::map<std::string, int> arity = {
        {"Mul", 2},  {"Add", 2},   {"MatMul", 2},  {"Where", 3},     {"Reshape", 2}, {"Div", 2},
        {"Tanh", 1}, {"Split", 1}, {"Softmax", 1}, {"Transpose", 1}, {"Erf", 1}};
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

/// Node k when it is the binary `op` of a value made by op `of` and the value `other` (either
/// operand order): the index of the `of` node, or -1.
int with_other(const GraphView& v, int k, const char* of, const std::string& other) {
  if (k < 0 || v.g.node(k).input_size() != 2) return -1;
  for (int s = 0; s < 2; ++s)
    if (v.in(k, 1 - s) == other)
      if (const int d = v.def(v.in(k, s), of); d >= 0) return d;
  return -1;
}

/// Node k when it is binary with a one-element constant near `c` and a value made by op `of`
/// (either order): the index of the `of` node, or -1.
int with_const(const GraphView& v, int k, const char* of, double c) {
  if (k < 0 || v.g.node(k).input_size() != 2) return -1;
  for (int s = 0; s < 2; ++s)
    if (near(v.scalar(v.in(k, 1 - s)), c))
      if (const int d = v.def(v.in(k, s), of); d >= 0) return d;
  return -1;
}

/// The nodes of 1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)) made by node `plus1` (x^3 as x (x x)
/// or (x x) x; each product and sum in either order), or empty.
std::vector<int> tanh_part(const GraphView& v, int plus1, const std::string& x) {
  const int tanh_k = with_const(v, plus1, "Tanh", 1.0);
  const int scaled = tanh_k < 0 ? -1 : v.def(v.in(tanh_k, 0), "Mul");
  const int inner = with_const(v, scaled, "Add", std::sqrt(2.0 / M_PI));
  const int cubic = with_other(v, inner, "Mul", x);
  const int x3 = with_const(v, cubic, "Mul", 0.044715);
  const int x2 = with_other(v, x3, "Mul", x);
  if (x2 < 0 || v.in(x2, 0) != x || v.in(x2, 1) != x) return {};
  return {x2, x3, cubic, inner, scaled, tanh_k, plus1};
}

/// The nodes of 1 + erf(x / sqrt(2)) (or erf(x * (1/sqrt(2)))) made by node `plus1`, or empty.
std::vector<int> erf_part(const GraphView& v, int plus1, const std::string& x) {
  const int erf_k = with_const(v, plus1, "Erf", 1.0);
  if (erf_k < 0) return {};
  const std::string& e = v.in(erf_k, 0);
  int k = v.def(e, "Div");
  if (k >= 0 && (v.in(k, 0) != x || !near(v.scalar(v.in(k, 1)), std::sqrt(2.0)))) k = -1;
  if (k < 0) {
    k = v.def(e, "Mul");
    const bool ok = k >= 0 && ((v.in(k, 0) == x && near(v.scalar(v.in(k, 1)), M_SQRT1_2)) ||
                               (v.in(k, 1) == x && near(v.scalar(v.in(k, 0)), M_SQRT1_2)));
    if (!ok) return {};
  }
  return {k, erf_k, plus1};
}

/// GELU as the exporters write it, 0.5 x (1 + f(x)) with f tanh's approximation or erf: the
/// outer product associated as (0.5 x) p (Hetrain), 0.5 (x p) (PyTorch's tanh) or (x p) 0.5
/// (PyTorch's erf), each product in either operand order.
std::optional<Match> gelu_any(const GraphView& v, int root) {
  const auto& r = v.g.node(root);
  if (r.op_type() != "Mul" || !r.domain().empty() || r.input_size() != 2) return std::nullopt;
  // Candidates (x, the Add node of 1 + f(x), the node of the other product).
  std::vector<std::tuple<std::string, int, int>> cands;
  for (int s = 0; s < 2; ++s) {
    const int a = v.def(r.input(s), "Mul"), p = v.def(r.input(1 - s), "Add");
    if (a >= 0 && p >= 0)  // (0.5 x) p
      for (int t = 0; t < 2; ++t)
        if (near(v.scalar(v.in(a, 1 - t)), 0.5)) cands.emplace_back(v.in(a, t), p, a);
    if (a >= 0 && near(v.scalar(r.input(1 - s)), 0.5))  // 0.5 (x p), (x p) 0.5
      for (int t = 0; t < 2; ++t)
        if (const int q = v.def(v.in(a, 1 - t), "Add"); q >= 0)
          cands.emplace_back(v.in(a, t), q, a);
  }
  for (const auto& [x, plus1, other] : cands) {
    const bool tanh = !tanh_part(v, plus1, x).empty();
    std::vector<int> nodes = tanh ? tanh_part(v, plus1, x) : erf_part(v, plus1, x);
    if (nodes.empty()) continue;
    nodes.insert(nodes.end(), {other, root});
    Match m;
    m.nodes = nodes;
    m.fused.set_op_type(tanh ? "GeluTanh" : "GeluErf");
    m.fused.add_input(x);
    return m;
  }
  return std::nullopt;
}

void set_attr(onnx::NodeProto& n, const char* name, const std::string& s) {
  auto* a = n.add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::STRING);
  a->set_s(s);
}

/// The attention scores' softmax input read back to the q/k product: the mask (Where with a -inf
/// fill: kept where true or dropped where true; or added), then the scale (a constant factor or
/// divisor, or none).
struct Scores {
  int qk = -1;
  std::vector<int> nodes;
  std::string mask, mask_kind, divide = "0";
  double scale = 1;
  bool scaled = false;
};

std::optional<Scores> scores_of(const GraphView& v, const std::string& s) {
  Scores r;
  std::vector<std::string> scaled;  // candidates for the scaled product
  if (const int wh = v.def(s, "Where"); wh >= 0) {
    for (int at : {2, 1}) {
      const std::optional<double> fill = v.scalar(v.in(wh, at));
      if (fill && std::isinf(*fill) && *fill < 0 && scaled.empty()) {
        r.mask = v.in(wh, 0), r.mask_kind = at == 2 ? "keep" : "drop";
        scaled.push_back(v.in(wh, at == 2 ? 1 : 2));
      }
    }
    r.nodes.push_back(wh);
  } else if (const int add = v.def(s, "Add"); add >= 0) {
    r.mask_kind = "add";
    scaled = {v.in(add, 0), v.in(add, 1)};
    r.nodes.push_back(add);
  }
  for (size_t i = 0; i < scaled.size(); ++i) {
    if (r.mask_kind == "add") r.mask = scaled[1 - i];
    if ((r.qk = v.def(scaled[i], "MatMul")) >= 0) return r;
    const int mul = v.def(scaled[i], "Mul"), div = v.def(scaled[i], "Div");
    for (int k : {mul, div}) {
      if (k < 0) continue;
      for (int t = 0; t < (k == mul ? 2 : 1); ++t) {
        const std::optional<double> c = v.scalar(v.in(k, 1 - t));
        if (!c || !std::isfinite(*c) || *c == 0 || (r.qk = v.def(v.in(k, t), "MatMul")) < 0)
          continue;
        r.scale = *c, r.scaled = true, r.divide = k == div ? "1" : "0";
        r.nodes.push_back(k);
        return r;
      }
    }
  }
  return std::nullopt;
}

/// Causal attention on a packed projection qkv (B, T, 3D): Split into q, k, v, each viewed as
/// heads (Reshape to (B, T, heads, d), constant as Hetrain writes it or computed from Shape as
/// PyTorch does, then Transpose), softmax(mask(q k^T scale)) v, heads merged to (B, T, D).
/// PyTorch's scaled_dot_product_attention scales q and k^T each by a computed factor and adds
/// the mask. Shapes and factors computed in the file become inputs of the fused node, which
/// checks their values while building.
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
  std::optional<Scores> sc = scores_of(v, v.in(sm, 0));
  if (!sc || sc->mask.empty()) return std::nullopt;
  std::vector<int> nodes;
  std::string qkv;
  std::string factors[2];
  auto allowzero = [&](int k) {
    for (const auto& a : v.g.node(k).attribute())
      if (a.name() == "allowzero" && a.i() != 0) return true;
    return false;
  };
  // Operand `side` of q k^T: [Mul(..., factor) of] Transpose(Reshape(Split output part)).
  auto head_view = [&](const std::string& name, std::vector<int64_t> perm, int part, int side) {
    std::string view = name;
    if (side >= 0)
      if (const int f = v.def(name, "Mul"); f >= 0)
        for (int t = 0; t < 2; ++t)
          if (v.def(v.in(f, t), "Transpose") >= 0 && factors[side].empty()) {
            view = v.in(f, t), factors[side] = v.in(f, 1 - t);
            nodes.push_back(f);
          }
    const int t = v.def(view, "Transpose");
    if (t < 0 || v.perm(t) != perm) return false;
    const int rs = v.def(v.in(t, 0), "Reshape");
    if (rs < 0 || allowzero(rs)) return false;
    if (auto shape = v.values(v.in(rs, 1))) {  // written as constants: (0, 0, heads, d)
      if (shape->size() != 4 || (*shape)[0] != 0 || (*shape)[1] != 0) return false;
      for (int i : {2, 3})
        if (!((*shape)[i] >= 1 && (*shape)[i] <= double{1 << 24})) return false;
    }
    const int sp = v.def(v.in(rs, 0), "Split");
    if (sp < 0 || v.g.node(sp).output_size() != 3 || v.g.node(sp).output(part) != v.in(rs, 0))
      return false;
    if (qkv.empty()) {
      qkv = v.in(sp, 0);
      nodes.push_back(sp);
    } else if (qkv != v.in(sp, 0)) {
      return false;
    }
    nodes.push_back(rs), nodes.push_back(t);
    return true;
  };
  const int qk = sc->qk;
  if (!head_view(v.in(qk, 0), {0, 2, 1, 3}, 0, 0) || !head_view(v.in(qk, 1), {0, 2, 3, 1}, 1, 1) ||
      !head_view(v.in(pv, 1), {0, 2, 1, 3}, 2, -1))
    return std::nullopt;
  if (factors[0].empty() != factors[1].empty() || allowzero(root)) return std::nullopt;
  int split_k = -1;
  for (int k : nodes)
    if (v.g.node(k).op_type() == "Split") split_k = k;
  if (split_k < 0) return std::nullopt;
  const auto& split = v.g.node(split_k);
  for (const auto& a : split.attribute())
    if ((a.name() == "axis" && a.i() != 2 && a.i() != -1) || a.name() == "num_outputs")
      return std::nullopt;
  if (split.input_size() > 1) {  // sizes, if given, equal thirds
    auto sizes = v.values(split.input(1));
    if (!sizes || sizes->size() != 3 || (*sizes)[0] != (*sizes)[1] || (*sizes)[0] != (*sizes)[2])
      return std::nullopt;
  }
  nodes.push_back(qk);
  nodes.insert(nodes.end(), sc->nodes.rbegin(), sc->nodes.rend());
  nodes.insert(nodes.end(), {sm, pv, merge, root});
  Match m;
  m.nodes = nodes;
  m.fused.set_op_type("CausalAttention");
  // Inputs: qkv, mask, the q, k and v views' shapes, the merged shape, q's and k's factors.
  for (const std::string& in : {qkv, sc->mask, std::string(), std::string(), std::string(),
                                r.input(1), factors[0], factors[1]})
    m.fused.add_input(in);
  for (int k : nodes)
    if (v.g.node(k).op_type() == "Reshape" && k != root)
      for (int part : {0, 1, 2})
        if (v.in(k, 0) == split.output(part)) *m.fused.mutable_input(2 + part) = v.in(k, 1);
  set_attr(m.fused, "mask", sc->mask_kind);
  if (sc->scaled) {
    auto* a = m.fused.add_attribute();
    a->set_name("scale");
    a->set_type(onnx::AttributeProto::FLOAT);
    a->set_f(static_cast<float>(sc->scale));
    set_attr(m.fused, "divide", sc->divide);
  }
  return m;
}

using Rule = std::optional<Match> (*)(const GraphView&, int);
constexpr Rule kRules[] = {gelu_any, causal_attention};

}  // namespace

void fuse_onnx_graph(onnx::GraphProto& g, std::vector<int>& versions) {
  std::vector<bool> claimed(static_cast<size_t>(g.node_size()), false);
  std::map<int, onnx::NodeProto> replace;  // root index -> fused node
  const GraphView v(g);
  for (int root = 0; root < g.node_size(); ++root)
    for (Rule rule : kRules) {
      if (g.node(root).output_size() != 1) break;  // every rule's root makes one value
      std::optional<Match> m = rule(v, root);
      if (!m) continue;
      // A value the match consumes inside itself may be read outside it only for its shape
      // (PyTorch's attention mask is sized from a view of k); such nodes stay, unfused.
      bool ok = true;
      const std::set<int> in_match(m->nodes.begin(), m->nodes.end());
      for (int k : m->nodes) {
        ok = ok && !claimed[static_cast<size_t>(k)];
        if (k == root) continue;
        for (const auto& o : g.node(k).output()) {
          ok = ok && !v.outputs.count(o);
          auto it = v.readers.find(o);
          if (it != v.readers.end())
            for (int rd : it->second) ok = ok && (in_match.count(rd) || v.reads_shape_only(rd));
        }
      }
      if (!ok) continue;
      for (int k : m->nodes) claimed[static_cast<size_t>(k)] = true;
      m->fused.set_domain(kOnnxFusedDomain);
      m->fused.set_name(g.node(root).name());
      m->fused.add_output(g.node(root).output(0));
      replace[root] = m->fused;
      break;
    }
  if (replace.empty()) return;
  // A matched node stays while a kept node reads one of its values (to a fixed point: the
  // file's node order is not trusted).
  const size_t n = static_cast<size_t>(g.node_size());
  std::vector<bool> keep(n);
  for (size_t k = 0; k < n; ++k) keep[k] = !claimed[k] || replace.count(static_cast<int>(k));
  for (bool grew = true; grew;) {
    grew = false;
    std::set<std::string> read;
    for (size_t k = 0; k < n; ++k)
      if (keep[k]) {
        auto it = replace.find(static_cast<int>(k));
        for (const auto& i :
             (it != replace.end() ? it->second : g.node(static_cast<int>(k))).input())
          read.insert(i);
      }
    for (size_t k = 0; k < n; ++k)
      for (const auto& o : g.node(static_cast<int>(k)).output())
        if (!keep[k] && read.count(o)) keep[k] = grew = true;
  }
  onnx::GraphProto out = g;
  out.clear_node();
  std::vector<int> kept;
  for (int k = 0; k < g.node_size(); ++k) {
    if (auto it = replace.find(k); it != replace.end()) {
      *out.add_node() = it->second;
      kept.push_back(1);
    } else if (keep[static_cast<size_t>(k)]) {
      *out.add_node() = g.node(k);
      kept.push_back(versions[static_cast<size_t>(k)]);
    }
  }
  g = std::move(out);
  versions = std::move(kept);
}

namespace {

std::vector<Tensor> fused_gelu_tanh(const OnnxNodeCtx& c) { return {gelu(c.in.at(0), "tanh")}; }
std::vector<Tensor> fused_gelu_erf(const OnnxNodeCtx& c) { return {gelu(c.in.at(0), "none")}; }

/// The one value of a one-element input known while building, else nullopt.
std::optional<double> known_scalar(const OnnxNodeCtx& c, size_t i) {
  if (!c.has_input(i) || c.in[i].numel() != 1 || c.in[i].node()->prim != nullptr)
    return std::nullopt;
  return c.in[i].to_vector<double>()[0];
}

/// Whether the mask (kind keep, drop or add) is the causal one over T positions, as a constant.
bool causal_mask(const Tensor& mask, const std::string& kind, int64_t T) {
  const Shape& s = mask.shape();
  if (mask.node()->prim != nullptr || s.size() < 2 || s[s.size() - 1] != T ||
      s[s.size() - 2] != T || (kind == "add") == (mask.dtype() == Dtype::boolean))
    return false;
  for (size_t i = 0; i + 2 < s.size(); ++i)  // (..., T, T) with leading 1s: no product to overflow
    if (s[i] != 1) return false;
  const std::vector<double> m = mask.to_vector<double>();
  for (int64_t i = 0; i < T; ++i)
    for (int64_t j = 0; j < T; ++j) {
      const double x = m[static_cast<size_t>(i * T + j)];
      const bool ok = kind == "keep"   ? (x != 0) == (j <= i)
                      : kind == "drop" ? (x != 0) == (j > i)
                                       : (j <= i ? x == 0 : std::isinf(x) && x < 0);
      if (!ok) return false;
    }
  return true;
}

/// The fused kernel where the views are (B, T, heads, d), the factors are constants and the
/// mask is the causal one (constants after folding), else the subgraph's own computation.
std::vector<Tensor> fused_causal_attention(const OnnxNodeCtx& c) {
  const Tensor& qkv = c.in.at(0);
  if (qkv.ndim() != 3 || qkv.shape()[2] % 3 != 0)
    fail(c.where(), "qkv must be (B, T, 3 D), got ", shape_str(qkv.shape()));
  const std::string kind = c.attr_string("mask", "keep");
  if (kind != "keep" && kind != "drop" && kind != "add")
    fail(c.where(), "mask must be keep, drop or add, got '", kind, "'");
  if (!c.has_input(1) || !c.has_input(2) || !c.has_input(3) || !c.has_input(4) || !c.has_input(5))
    fail(c.where(), "needs qkv, the mask and the four shapes");
  const Tensor& mask = c.in[1];
  const int64_t B = qkv.shape()[0], T = qkv.shape()[1], D = qkv.shape()[2] / 3;
  std::vector<Tensor> parts = split(qkv, {D, D, D}, 2);
  Shape views[3];
  for (int i = 0; i < 3; ++i)
    views[i] = onnx_reshape_target(c, parts[0].shape(), c.ints(2 + i), false);
  const int64_t heads = views[0].size() == 4 ? std::max<int64_t>(views[0][2], 0) : 0;
  const Shape head{B, T, heads, heads > 0 ? D / heads : 0};
  const std::vector<int64_t> merge = c.ints(5);
  const bool factors = c.has_input(6) || c.has_input(7);
  const std::optional<double> fq = known_scalar(c, 6), fk = known_scalar(c, 7);
  const bool divide = c.attr_string("divide", "0") == "1";
  const bool scaled = c.has_attr("scale");
  const double scale = c.attr_float("scale", 1);
  if (heads > 0 && D % heads == 0 && views[0] == head && views[1] == head && views[2] == head &&
      onnx_reshape_target(c, head, merge, false) == Shape{B, T, D} && (!factors || (fq && fk)) &&
      causal_mask(mask, kind, T)) {
    double s = factors ? *fq * *fk : 1.0;
    if (scaled) s = divide ? s / scale : s * scale;
    // The default scale 1/sqrt(d) as the module passes it (none), when the file's f32 is it.
    const double def = 1.0 / std::sqrt(static_cast<double>(head[3]));
    std::optional<double> explicit_scale;
    if (static_cast<float>(def) != static_cast<float>(s)) explicit_scale = s;
    return {scaled_dot_product_attention_packed(qkv, heads, true, explicit_scale)};
  }
  // The subgraph as written (ONNX broadcasting for the mask and factors).
  Tensor q = permute(reshape(parts[0], views[0]), {0, 2, 1, 3});
  Tensor kt = permute(reshape(parts[1], views[1]), {0, 2, 3, 1});
  Tensor v = permute(reshape(parts[2], views[2]), {0, 2, 1, 3});
  if (c.has_input(6)) q = q * c.in[6];
  if (c.has_input(7)) kt = kt * c.in[7];
  Tensor scores = matmul(q, kt);
  if (scaled)
    scores = divide ? scores / scalar(scale, qkv.dtype()) : scores * scalar(scale, qkv.dtype());
  const Tensor inf = scalar(-INFINITY, qkv.dtype());
  scores = kind == "keep"   ? where(mask, scores, inf)
           : kind == "drop" ? where(mask, inf, scores)
                            : scores + mask;
  Tensor y = permute(matmul(softmax(scores, -1), v), {0, 2, 1, 3});
  return {reshape(y, onnx_reshape_target(c, y.shape(), merge, false))};
}

}  // namespace

const std::map<std::string, OnnxOpDef>& onnx_fused_op_table() {
  static const std::map<std::string, OnnxOpDef> table = {
      {"GeluTanh", {{1}, {1}, fused_gelu_tanh}},
      {"GeluErf", {{1}, {1}, fused_gelu_erf}},
      {"CausalAttention", {{1}, {1}, fused_causal_attention}},
  };
  return table;
}

}  // namespace hetrain::interop
