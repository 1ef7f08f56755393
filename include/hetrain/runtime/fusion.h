// Fusion: a rewrite pass over the nodes an eval() is about to run. Each rule of a table matches
// a node and the producers it alone consumes (or a sibling node of the same input), and rewrites
// it in place into a fused primitive that computes the same values in fewer passes: a
// convolution's input gradient that adds a second convolution's, adds an addend or applies a
// relu mask as it writes; two convolutions of one input, or their two weight gradients, in one
// node whose second output the sibling then views; an elementwise node and the elementwise
// producers only it reads, as one chain; a matmul or convolution with the chain that alone
// reads its output as its epilogue. The absorbed producers are dropped from the
// run. Primitives carry no fusion hooks: a rule builds the fused
// primitive itself and checks there that it applies; the fused primitive's vjp is that of the
// composition it replaces.
//
//   runtime::set_fusion_enabled(false);  // or HETRAIN_FUSION=0: run every node as built
#pragma once

#include <map>
#include <memory>
#include <vector>

#include "hetrain/graph/tensor.h"

namespace hetrain::runtime {

/// Whether eval() runs the pass (default on; HETRAIN_FUSION=0 in the environment turns it off).
bool fusion_enabled();
/// Overrides the environment for this process (A/B comparisons, tests).
void set_fusion_enabled(bool on);

/// What the rules share during one pass.
struct FusionContext {
  /// Producers a rule folded into their consumer: dropped from the run.
  std::vector<std::shared_ptr<Node>> absorbed;
  /// The nodes seen so far, by the tensor they take as their first input: a sibling rule pairs
  /// a node with an earlier one of the same input.
  std::map<std::pair<const Node*, int>, std::vector<Node*>> by_first_input;
  /// Set when a rule gave a node an input that may come later in the order: the pass sorts it
  /// again.
  bool inputs_added = false;
};

/// One rule: apply(n, ctx) rewrites node n (and what it absorbs or pairs with) when it matches,
/// and says whether it did. The pass runs the rules of phase 0 over every node, then those of
/// phase 1 (a rule that wants what phase 0 built whole, such as a full elementwise chain).
struct FusionRule {
  const char* name;
  bool (*apply)(Node& n, FusionContext& ctx);
  int phase = 0;
};
inline constexpr int kFusionPhases = 2;
/// Most steps in one elementwise chain. A longer run of elementwise nodes becomes several chains
/// one after another: absorbing a chain copies its steps, so without a bound a run of n nodes
/// took O(n^2) to fuse (10 000 adds: 16 s instead of 5 ms), and each step of a chain holds a
/// block of scratch per thread (64 KiB of f32), which would no longer stay in cache.
inline constexpr size_t kMaxChainSteps = 16;
/// The rules, in the order the pass tries them on each node.
const std::vector<FusionRule>& fusion_rules();

/// Runs the rules over `order` (unevaluated nodes, inputs before consumers) and removes the
/// absorbed nodes from it; returns the number of nodes rewritten.
int fuse_nodes(std::vector<Node*>& order);
/// The same pass over the unevaluated graph that `targets` depend on, without running it: what
/// eval() would run, for inspection and tests. Returns the number of nodes rewritten.
int fuse(const std::vector<Tensor>& targets);

}  // namespace hetrain::runtime
