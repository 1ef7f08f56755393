#include "hetrain/runtime/fusion.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <tuple>
#include <unordered_set>

#include "graph/prims/conv.h"
#include "graph/prims/elementwise.h"
#include "graph/prims/fused.h"
#include "graph/prims/linalg.h"
#include "graph/prims/views.h"
#include "hetrain/graph/primitive.h"
#include "runtime/internal.h"

namespace hetrain::runtime {

namespace {

std::atomic<int> g_fusion{-1};  // -1: not yet read from the environment

/// t's producer when it is an unevaluated convolution input gradient that only this reference
/// holds: absorbing it into the consumer changes nothing that anyone else can see.
const Conv2dBackwardInput* sole_input_gradient(const Tensor& t) {
  const Node* p = t.node();
  if (!p || !p->prim || p->evaluated() || p->outs.size() != 1 || t.node_ptr().use_count() != 1)
    return nullptr;
  return dynamic_cast<const Conv2dBackwardInput*>(p->prim.get());
}

/// The fused convolution forms (an input gradient with an addend or a relu mask, two
/// convolutions of one input in one pass) are Hetrain's own f32 kernels: f32 and f64 only. A
/// 16-bit convolution stays plain, so it runs on oneDNN's 16-bit kernels (AMX, AVX512-BF16)
/// instead of being converted to f32 and back around the fused kernel.
bool fused_conv_dtype(Dtype dt) { return dt == Dtype::f32 || dt == Dtype::f64; }

template <class P>
bool is(const Node& n) {
  return n.prim && dynamic_cast<const P*>(n.prim.get()) != nullptr;
}

/// Rewrites n into prim over `inputs`, recording the producers of `gone` as absorbed.
void rewrite(Node& n, std::shared_ptr<Primitive> prim, std::vector<Tensor> inputs,
             std::initializer_list<const Tensor*> gone, FusionContext& ctx) {
  for (const Tensor* t : gone) ctx.absorbed.push_back(t->node_ptr());
  n.prim = std::move(prim);
  n.inputs = std::move(inputs);
}

std::vector<Tensor> concat(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  std::vector<Tensor> r = a;
  r.insert(r.end(), b.begin(), b.end());
  return r;
}

// The sum of two input gradients of convolutions of the same input, in one pass where one
// kernel computes both (one_pass_pair: a ResNet downsampling block's 3x3 and 1x1 shortcut):
// a's inputs, then b's (b's addend, if any, stays the last input).
std::shared_ptr<Primitive> paired(const Conv2dBackwardInput& a, const Conv2dBackwardInput& b) {
  if (a.addend() || a.second() || a.relu_mask() || b.second() || b.relu_mask() ||
      a.in_hw() != b.in_hw() || !one_pass_pair(a.window(), b.window(), a.in_hw()))
    return nullptr;
  return std::make_shared<Conv2dBackwardInput>(a.window(), a.in_hw(), b.addend(), b.window());
}

// add(a, b) of convolution input gradients (f32, f64: the addend form's kernels are exact
// there): both in one node (paired), else one of them adding the other as it writes. The
// newer gradient (b, as autodiff builds acc + g) is tried first. The addend form gives the same
// bits (one addition of the same two values); the paired form does not: its stride-2 kernel
// sums both convolutions' terms in one accumulation, so fusion on and off differ by rounding
// there (fashion-cnn's downsampling blocks: 30-step loss 1.37892866 on, 1.37873101 off, together
// with the weight-gradient pair below).
bool fuse_input_gradient_sum(Node& n, FusionContext& ctx) {
  if (!is<Binary<AddOp>>(n)) return false;
  const Tensor &a = n.inputs[0], &b = n.inputs[1];
  if (!fused_conv_dtype(a.dtype())) return false;
  const Conv2dBackwardInput *pa = sole_input_gradient(a), *pb = sole_input_gradient(b);
  if (pa && pb) {
    if (auto p = paired(*pb, *pa)) {
      rewrite(n, p, concat(b.node()->inputs, a.node()->inputs), {&a, &b}, ctx);
      return true;
    }
    if (auto p = paired(*pa, *pb)) {
      rewrite(n, p, concat(a.node()->inputs, b.node()->inputs), {&a, &b}, ctx);
      return true;
    }
  }
  // An addend joins the sum, which a mask must follow: not after one.
  for (auto [g, other, pg] : {std::tuple{&b, &a, pb}, std::tuple{&a, &b, pa}}) {
    if (!pg || pg->addend() || pg->relu_mask()) continue;
    auto p = std::make_shared<Conv2dBackwardInput>(pg->window(), pg->in_hw(), true, pg->second());
    std::vector<Tensor> in = g->node()->inputs;
    in.push_back(*other);
    rewrite(n, p, std::move(in), {g}, ctx);
    return true;
  }
  return false;
}

// relu_backward(m, g) of a convolution input gradient g: the gradient kernel zeroes dx where m
// is not > 0 as it writes (a ResNet block's output relu, whose mask is the block output).
bool fuse_input_gradient_relu_mask(Node& n, FusionContext& ctx) {
  if (!is<Binary<ReluGradOp>>(n)) return false;
  const Tensor &m = n.inputs[0], &g = n.inputs[1];
  if (!fused_conv_dtype(g.dtype())) return false;
  const Conv2dBackwardInput* pg = sole_input_gradient(g);
  if (!pg || pg->relu_mask()) return false;
  auto p = std::make_shared<Conv2dBackwardInput>(pg->window(), pg->in_hw(), pg->addend(),
                                                 pg->second(), true);
  std::vector<Tensor> in = g.node()->inputs;
  in.push_back(m);
  rewrite(n, p, std::move(in), {&g}, ctx);
  return true;
}

/// t's producer when it is an unevaluated node with one output that only this reference
/// holds, pinned as `consumer` is, and `kind` accepts it: it can run inside its consumer.
template <class Kind>
const Node* sole_producer(const Tensor& t, const Node& consumer, Kind kind) {
  const Node* p = t.node();
  if (!p || !p->prim || p->evaluated() || p->outs.size() != 1 || t.node_ptr().use_count() != 1 ||
      !kind(*p) || p->pinned != consumer.pinned || (p->pinned && p->device != consumer.device))
    return nullptr;
  return p;
}
/// An elementwise node (a chain included).
const Node* sole_elementwise_producer(const Tensor& t, const Node& consumer) {
  return sole_producer(t, consumer, [](const Node& p) { return p.prim->is_elementwise(); });
}

/// Builds a chain's inputs and steps, an input used twice taking one slot.
struct ChainBuilder {
  std::vector<Tensor> inputs;
  std::vector<ElementwiseChain::Step> steps;  // operands in the encoding of step()

  int input(const Tensor& t) {
    for (size_t i = 0; i < inputs.size(); ++i)
      if (inputs[i].node() == t.node() && inputs[i].index() == t.index())
        return static_cast<int>(i);
    inputs.push_back(t);
    return static_cast<int>(inputs.size()) - 1;
  }
  // Step operands are encoded as >= 0: an input, < 0: step -1 - k.
  int step(std::shared_ptr<Primitive> prim, std::vector<int> args, TensorMeta out) {
    steps.push_back({std::move(prim), std::move(args), std::move(out)});
    return -static_cast<int>(steps.size());
  }
  /// Adds node p's work (one step, or the steps of the chain it already is) over the given
  /// slots of its inputs; returns the slot of its result.
  int append(const Node& p, std::vector<int> slot) {
    if (const auto* c = dynamic_cast<const ElementwiseChain*>(p.prim.get())) {
      for (const auto& s : c->steps()) {
        std::vector<int> args;
        for (int a : s.args) args.push_back(slot[static_cast<size_t>(a)]);
        slot.push_back(step(s.prim, std::move(args), s.out));
      }
      return slot.back();
    }
    return step(p.prim, std::move(slot), {p.outs[0].shape, p.outs[0].dtype});
  }
  /// Adds producer p, its inputs becoming the chain's.
  int absorb(const Node& p) {
    std::vector<int> slot;
    for (const Tensor& t : p.inputs) slot.push_back(input(t));
    return append(p, std::move(slot));
  }
  /// The chain, with step results numbered after the inputs as ElementwiseChain wants.
  std::shared_ptr<Primitive> build() {
    const int n = static_cast<int>(inputs.size());
    for (auto& s : steps)
      for (int& a : s.args)
        if (a < 0) a = n + (-1 - a);
    return std::make_shared<ElementwiseChain>(n, std::move(steps));
  }
};

// An elementwise node and the elementwise producers only it consumes, as one chain (bias +
// activation, residual add, scale, casts, an activation's gradient times a mask): one pass over
// memory instead of one per node. Same bits: each step runs its own kernel on each block.
bool fuse_elementwise_chain(Node& n, FusionContext& ctx) {
  if (!n.prim->is_elementwise() || n.outs.size() != 1) return false;
  // Producers are taken in input order while the chain stays within kMaxChainSteps; one that
  // would take it past stays a node of its own, an input of this chain.
  std::vector<const Node*> producers;
  size_t steps = 1;  // n's own
  for (const Tensor& t : n.inputs) {
    const Node* p = sole_elementwise_producer(t, n);
    if (p) {
      const auto* c = dynamic_cast<const ElementwiseChain*>(p->prim.get());
      const size_t more = c ? c->steps().size() : 1;
      if (steps + more > kMaxChainSteps)
        p = nullptr;
      else
        steps += more;
    }
    producers.push_back(p);
  }
  if (std::all_of(producers.begin(), producers.end(), [](const Node* p) { return !p; }))
    return false;
  ChainBuilder b;
  std::vector<int> args;
  for (size_t i = 0; i < n.inputs.size(); ++i) {
    if (!producers[i]) {
      args.push_back(b.input(n.inputs[i]));
      continue;
    }
    // The same producer feeding two operands: absorbed once.
    bool again = false;
    for (size_t j = 0; j < i && !again; ++j)
      if (producers[j] == producers[i]) again = true;
    if (again) return false;  // rare (x * x of a fresh x); left to run as it is
    args.push_back(b.absorb(*producers[i]));
  }
  b.append(n, std::move(args));
  for (size_t i = 0; i < n.inputs.size(); ++i)
    if (producers[i]) ctx.absorbed.push_back(n.inputs[i].node_ptr());
  n.prim = b.build();
  n.inputs = b.inputs;
  return true;
}

/// A matmul or a (single-output) convolution.
const Node* sole_gemm_producer(const Tensor& t, const Node& consumer) {
  return sole_producer(t, consumer, [](const Node& p) { return is<Matmul>(p) || is<Conv2d>(p); });
}

// A matmul or convolution whose output only an elementwise node or chain reads (bias add,
// residual add, activation, cast, after the chain rule has grown the chain): the chain becomes
// the producer's epilogue, run over the producer's output as it is made, which never exists as
// a tensor of its own. Runs after the other rules (phase 1), so the chain is whole.
bool fuse_epilogue(Node& n, FusionContext& ctx) {
  if (!n.prim->is_elementwise() || n.outs.size() != 1) return false;
  // The product, or a reshape of it that only n reads (a batched matmul's rows reshaped back:
  // a free view of the contiguous result).
  size_t at = n.inputs.size();
  const Node* gemm = nullptr;
  std::optional<Shape> as_shape;
  for (size_t i = 0; i < n.inputs.size() && !gemm; ++i) {
    const Tensor& t = n.inputs[i];
    if ((gemm = sole_gemm_producer(t, n))) {
      at = i;
    } else if (t.node() && t.node()->prim && !t.node()->evaluated() && is<Reshape>(*t.node()) &&
               t.node_ptr().use_count() == 1 &&
               (gemm = sole_gemm_producer(t.node()->inputs[0], *t.node()))) {
      at = i;
      as_shape = t.shape();
    }
  }
  if (!gemm) return false;
  const Tensor produced = n.inputs[at];
  // The chain over (produced, the other inputs): produced first, as WithEpilogue wants.
  ChainBuilder b;
  b.input(produced);
  std::vector<int> slot;
  for (const Tensor& t : n.inputs) slot.push_back(b.input(t));
  b.append(n, std::move(slot));
  auto chain = std::static_pointer_cast<ElementwiseChain>(b.build());
  std::vector<Tensor> inputs = gemm->inputs;
  const int num_main = static_cast<int>(inputs.size());
  inputs.insert(inputs.end(), b.inputs.begin() + 1, b.inputs.end());
  auto fused = std::make_shared<WithEpilogue>(gemm->prim, num_main, std::move(chain), as_shape);
  if (as_shape) ctx.absorbed.push_back(produced.node()->inputs[0].node_ptr());
  ctx.absorbed.push_back(produced.node_ptr());
  n.prim = std::move(fused);
  n.inputs = std::move(inputs);
  return true;
}

/// Whether t's value depends on node `on` (through unevaluated nodes).
bool depends_on(const Tensor& t, const Node* on) {
  std::vector<const Node*> stack = {t.node()};
  std::unordered_set<const Node*> seen;
  while (!stack.empty()) {
    const Node* cur = stack.back();
    stack.pop_back();
    if (cur == on) return true;
    if (!cur->prim || cur->evaluated() || !seen.insert(cur).second) continue;
    for (const Tensor& in : cur->inputs) stack.push_back(in.node());
  }
  return false;
}

// Two convolutions of the same input x whose windows one kernel takes in one pass
// (one_pass_pair: a ResNet downsampling block's 3x3 and 1x1 shortcut), or their two weight
// gradients (inputs x and each output gradient). The node with the outer window becomes the
// pair, with the sibling's inputs after its own and the sibling's output as its second; the
// sibling becomes a view of that output, so whoever holds it sees the same value. The forward
// pair gives the bits the two convolutions give apart; the weight-gradient pair does not: the
// stride-2 direct kernel computes both, where apart each takes the kernel backward_weight_any
// picks, which sums in another order (a rounding difference HETRAIN_FUSION=0 shows).
template <class P>
bool pair_with_sibling(Node& n, FusionContext& ctx) {
  const auto* pn = dynamic_cast<const P*>(n.prim.get());
  if (!pn || pn->second() || n.inputs.size() != 2 || n.evaluated() ||
      !fused_conv_dtype(n.outs[0].dtype))
    return false;
  const Tensor& x = n.inputs[0];
  std::vector<Node*>& seen = ctx.by_first_input[{x.node(), x.index()}];
  for (Node* s : seen) {
    const auto* ps = s->prim ? dynamic_cast<const P*>(s->prim.get()) : nullptr;
    if (!ps || ps->second() || s->inputs.size() != 2 || s->evaluated() ||
        s->outs[0].dtype != n.outs[0].dtype)
      continue;
    const std::array<int64_t, 2> hw{x.shape()[2], x.shape()[3]};
    Node *outer = nullptr, *inner = nullptr;
    if (one_pass_pair(pn->window(), ps->window(), hw))
      outer = &n, inner = s;
    else if (one_pass_pair(ps->window(), pn->window(), hw))
      outer = s, inner = &n;
    else
      continue;
    // The pair takes the sibling's second input: not where that depends on the pair itself.
    if (depends_on(inner->inputs[1], outer)) continue;
    const auto& po = *static_cast<const P*>(outer->prim.get());
    const auto& pi = *static_cast<const P*>(inner->prim.get());
    outer->prim = std::make_shared<P>(po.window(), pi.window());
    outer->inputs.push_back(inner->inputs[1]);
    outer->outs.push_back(inner->outs[0]);
    outer->requires_grad = outer->requires_grad || inner->requires_grad;
    inner->prim = std::make_shared<Reshape>(inner->outs[0].shape);
    inner->inputs = {Tensor(outer->shared_from_this(), 1)};
    ctx.inputs_added = true;
    return true;
  }
  seen.push_back(&n);
  return false;
}

}  // namespace

bool fusion_enabled() {
  int v = g_fusion.load(std::memory_order_relaxed);
  if (v < 0) {
    const char* env = std::getenv("HETRAIN_FUSION");
    v = env && std::strcmp(env, "0") == 0 ? 0 : 1;
    g_fusion.store(v, std::memory_order_relaxed);
  }
  return v == 1;
}

void set_fusion_enabled(bool on) { g_fusion.store(on ? 1 : 0, std::memory_order_relaxed); }

const std::vector<FusionRule>& fusion_rules() {
  static const std::vector<FusionRule> rules = {
      {"conv input gradient sum", fuse_input_gradient_sum},
      {"conv input gradient relu mask", fuse_input_gradient_relu_mask},
      {"conv pair", pair_with_sibling<Conv2d>},
      {"conv weight gradient pair", pair_with_sibling<Conv2dBackwardWeight>},
      {"elementwise chain", fuse_elementwise_chain},
      {"matmul/conv epilogue", fuse_epilogue, 1},
  };
  return rules;
}

namespace {

/// order again with every node after its inputs, keeping the given sequence otherwise.
void sort_inputs_first(std::vector<Node*>& order) {
  std::unordered_set<const Node*> pending(order.begin(), order.end());
  std::vector<Node*> sorted;
  sorted.reserve(order.size());
  std::vector<std::pair<Node*, size_t>> stack;
  for (Node* root : order) {
    if (!pending.erase(root)) continue;
    stack.emplace_back(root, 0);
    while (!stack.empty()) {
      auto& [cur, i] = stack.back();
      if (i < cur->inputs.size()) {
        Node* in = cur->inputs[i++].node();
        if (pending.erase(in)) stack.emplace_back(in, 0);
      } else {
        sorted.push_back(cur);
        stack.pop_back();
      }
    }
  }
  order = std::move(sorted);
}

}  // namespace

int fuse_nodes(std::vector<Node*>& order) {
  FusionContext ctx;
  int rewritten = 0;
  // Inputs come first, so a node's producers have had their rules before it has its own; a
  // phase's rules see the graph as the earlier phases left it.
  for (int phase = 0; phase < kFusionPhases; ++phase) {
    std::unordered_set<const Node*> gone;
    for (const auto& p : ctx.absorbed) gone.insert(p.get());
    for (Node* n : order) {
      if (!n->prim || gone.count(n)) continue;
      for (const FusionRule& r : fusion_rules())
        if (r.phase == phase && r.apply(*n, ctx)) {
          ++rewritten;
          break;
        }
    }
    // What a rule absorbed is gone: it no longer holds its inputs, so a later phase sees the
    // fused node as their only reader.
    for (const auto& p : ctx.absorbed) p->inputs.clear();
  }
  if (!ctx.absorbed.empty()) {
    std::unordered_set<const Node*> gone;
    for (const auto& p : ctx.absorbed) gone.insert(p.get());
    order.erase(std::remove_if(order.begin(), order.end(),
                               [&](const Node* n) { return gone.count(n) != 0; }),
                order.end());
  }
  if (ctx.inputs_added) sort_inputs_first(order);
  return rewritten;
}

int fuse(const std::vector<Tensor>& targets) {
  // The order eval() would build.
  std::vector<Node*> order;
  std::vector<std::pair<Node*, size_t>> stack;
  bool any_pinned = false;
  OrderIndex index;
  collect_order(targets, index, order, stack, &any_pinned);
  return fuse_nodes(order);
}

}  // namespace hetrain::runtime
