// Activation checkpointing as a rewrite of the gradient graph: backward() reads each forward
// tensor either as computed by the forward (kept) or from a replay of the forward nodes that
// made it, built from kept tensors and run only once the backward has reached them. The policy
// (which tensors are kept) is a RecomputeMode over the graph's own structure and costs; no
// module declares segments.
//
//   RecomputeScope rc({.mode = RecomputeMode::full});
//   loss.backward();   // keeps the segment inputs; replays each segment before its backward
//
// A replayed node runs the same primitive on the same inputs, so it gives the same bits:
// random draws are fixed when a node is built (a dropout mask's generator seed and offset
// live in its primitive), and nodes outside the gradient graph (BatchNorm's running
// statistics) are never replayed. Losses, gradients and checkpoints are bitwise those of
// RecomputeMode::none.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "hetrain/graph/tensor.h"

namespace hetrain {

enum class RecomputeMode : uint8_t {
  none,       // keep every tensor the backward reads
  selective,  // replay the cheap-to-recompute nodes (low FLOPs per output byte) next to kept
              // costly ones: elementwise, dropout, norms, activations; keep matmul, conv,
              // attention outputs
  full,       // keep only segment inputs; replay every segment but the last
  automatic,  // segments chosen to fit a memory budget at the least replayed work
};
/// "none", "selective", "full" or "auto"; throws naming the value and `what` (a flag or key).
RecomputeMode parse_recompute(const std::string& s, const std::string& what);
const char* recompute_name(RecomputeMode m);

/// Which forward tensors a backward keeps, chosen per graph.
struct RecomputePolicy {
  RecomputeMode mode = RecomputeMode::none;
  /// full and automatic: the units (runs of nodes between cut points, forward_units) that are
  /// replayed; empty under full means every unit but the last. Set by the planner for auto.
  std::vector<int> replayed_units;
  /// automatic: where a segment of several units ends: its last unit's index (the cut after
  /// it is kept). Units of one segment keep no tensor between them.
  std::vector<int> segment_ends;
  bool explicit_units = false;  // replayed_units/segment_ends given (auto's plan)
};

/// Sets the policy backward() uses on this thread; restored on scope exit.
class RecomputeScope {
 public:
  explicit RecomputeScope(RecomputePolicy p);
  ~RecomputeScope();
  RecomputeScope(const RecomputeScope&) = delete;
  RecomputeScope& operator=(const RecomputeScope&) = delete;
  static const RecomputePolicy& current();

 private:
  RecomputePolicy prev_;
};

/// The unevaluated forward nodes an output depends on, in topological order, cut into units
/// at the points where a single tensor (not counting those made from evaluated data alone)
/// carries everything later nodes read: a transformer's residual stream between and inside
/// blocks, a ResNet's block outputs.
struct ForwardUnits {
  std::vector<Node*> nodes;  // topological order
  std::vector<int> unit_of;  // per node
  std::vector<Node*> cut;    // per unit but the last: the node whose output crosses its end
  int units() const { return static_cast<int>(cut.size()) + 1; }
};
ForwardUnits forward_units(const std::vector<std::shared_ptr<Node>>& topo);

/// The backward's view of the forward under a policy: value(t, trigger) is t where t is kept,
/// else a replayed copy that runs after `trigger` (the cotangent that reaches t's consumer).
class ForwardReplay {
 public:
  /// `also`: other nodes evaluated with the backward (their reads of the forward are not
  /// "held outside the graph").
  ForwardReplay(const std::vector<std::shared_ptr<Node>>& topo, const RecomputePolicy& policy,
                const std::vector<std::shared_ptr<Node>>& also = {});
  bool active() const { return !replay_.empty(); }
  Tensor value(const Tensor& t, const Tensor& trigger);
  /// Nodes replayed so far (clones made).
  size_t replayed() const { return clones_.size(); }

 private:
  std::shared_ptr<Node> clone(Node* n, const Tensor& trigger);
  std::unordered_set<const Node*> replay_;  // forward nodes read through a replay
  std::unordered_map<const Node*, std::shared_ptr<Node>> clones_;
};

}  // namespace hetrain
