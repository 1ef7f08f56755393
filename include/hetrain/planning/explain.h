// What a plan's step time is made of, and how it moves with the device count
// (`hetrain plan --explain`).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "hetrain/planning/plan.h"

namespace hetrain::planning {

struct StepTerm {
  std::string name;
  double seconds = 0;  // per optimizer step, on the critical path
};

struct PlanExplanation {
  /// The step's terms, largest first; they add up to the step time. Compute is split by kind
  /// (weight GEMMs and logits, the attention core, memory-bound elementwise work, fixed
  /// per-kernel costs); communication by kind (tensor-parallel, pipeline sends, exposed
  /// data-parallel/ZeRO); the pipeline bubble; the optimizer step; offload transfers.
  std::vector<StepTerm> terms;
  /// The same job on the next-smaller and next-larger valid device count: the same strategy
  /// where it is valid and fits there, else the nearest strategy that fits.
  std::optional<Plan> smaller, larger;
  std::string note;  // why a neighbour is missing
};

PlanExplanation explain_plan(const Job& job, const Hardware& hw, const Plan& plan);

}  // namespace hetrain::planning
