// Activation checkpointing: which forward tensors a backward keeps, and the replayed copies of
// the forward nodes it reads instead of the others.
#include "hetrain/graph/recompute.h"

#include <algorithm>

#include "hetrain/base/error.h"
#include "hetrain/graph/primitive.h"

namespace hetrain {

RecomputeMode parse_recompute(const std::string& s, const std::string& what) {
  if (s == "none") return RecomputeMode::none;
  if (s == "selective") return RecomputeMode::selective;
  if (s == "full") return RecomputeMode::full;
  if (s == "auto") return RecomputeMode::automatic;
  fail(what, ": recompute must be none, selective, full or auto, got '", s, "'");
}

const char* recompute_name(RecomputeMode m) {
  switch (m) {
    case RecomputeMode::none:
      return "none";
    case RecomputeMode::selective:
      return "selective";
    case RecomputeMode::full:
      return "full";
    case RecomputeMode::automatic:
      return "auto";
  }
  return "?";
}

namespace {
thread_local RecomputePolicy g_policy;
}  // namespace

RecomputeScope::RecomputeScope(RecomputePolicy p) : prev_(std::move(g_policy)) {
  g_policy = std::move(p);
}
RecomputeScope::~RecomputeScope() { g_policy = std::move(prev_); }
const RecomputePolicy& RecomputeScope::current() { return g_policy; }

namespace {

bool is_forward(const Node* n) { return n->prim && !n->evaluated(); }

/// Output bytes of a node and the FLOPs its primitive declares for it.
std::pair<double, double> bytes_and_flops(const Node* n) {
  std::vector<TensorMeta> in, out;
  for (const Tensor& t : n->inputs) in.push_back({t.shape(), t.dtype()});
  double bytes = 0;
  for (const Array& a : n->outs) {
    out.push_back({a.shape, a.dtype});
    bytes += static_cast<double>(a.nbytes());
  }
  return {bytes, n->prim->cost(in, out).flops};
}

/// A forward node replayed for the backward: the node's primitive on its inputs, with one more
/// input, the trigger, that only orders it after the backward has reached its consumer (the
/// kernel never sees it).
class Replayed final : public Primitive {
 public:
  Replayed(std::shared_ptr<Primitive> inner, size_t inputs)
      : inner_(std::move(inner)), inputs_(inputs) {}
  const char* name() const override { return inner_->name(); }
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override {
    return inner_->infer({in.begin(), in.begin() + static_cast<std::ptrdiff_t>(inputs_)});
  }
  Cost cost(const std::vector<TensorMeta>& in, const std::vector<TensorMeta>& out) const override {
    return inner_->cost({in.begin(), in.begin() + static_cast<std::ptrdiff_t>(inputs_)}, out);
  }
  void eval_cpu(const std::vector<const Array*>& in,
                const std::vector<Array*>& out) const override {
    inner_->eval_cpu({in.begin(), in.begin() + static_cast<std::ptrdiff_t>(inputs_)}, out);
  }
  void eval_cuda(const std::vector<const Array*>& in,
                 const std::vector<Array*>& out) const override {
    inner_->eval_cuda({in.begin(), in.begin() + static_cast<std::ptrdiff_t>(inputs_)}, out);
  }
  bool has_kernel(DeviceKind k) const override { return inner_->has_kernel(k); }
  std::vector<Tensor> vjp(const std::vector<Tensor>&, const std::vector<Tensor>&,
                          const std::vector<Tensor>&, const std::vector<int>&) const override {
    fail("[", inner_->name(), "] internal: a replayed forward node has no gradient");
  }
  bool is_view() const override { return inner_->is_view(); }
  std::string attrs() const override {
    const std::string a = inner_->attrs();
    return a.empty() ? "replayed" : a + " replayed";
  }

 private:
  std::shared_ptr<Primitive> inner_;
  size_t inputs_;
};

/// Selective: replay a node whose FLOPs per output byte are below this (elementwise ops,
/// dropout, norms, activations, softmax: a few FLOPs per element), keep the others (matmul,
/// convolution, attention: FLOPs per element grow with the reduced dimension).
constexpr double kCheapFlopsPerByte = 4;
/// Selective: a replayed node is at most this many cheap nodes away from kept tensors, so a
/// chain of cheap nodes (a residual stream of adds) is not replayed from its start.
constexpr int kMaxReplayDepth = 2;

std::unordered_set<const Node*> selective_replays(const ForwardUnits& u) {
  std::unordered_map<const Node*, int> depth;  // 0: kept
  std::unordered_set<const Node*> replay;
  for (Node* n : u.nodes) {
    int d = 0;
    for (const Tensor& in : n->inputs)
      if (auto it = depth.find(in.node()); it != depth.end()) d = std::max(d, it->second);
    if (n->prim->is_view()) {
      // No memory of its own: replayed with its input, else kept with it.
      const Node* in0 = n->inputs.empty() ? nullptr : n->inputs[0].node();
      const bool with_input = in0 && replay.count(in0);
      depth[n] = with_input ? depth[in0] : 0;
      if (with_input) replay.insert(n);
      continue;
    }
    const auto [bytes, flops] = bytes_and_flops(n);
    const bool cheap = flops < kCheapFlopsPerByte * bytes;
    if (cheap && d + 1 <= kMaxReplayDepth) {
      depth[n] = d + 1;
      replay.insert(n);
    } else {
      depth[n] = 0;
    }
  }
  return replay;
}

std::unordered_set<const Node*> segment_replays(const ForwardUnits& u, const RecomputePolicy& p) {
  const int units = u.units();
  std::vector<char> replayed(static_cast<size_t>(units), 0);
  std::vector<char> kept_cut(static_cast<size_t>(units), 1);  // the cut after unit k is kept
  if (p.explicit_units) {
    for (int k : p.replayed_units)
      if (k >= 0 && k < units) replayed[static_cast<size_t>(k)] = 1;
    if (!p.segment_ends.empty()) {
      std::fill(kept_cut.begin(), kept_cut.end(), 0);
      for (int k : p.segment_ends)
        if (k >= 0 && k < units) kept_cut[static_cast<size_t>(k)] = 1;
    }
  } else {
    for (int k = 0; k + 1 < units; ++k) replayed[static_cast<size_t>(k)] = 1;
  }
  std::unordered_set<const Node*> keep;
  for (int k = 0; k + 1 < units; ++k)
    if (kept_cut[static_cast<size_t>(k)] || !replayed[static_cast<size_t>(k + 1)])
      keep.insert(u.cut[static_cast<size_t>(k)]);
  std::unordered_set<const Node*> replay;
  for (size_t i = 0; i < u.nodes.size(); ++i)
    if (replayed[static_cast<size_t>(u.unit_of[i])] && !keep.count(u.nodes[i]))
      replay.insert(u.nodes[i]);
  return replay;
}

}  // namespace

ForwardUnits forward_units(const std::vector<std::shared_ptr<Node>>& topo) {
  ForwardUnits u;
  std::unordered_map<const Node*, int> pos;
  for (const auto& n : topo)
    if (is_forward(n.get())) {
      pos[n.get()] = static_cast<int>(u.nodes.size());
      u.nodes.push_back(n.get());
    }
  const size_t m = u.nodes.size();
  // Last position reading each node (itself when nothing later does).
  std::vector<int> last(m);
  for (size_t i = 0; i < m; ++i) {
    last[i] = static_cast<int>(i);
    for (const Tensor& in : u.nodes[i]->inputs)
      if (auto it = pos.find(in.node()); it != pos.end())
        last[static_cast<size_t>(it->second)] = static_cast<int>(i);
  }
  // Sweep: the nodes whose outputs are still to be read; a cut where one remains.
  std::vector<std::vector<int>> dies(m);
  std::unordered_set<int> live;
  u.unit_of.assign(m, 0);
  int unit = 0;
  const Node* prev_cut = nullptr;
  for (size_t i = 0; i < m; ++i) {
    u.unit_of[i] = unit;
    if (last[i] > static_cast<int>(i)) {
      live.insert(static_cast<int>(i));
      dies[static_cast<size_t>(last[i])].push_back(static_cast<int>(i));
    }
    for (int d : dies[i]) live.erase(d);
    if (i + 1 < m && live.size() == 1) {
      Node* c = u.nodes[static_cast<size_t>(*live.begin())];
      if (c != prev_cut) {
        u.cut.push_back(c);
        prev_cut = c;
        ++unit;
      }
    }
  }
  return u;
}

ForwardReplay::ForwardReplay(const std::vector<std::shared_ptr<Node>>& topo,
                             const RecomputePolicy& policy,
                             const std::vector<std::shared_ptr<Node>>& also) {
  if (policy.mode == RecomputeMode::none) return;
  const ForwardUnits u = forward_units(topo);
  if (policy.mode == RecomputeMode::selective)
    replay_ = selective_replays(u);
  else
    replay_ = segment_replays(u, policy);
  // A node something outside the graph still holds (BatchNorm's batch statistics, read by the
  // running-statistics update after the step) keeps all its outputs alive anyway: replaying it
  // would only hold them twice. References: topo's own, then forward consumers' inputs.
  std::unordered_map<const Node*, long> inside;
  for (const auto& n : topo) {
    ++inside[n.get()];
    for (const Tensor& t : n->inputs) ++inside[t.node()];
  }
  for (const auto& n : also) {
    ++inside[n.get()];
    for (const Tensor& t : n->inputs) ++inside[t.node()];
  }
  for (const auto& n : topo)
    if (replay_.count(n.get()) && n.use_count() > inside[n.get()]) replay_.erase(n.get());
}

Tensor ForwardReplay::value(const Tensor& t, const Tensor& trigger) {
  if (!t.defined() || !replay_.count(t.node())) return t;
  return Tensor(clone(t.node(), trigger), t.index());
}

std::shared_ptr<Node> ForwardReplay::clone(Node* n, const Tensor& trigger) {
  if (auto it = clones_.find(n); it != clones_.end()) return it->second;
  std::vector<Tensor> inputs;
  inputs.reserve(n->inputs.size() + 1);
  bool replayed_input = false;
  for (const Tensor& in : n->inputs) {
    if (replay_.count(in.node())) {
      inputs.emplace_back(clone(in.node(), trigger), in.index());
      replayed_input = true;
    } else {
      inputs.push_back(in);
    }
  }
  auto c = std::make_shared<Node>();
  if (replayed_input || !trigger.defined()) {
    c->prim = n->prim;  // ordered by its replayed inputs
  } else {
    // Only kept tensors and data in: the trigger keeps it from running in the forward.
    c->prim = std::make_shared<Replayed>(n->prim, inputs.size());
    inputs.push_back(trigger);
  }
  c->inputs = std::move(inputs);
  c->outs.resize(n->outs.size());
  for (size_t i = 0; i < n->outs.size(); ++i) {
    c->outs[i].shape = n->outs[i].shape;
    c->outs[i].dtype = n->outs[i].dtype;
    c->outs[i].tag = n->outs[i].tag;
  }
  c->device = n->device;
  c->pinned = n->pinned;
  clones_.emplace(n, c);
  return c;
}

}  // namespace hetrain
