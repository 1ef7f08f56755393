// `hetrain plan --explain` for one plan: the terms of its step time and the neighbouring
// device counts.
#include "hetrain/planning/explain.h"

#include <algorithm>
#include <array>

#include "planning/internal.h"

namespace hetrain::planning {

namespace {

// The plan's compute time with only the listed parts of the time model switched on: the
// model is linear in its part scales, so switching all off leaves the fixed costs alone.
double compute_with(const Job& job, const Hardware& hw, const Plan& plan,
                    std::array<double, 4> mask) {
  Hardware h = hw;
  for (size_t k = 0; k < mask.size(); ++k) h.part_scale[k] *= mask[k];
  return detail::evaluate_unchecked(job, h, plan.gpus, plan.strategy).time.compute;
}

// The same job on `gpus` devices: the plan's strategy where it is valid and fits, else the
// nearest strategy that fits there.
std::optional<Plan> at_count(const Job& job, const Hardware& hw, const Plan& plan, int gpus) {
  if (detail::strategy_problem(job, hw, gpus, plan.strategy).empty()) {
    Plan p = detail::evaluate_unchecked(job, hw, gpus, plan.strategy);
    if (p.fits) return p;
  }
  return nearest_fitting(job, hw, gpus, plan.strategy);
}

// A device count the plan's strategy could use: whole nodes beyond one, a multiple of tp x pp.
bool usable_count(const Job& job, const Hardware& hw, const Plan& plan, int n) {
  const int tpp = plan.strategy.tp * plan.strategy.pp;
  if (n < 1 || n % tpp != 0 || job.global_batch % (n / tpp) != 0) return false;
  return n <= hw.gpus_per_node || n % hw.gpus_per_node == 0;
}

}  // namespace

PlanExplanation explain_plan(const Job& job, const Hardware& hw, const Plan& plan) {
  PlanExplanation ex;
  const TimeBreakdown& t = plan.time;
  auto add = [&](const std::string& name, double s) {
    if (s > 0) ex.terms.push_back({name, s});
  };
  if (job.achieved_tflops) {
    add("end to end at --achieved-tflops (everything inside)", t.step);
  } else if (job.kernel_tflops) {
    add("compute at --kernel-tflops", t.compute);
  } else {
    const double fixed = compute_with(job, hw, plan, {0, 0, 0, 0});
    const double gemm = compute_with(job, hw, plan, {1, 0, 0, 0}) - fixed;
    const double conv = compute_with(job, hw, plan, {0, 1, 0, 0}) - fixed;
    const double attn = compute_with(job, hw, plan, {0, 0, 1, 0}) - fixed;
    // The memory part takes the rest, so the terms add up to the compute time exactly.
    const double memory = t.compute - fixed - gemm - conv - attn;
    add("compute: weight GEMMs and logits", gemm);
    add("compute: convolutions", conv);
    add(job.fused_attention ? "compute: attention core (fused kernel)"
                            : "compute: attention core (unfused)",
        attn);
    add("compute: elementwise, norms, softmax (memory bound)", memory);
    add("compute: fixed per-layer kernel costs", fixed);
  }
  add("tensor-parallel communication", t.tp_comm);
  add("pipeline sends", t.pp_comm);
  add("pipeline bubble", t.bubble);
  add("data-parallel/ZeRO communication (exposed)", t.dp_exposed);
  add(plan.strategy.offload == Offload::none ? "optimizer step" : "optimizer step (CPU)",
      t.optimizer);
  add("offload transfers (exposed)", t.offload);
  add("end-to-end overhead (efficiency model)", t.overhead);
  std::stable_sort(ex.terms.begin(), ex.terms.end(),
                   [](const StepTerm& a, const StepTerm& b) { return a.seconds > b.seconds; });

  for (int n = plan.gpus - 1; n >= 1; --n)
    if (usable_count(job, hw, plan, n)) {
      ex.smaller = at_count(job, hw, plan, n);
      break;
    }
  const int limit = std::max(2 * plan.gpus, plan.gpus + hw.gpus_per_node);
  for (int n = plan.gpus + 1; n <= limit; ++n)
    if (usable_count(job, hw, plan, n)) {
      ex.larger = at_count(job, hw, plan, n);
      break;
    }
  if (!ex.smaller || !ex.larger)
    ex.note = "nothing fits there, or no count nearby divides the global batch";
  return ex;
}

}  // namespace hetrain::planning
