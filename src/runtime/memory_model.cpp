// The memory model: the executor's one-worker order and its free-at-last-use, replayed over the
// graph with byte counts instead of buffers.
#include "hetrain/runtime/memory_model.h"

#include <algorithm>
#include <unordered_map>

#include "hetrain/graph/primitive.h"
#include "hetrain/runtime/fusion.h"
#include "runtime/internal.h"

namespace hetrain::runtime {

namespace {

/// Counters of the replay: live bytes per tag and their peaks.
struct Counters {
  MemoryPrediction p;
  std::array<int64_t, kNumMemoryTags> cur{};
  int64_t total = 0;
  void add(MemoryTag tag, int64_t bytes) {
    const auto t = static_cast<size_t>(tag);
    cur[t] += bytes;
    total += bytes;
    p.peak[t] = std::max(p.peak[t], cur[t]);
    p.peak_total = std::max(p.peak_total, total);
  }
  /// A kernel runs: its outputs and scratch, `s.total` bytes, are alive at once at its height.
  void kernel(const KernelScratch& s) {
    constexpr auto w = static_cast<size_t>(MemoryTag::workspace);
    p.peak[w] = std::max(p.peak[w], cur[w] + s.workspace);
    p.peak_total = std::max(p.peak_total, total + s.total);
  }
};

/// Buffers and node lifetimes of one replay.
class Replay {
 public:
  /// `shadow`: references to evaluated data held by a graph that is not replayed (the original
  /// of a copy), not counted.
  Replay(const std::vector<Node*>& order, Counters& c,
         const std::unordered_map<const Node*, int>& shadow)
      : c_(c), shadow_(shadow) {
    for (Node* n : order) {
      in_graph_.emplace(n, true);
      for (const Tensor& t : n->inputs) refs(t.node());
    }
    for (Node* n : order) refs(n);
  }

  /// Node n runs: its kernel's outputs and scratch are allocated, the scratch freed again (a
  /// view's outputs alias its input's buffer), then, with the graph released, its references
  /// to its inputs go.
  void run(Node* n, bool release_graph) {
    std::vector<int>& bufs = buffers_[n];
    const bool view = n->prim->is_view();
    if (!view) c_.kernel(kernel_scratch(*n));
    for (const Array& o : n->outs) {
      if (view && !n->inputs.empty()) {
        const int b = buffer_of(n->inputs[0]);
        if (b >= 0) ++holders_[static_cast<size_t>(b)];
        bufs.push_back(b);
        continue;
      }
      const int64_t bytes = static_cast<int64_t>(std::max<size_t>(o.nbytes(), 1));
      bufs.push_back(static_cast<int>(bytes_.size()));
      bytes_.push_back(bytes);
      tags_.push_back(o.tag);
      holders_.push_back(1);
      c_.add(o.tag, bytes);
    }
    if (!n->requires_grad || release_graph) {
      released_.emplace(n, true);
      for (const Tensor& t : n->inputs) drop(t.node());
    }
  }

  /// Live per tag once the targets marked are detached: each keeps its own buffer (now a
  /// leaf's), and its node, which nothing else holds once the graph is released, lets go of
  /// the buffers it held.
  std::array<int64_t, kNumMemoryTags> detached(const std::vector<Tensor>& targets,
                                               const std::vector<char>& mask) const {
    std::array<int64_t, kNumMemoryTags> cur = c_.cur;
    std::vector<int> h = holders_;
    std::unordered_map<const Node*, bool> gone;
    for (size_t i = 0; i < targets.size() && i < mask.size(); ++i) {
      auto it = buffers_.find(targets[i].node());
      if (!mask[i] || it == buffers_.end()) continue;
      const int b = it->second[static_cast<size_t>(targets[i].index())];
      if (b >= 0) ++h[static_cast<size_t>(b)];
      gone.emplace(it->first, true);
    }
    for (const auto& [n, unused] : gone)
      for (int b : buffers_.at(n))
        if (b >= 0 && --h[static_cast<size_t>(b)] == 0)
          cur[static_cast<size_t>(tags_[static_cast<size_t>(b)])] -= bytes_[static_cast<size_t>(b)];
    return cur;
  }

 private:
  // Starts a node's count at its references now: consumers' inputs, handles outside the graph.
  void refs(Node* n) {
    if (refs_.count(n)) return;
    int r = static_cast<int>(n->weak_from_this().use_count());
    if (!in_graph_.count(n))
      if (auto it = shadow_.find(n); it != shadow_.end()) r -= it->second;
    refs_[n] = r;
  }
  int buffer_of(const Tensor& t) {
    auto it = buffers_.find(t.node());
    if (it == buffers_.end()) return -1;  // evaluated data: not the graph's to free
    return it->second[static_cast<size_t>(t.index())];
  }
  void drop(Node* n) {
    auto it = refs_.find(n);
    if (it == refs_.end() || --it->second > 0) return;
    // The node goes: its buffers lose a holder; an unreleased node lets go of its inputs.
    if (auto b = buffers_.find(n); b != buffers_.end()) {
      for (int id : b->second)
        if (id >= 0 && --holders_[static_cast<size_t>(id)] == 0)
          c_.add(tags_[static_cast<size_t>(id)], -bytes_[static_cast<size_t>(id)]);
    } else {
      // Evaluated data whose last holder was the graph.
      for (const Array& a : n->outs)
        if (a.buffer && a.buffer.use_count() == 1)
          c_.add(a.buffer->tag(), -static_cast<int64_t>(a.buffer->bytes()));
    }
    if (!released_.count(n) && !in_graph_.count(n))
      for (const Tensor& t : n->inputs) drop(t.node());
  }

  Counters& c_;
  const std::unordered_map<const Node*, int>& shadow_;
  std::unordered_map<const Node*, int> refs_;
  std::unordered_map<const Node*, std::vector<int>> buffers_;
  std::unordered_map<const Node*, bool> in_graph_, released_;
  std::vector<int64_t> bytes_;
  std::vector<MemoryTag> tags_;
  std::vector<int> holders_;
};

/// A copy of the unevaluated graph in order (inputs first) that the fusion pass may rewrite
/// without touching the graph that will run: the same primitives and output metadata, inputs
/// mapped to the copies, and each copy held as many times from outside as its original is, so
/// the pass's sole-consumer checks and the replay's reference counts see what eval() will.
struct GraphCopy {
  std::vector<std::shared_ptr<Node>> nodes;
  std::vector<std::shared_ptr<Node>> outside;  // the outside references
  std::vector<Node*> order;
  std::unordered_map<const Node*, Node*> copy_of;
  /// References the original graph holds to evaluated data (which both graphs share).
  std::unordered_map<const Node*, int> graph_refs;

  explicit GraphCopy(const std::vector<Node*>& original) {
    for (const Node* n : original)
      for (const Tensor& t : n->inputs) ++graph_refs[t.node()];
    for (const Node* n : original) {
      auto c = std::make_shared<Node>();
      c->prim = n->prim;
      for (const Tensor& t : n->inputs) {
        auto it = copy_of.find(t.node());
        c->inputs.push_back(
            it == copy_of.end() ? t : Tensor(it->second->shared_from_this(), t.index()));
      }
      c->outs.resize(n->outs.size());
      for (size_t i = 0; i < n->outs.size(); ++i) {
        c->outs[i].shape = n->outs[i].shape;
        c->outs[i].dtype = n->outs[i].dtype;
        c->outs[i].tag = n->outs[i].tag;
      }
      c->device = n->device;
      c->pinned = n->pinned;
      c->requires_grad = n->requires_grad;
      copy_of.emplace(n, c.get());
      order.push_back(c.get());
      nodes.push_back(c);
      const long held = n->weak_from_this().use_count() - graph_refs[n];
      for (long k = 0; k < held; ++k) outside.push_back(c);
    }
    // Only the graph and the outside references hold the copies from here.
    nodes.clear();
  }
};

}  // namespace

MemoryPrediction predict_eval_memory(const std::vector<Tensor>& targets, bool release_graph,
                                     const std::vector<std::vector<char>>& detach) {
  Counters c;
  const MemoryStats s = host_allocator().stats();
  c.p.start = c.p.peak = c.cur = s.current;
  c.total = c.p.start_total = c.p.peak_total = s.current_total;
  std::vector<Node*> order;
  std::vector<std::pair<Node*, size_t>> stack;
  bool any_pinned = false;
  OrderIndex index;
  collect_order(targets, index, order, stack, &any_pinned);
  GraphCopy copy(order);
  order = copy.order;
  // The rewrite eval() would make, on the copy.
  if (fusion_enabled()) fuse_nodes(order);
  const size_t n = order.size();
  c.p.nodes = static_cast<int64_t>(n);
  if (n > 0) {
    index.assign(order);
    TaskDeps deps;
    build_tasks(order, index, nullptr, deps);
    Replay replay(order, c, copy.graph_refs);
    // The executor on one worker: ready tasks last in, first out; a finished task's consumers
    // become ready in graph order.
    std::vector<int> ready;
    for (size_t i = 0; i < n; ++i)
      if (deps.pending[i] == 0) ready.push_back(static_cast<int>(i));
    while (!ready.empty()) {
      const int i = ready.back();
      ready.pop_back();
      replay.run(order[static_cast<size_t>(i)], release_graph);
      for (int k = deps.consumer_begin[static_cast<size_t>(i)];
           k < deps.consumer_begin[static_cast<size_t>(i) + 1]; ++k) {
        const int cons = deps.consumer_list[static_cast<size_t>(k)];
        if (--deps.pending[static_cast<size_t>(cons)] == 0) ready.push_back(cons);
      }
    }
    std::vector<Tensor> copies;  // the targets in the copy (evaluated ones as they are)
    for (const Tensor& t : targets) {
      auto it = copy.copy_of.find(t.node());
      copies.push_back(
          it == copy.copy_of.end() ? t : Tensor(it->second->shared_from_this(), t.index()));
    }
    for (const auto& mask : detach) c.p.detached.push_back(replay.detached(copies, mask));
  }
  c.p.end = c.cur;
  // Nothing ran: detaching frees nothing.
  while (c.p.detached.size() < detach.size()) c.p.detached.push_back(c.cur);
  return c.p;
}

}  // namespace hetrain::runtime
