// A training step's memory, predicted from its graph before it runs, and the activation
// checkpointing plan that `--recompute auto` chooses with it.
//
//   Tensor loss = loss_of(model.forward(x), y);                 // built, not run
//   StepMemory m = predict_step_memory(loss, {}, shape);         // peak by tag, nothing runs
//   RecomputePlan p = plan_recompute(loss, 512 << 20, shape);    // fits 512 MiB, least replay
//
// The forward and backward run as one eval (graph/autodiff.h): the runtime's memory model
// (runtime/memory_model.h) replays the executor's order and frees over that graph. The
// optimizer's update follows it: new parameters and state are allocated before the old ones go
// (optim.cpp commit), and clipping allocates the scaled gradients first.
#pragma once

#include <array>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "hetrain/graph/recompute.h"
#include "hetrain/memory/allocator.h"
#include "hetrain/runtime/memory_model.h"

namespace hetrain::training {

/// What the step does besides its graph.
struct StepShape {
  int state_slots = 2;           // optimizer state tensors per parameter: adamw 2, sgd 1 or 0
  bool clip = false;             // gradient clipping (the scaled gradients are new buffers)
  bool state_allocated = false;  // the optimizer state already lives in the allocator
  std::vector<Tensor> with;      // evaluated with the backward (BatchNorm running statistics)
};

struct StepMemory {
  std::array<int64_t, kNumMemoryTags> start{};  // live before the step
  std::array<int64_t, kNumMemoryTags> peak{};   // highest per tag over the step
  int64_t start_total = 0, peak_total = 0;
  int64_t parameter_bytes = 0;         // of the parameters with gradients
  runtime::MemoryPrediction backward;  // the forward + backward eval alone
  int64_t at(MemoryTag t) const { return peak[static_cast<size_t>(t)]; }
};

/// Predicts the step of `loss` (forward + backward eval under policy, then the update) from the
/// allocator's counters now. Builds the gradient graph and throws it away: nothing runs.
StepMemory predict_step_memory(const Tensor& loss, const RecomputePolicy& policy,
                               const StepShape& shape);

/// The plan `--recompute auto` chose, and why.
struct RecomputePlan {
  RecomputePolicy policy;
  StepMemory memory;
  int units = 0;           // cut points + 1 (graph/recompute.h forward_units)
  int replayed_units = 0;  // units whose nodes are replayed
  int segments = 0;        // replayed segments (kept tensors between them)
  double replayed_flops = 0, forward_flops = 0;
  int64_t smallest_peak = 0;  // the least peak any plan reaches (the smallest feasible budget)
  std::string summary() const;
  /// What train prints on stderr for the choice under `budget` (0: none); with more than one
  /// thread also that the peak is the one-worker prediction.
  std::string announcement(int64_t budget) const;
};

/// auto: among plans that keep every unit, replay units in order of bytes saved per FLOP
/// replayed, or replay all in segments of L units (L = 1 .. units), the one whose predicted
/// peak total fits `budget` with the fewest FLOPs replayed; without a budget (0), the one with
/// the least peak. A budget no plan fits is refused, naming the smallest feasible budget.
RecomputePlan plan_recompute(const Tensor& loss, int64_t budget, const StepShape& shape);

}  // namespace hetrain::training

namespace hetrain::training {

struct TrainConfig;

/// One synthetic step predicted before it ran and measured by the host allocator (peaks from
/// the moment of the prediction: the forward and backward, the running statistics, the update).
struct StepMemoryCheck {
  StepMemory predicted;
  std::array<int64_t, kNumMemoryTags> measured_peak{};
  int64_t measured_peak_total = 0;
};
/// Runs `steps` steps of cfg on synthetic batches (its threads, recompute and budget), each
/// predicted before it runs. For tests and docs/PERFORMANCE.md.
std::vector<StepMemoryCheck> check_step_memory(const TrainConfig& cfg, int64_t steps);

/// `hetrain train --dry-run`: builds cfg's model and optimizer and a synthetic batch, predicts
/// one steady-state step (auto: plans it; a budget no plan fits throws) and, with `out`, prints
/// the peak by tag and the plan. Runs no kernel of the step.
StepMemory dry_run(const TrainConfig& cfg, std::FILE* out);

}  // namespace hetrain::training
