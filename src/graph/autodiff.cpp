#include "hetrain/graph/autodiff.h"

#include <algorithm>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "hetrain/base/error.h"
#include "hetrain/graph/autocast.h"
#include "hetrain/graph/ops.h"
#include "hetrain/graph/primitive.h"
#include "hetrain/graph/recompute.h"

namespace hetrain {

std::vector<std::shared_ptr<Node>> graph_order(const std::vector<Tensor>& roots) {
  std::vector<std::shared_ptr<Node>> order;
  std::unordered_set<Node*> seen;
  std::vector<std::pair<std::shared_ptr<Node>, size_t>> stack;
  for (const auto& r : roots) {
    if (!r.defined() || !seen.insert(r.node()).second) continue;
    stack.emplace_back(r.node_ptr(), 0);
    while (!stack.empty()) {
      auto& [cur, i] = stack.back();
      if (i < cur->inputs.size()) {
        const auto& in = cur->inputs[i++].node_ptr();
        if (seen.insert(in.get()).second) stack.emplace_back(in, 0);
      } else {
        order.push_back(cur);
        stack.pop_back();
      }
    }
  }
  return order;
}

namespace {

/// acc + g, or g where nothing was accumulated yet.
Tensor accumulate(const Tensor& acc, const Tensor& g) { return acc.defined() ? add(acc, g) : g; }

/// Reverse-mode sweep. relevant(n) says whether cotangents should flow into node n. Returns
/// the cotangent of every output slot reached. With a replay, each vjp reads the forward
/// values through it (activation checkpointing); cotangents still flow to the forward nodes.
std::unordered_map<Node*, std::vector<Tensor>> backprop(
    const std::vector<Tensor>& outputs, const std::vector<Tensor>& cotangents,
    const std::vector<std::shared_ptr<Node>>& order, const std::unordered_set<Node*>& relevant,
    ForwardReplay* replay = nullptr) {
  // Each gradient runs in the dtype its forward ran in: no autocast while building them.
  amp::Autocast no_autocast(amp::Precision::fp32);
  std::unordered_map<Node*, std::vector<Tensor>> cot;
  for (size_t i = 0; i < outputs.size(); ++i) {
    const Tensor& o = outputs[i];
    Tensor c = i < cotangents.size() ? cotangents[i] : Tensor();
    if (!c.defined()) {
      if (o.numel() != 1)
        fail("[grad] output of shape ", shape_str(o.shape()),
             " is not a scalar; pass a cotangent of the same shape");
      c = ones_like(o);
    } else if (c.shape() != o.shape()) {
      fail("[grad] cotangent shape ", shape_str(c.shape()), " differs from output shape ",
           shape_str(o.shape()));
    }
    auto& slots = cot[o.node()];
    slots.resize(o.node()->outs.size());
    slots[o.index()] = accumulate(slots[o.index()], cast(c, o.dtype()));
  }
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    Node* n = it->get();
    if (!n->prim) continue;
    auto found = cot.find(n);
    if (found == cot.end()) continue;
    std::vector<int> argnums;
    for (size_t i = 0; i < n->inputs.size(); ++i) {
      Node* in = n->inputs[i].node();
      if (relevant.count(in) && is_floating(n->inputs[i].dtype()))
        argnums.push_back(static_cast<int>(i));
    }
    if (argnums.empty()) continue;
    std::vector<Tensor> outs;
    for (size_t i = 0; i < n->outs.size(); ++i) outs.emplace_back(*it, static_cast<int>(i));
    std::vector<Tensor> cts = found->second;
    cts.resize(n->outs.size());
    const std::vector<Tensor>& primals = n->inputs;
    std::vector<Tensor> values = primals;
    if (replay && replay->active()) {
      // The forward values this vjp reads: kept, or replayed once the backward gets here.
      Tensor trigger;
      for (const Tensor& c : cts)
        if (c.defined() && !trigger.defined()) trigger = c;
      for (Tensor& v : values) v = replay->value(v, trigger);
      for (Tensor& o : outs) o = replay->value(o, trigger);
    }
    std::vector<Tensor> grads = n->prim->vjp(values, outs, cts, argnums);
    HT_ASSERT(grads.size() == argnums.size());
    for (size_t j = 0; j < argnums.size(); ++j) {
      const Tensor& in = primals[static_cast<size_t>(argnums[j])];
      if (!grads[j].defined()) continue;
      if (grads[j].shape() != in.shape())
        fail("[", n->prim->name(), "] internal: vjp gave shape ", shape_str(grads[j].shape()),
             " for input of shape ", shape_str(in.shape()));
      auto& slots = cot[in.node()];
      slots.resize(in.node()->outs.size());
      Tensor g = grads[j].dtype() == in.dtype() ? grads[j] : cast(grads[j], in.dtype());
      slots[in.index()] = accumulate(slots[in.index()], g);
    }
  }
  return cot;
}

}  // namespace

std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& wrt,
                         const std::vector<Tensor>& cotangents) {
  auto order = graph_order(outputs);
  std::unordered_set<Node*> targets;
  for (const auto& w : wrt) {
    if (!w.defined()) fail("[grad] a wrt tensor is undefined");
    targets.insert(w.node());
  }
  // Relevant: nodes that depend on some wrt node (cotangent must reach them).
  std::unordered_set<Node*> relevant;
  for (const auto& n : order) {
    bool r = targets.count(n.get()) > 0;
    for (const auto& t : n->inputs) r = r || relevant.count(t.node());
    if (r) relevant.insert(n.get());
  }
  auto cot = backprop(outputs, cotangents, order, relevant);
  std::vector<Tensor> result;
  for (const auto& w : wrt) {
    auto it = cot.find(w.node());
    Tensor g;
    if (it != cot.end() && static_cast<size_t>(w.index()) < it->second.size())
      g = it->second[w.index()];
    result.push_back(g.defined() ? g : zeros_like(w));
  }
  return result;
}

std::pair<Tensor, std::vector<Tensor>> value_and_grad(const TensorFn& f,
                                                      const std::vector<Tensor>& args) {
  // Fresh leaves that require grad, so evaluation inside f keeps the graph.
  std::vector<Tensor> leaves;
  for (const auto& a : args) {
    Tensor l = a.detach();
    if (is_floating(l.dtype())) l.requires_grad_(true);
    leaves.push_back(l);
  }
  Tensor value = f(leaves);
  return {value, grad({value}, leaves)};
}

namespace {
/// backward()'s graph: the gradient of each leaf that requires grad (not yet accumulated into
/// its .grad), under this thread's recompute policy. The forward order and cotangents it used
/// are gone when it returns, so the graph is held as backward() will hold it.
struct LeafGradients {
  std::vector<Node*> leaves;
  std::vector<Tensor> grads;
  std::vector<std::weak_ptr<Node>> forward;  // the nodes behind output
};

LeafGradients leaf_gradients(const Tensor& output, const Tensor& cotangent,
                             const std::vector<Tensor>& with) {
  if (!output.defined()) fail("[backward] undefined tensor");
  if (!output.requires_grad())
    fail(
        "[backward] the tensor does not require grad: no leaf it depends on was marked with "
        "requires_grad_()");
  auto order = graph_order({output});
  std::unordered_set<Node*> relevant;
  for (const auto& n : order) {
    if (n->requires_grad) relevant.insert(n.get());
  }
  // The gradient graph needs no graph of its own (no create_graph).
  std::unordered_map<Node*, std::vector<Tensor>> cot;
  {
    NoGradScope no_grad;
    // Activation checkpointing: the policy of this thread's RecomputeScope.
    // The nodes only `with` needs (the running statistics' updates) read the forward too.
    std::vector<std::shared_ptr<Node>> also;
    if (!with.empty()) {
      std::unordered_set<const Node*> in_order;
      for (const auto& n : order) in_order.insert(n.get());
      for (auto& n : graph_order(with))
        if (!in_order.count(n.get())) also.push_back(std::move(n));
    }
    ForwardReplay replay(order, RecomputeScope::current(), also);
    cot = backprop({output}, {cotangent}, order, relevant, &replay);
  }
  LeafGradients r;
  for (const auto& np : order) {
    Node* n = np.get();
    if (!n->leaf_requires_grad) continue;
    auto it = cot.find(n);
    if (it == cot.end() || !it->second[0].defined()) continue;
    r.leaves.push_back(n);
    r.grads.push_back(it->second[0]);
  }
  // Evaluated forward nodes forget their producers now: what the gradient graph needs it
  // references directly, so each activation is freed after its last backward use.
  for (const auto& n : order) {
    if (n->prim && n->evaluated()) {
      n->prim.reset();
      n->inputs.clear();
    }
  }
  // Nothing here may hold a node during the evaluation: the sweep's order would keep every
  // forward output, and the cotangent map every intermediate gradient, until it returns.
  cot.clear();
  r.forward.assign(order.begin(), order.end());
  return r;
}
}  // namespace

std::vector<Tensor> gradient_graph(const Tensor& output, const Tensor& cotangent,
                                   const std::vector<Tensor>& with) {
  LeafGradients lg = leaf_gradients(output, cotangent, with);
  std::vector<Tensor> targets{output};
  NoGradScope no_grad;
  for (size_t i = 0; i < lg.leaves.size(); ++i) {
    const Tensor& acc = lg.leaves[i]->grad;
    targets.push_back(acc.defined() ? add(acc, lg.grads[i]) : lg.grads[i]);
  }
  targets.insert(targets.end(), with.begin(), with.end());
  return targets;
}

void backward(const Tensor& output, const Tensor& cotangent) { backward(output, cotangent, {}); }

void backward(const Tensor& output, const Tensor& cotangent, const std::vector<Tensor>& with) {
  LeafGradients lg = leaf_gradients(output, cotangent, with);
  std::vector<Tensor> targets{output};
  std::vector<Node*>& leaf_nodes = lg.leaves;
  for (size_t i = 0; i < leaf_nodes.size(); ++i) {
    Node* n = leaf_nodes[i];
    NoGradScope no_grad;
    n->grad = n->grad.defined() ? add(n->grad, lg.grads[i]) : lg.grads[i];
    targets.push_back(n->grad);
  }
  lg.grads.clear();
  std::vector<std::weak_ptr<Node>> graph = std::move(lg.forward);
  targets.insert(targets.end(), with.begin(), with.end());
  eval(targets, /*release_graph=*/true);
  // Gradients are accounted as such; a gradient that aliases another buffer gets its own.
  for (Node* n : leaf_nodes) {
    Array& a = n->grad.node()->outs[n->grad.index()];
    if (a.buffer.use_count() == 1 && a.contiguous() && a.offset == 0) {
      a.buffer->retag(MemoryTag::gradients);
      a.tag = MemoryTag::gradients;
    } else {
      MemoryTagScope tag(MemoryTag::gradients);
      Tensor c = copy(n->grad);
      c.node()->outs[0].tag = MemoryTag::gradients;
      c.eval();
      n->grad = c.detach();
    }
  }
  // Free the graph: evaluated nodes forget their producers.
  for (const auto& w : graph) {
    std::shared_ptr<Node> n = w.lock();
    if (n && n->prim && n->evaluated()) {
      n->prim.reset();
      n->inputs.clear();
    }
  }
}

}  // namespace hetrain
