// `hetrain plan` on Hetrain's own presets against Hetrain's memory model: the planner's
// model-state terms equal the bytes the step's graph holds, and its activation term (Hetrain's
// engine layout, hetrain_activation_bytes) is within 5% of the activations peak the model
// predicts from the graph for gpt-mini, the step's total within 10% for every preset (fp32,
// one device, no recompute, the presets' own batch).
#include <gtest/gtest.h>

#include <cmath>

#include "hetrain/planning/plan.h"
#include "hetrain/training/memory_plan.h"
#include "hetrain/training/trainer.h"

namespace hetrain {
namespace {

const planning::Catalog& catalog() {
  static planning::Catalog c =
      planning::Catalog::load(std::string(HETRAIN_SOURCE_DIR) + "/data/hardware.json");
  return c;
}

class EngineMemory : public ::testing::TestWithParam<std::string> {};

TEST_P(EngineMemory, PlanTermsAgreeWithTheMemoryModel) {
  const std::string id = GetParam();
  training::TrainConfig c = training::preset_config(id);
  c.threads = 1;
  c.recompute = "none";
  const training::StepMemory m = training::dry_run(c, nullptr);

  planning::Job job;
  job.model = planning::preset(id);
  EXPECT_EQ(job.model.engine, planning::Engine::hetrain);
  job.precision = planning::Precision::fp32;
  job.global_batch = c.batch_size;
  job.tokens = 1e6;
  planning::Strategy s;
  s.micro_batch = c.batch_size;
  const planning::Plan p = planning::evaluate(job, catalog().all().front(), 1, s);
  const planning::MemoryBreakdown& mem = p.memory;

  // Model states: the same parameters (the planner's presets are Hetrain's models), 4 bytes
  // each for weights and gradients, AdamW's two fp32 slots.
  auto at = [](const std::array<int64_t, kNumMemoryTags>& a, MemoryTag t) {
    return static_cast<double>(a[static_cast<size_t>(t)]);
  };
  EXPECT_DOUBLE_EQ(mem.weights, at(m.start, MemoryTag::parameters)) << id;
  EXPECT_DOUBLE_EQ(mem.gradients, static_cast<double>(m.parameter_bytes)) << id;
  EXPECT_DOUBLE_EQ(mem.optimizer, at(m.start, MemoryTag::optimizer_state)) << id;

  // The step's total: the planner's terms (the gradients held whole, the activations at their
  // peak) against the model's peak over the step.
  const double total =
      mem.weights + mem.gradients + mem.optimizer + mem.activations + mem.temporary;
  const double want_total = static_cast<double>(m.peak_total);
  EXPECT_LE(std::fabs(total - want_total), 0.10 * want_total)
      << id << ": plan " << total << " bytes, memory model " << want_total;
  if (id == "gpt-mini") {
    // Activations dominate: the term itself, less the batch of token ids the model counts.
    const double want = at(m.peak, MemoryTag::activations) - at(m.start, MemoryTag::activations);
    EXPECT_LE(std::fabs(mem.activations - want), 0.05 * want)
        << id << ": plan " << mem.activations << " bytes, memory model " << want;
  }
}

// The step's peak under data parallelism: the three moments by hand for a model whose
// activations are small (the update decides) and one whose activations are large (the forward).
TEST(EngineStepPeak, LargestOfForwardBackwardAndUpdate) {
  const double psi = 1e6, W = 4 * psi, O = 8 * psi;
  // One rank: the single-process step (states + activations, or the update's new values).
  EXPECT_DOUBLE_EQ(planning::hetrain_step_peak_bytes(psi, 1, 0, 1e5), 2 * W + W + 2 * O);
  EXPECT_DOUBLE_EQ(planning::hetrain_step_peak_bytes(psi, 1, 3, 1e8), W + W + O + 1e8);
  // Stage 0 over 2 ranks, small activations: the update, 28 bytes a parameter.
  EXPECT_DOUBLE_EQ(planning::hetrain_step_peak_bytes(psi, 2, 0, 1e5), 28 * psi);
  // Stage 1 over 4 ranks: the backward's end, states + exchange buffer + gradient tensors.
  EXPECT_DOUBLE_EQ(planning::hetrain_step_peak_bytes(psi, 4, 1, 1e5), W + W + O / 4 + 2 * W);
  // Stage 2, large activations: the forward's end with the accumulation buffers and the first
  // bucket's exchange (1 MiB).
  EXPECT_DOUBLE_EQ(planning::hetrain_step_peak_bytes(psi, 2, 2, 1e8),
                   W + W / 2 + O / 2 + 1e8 + W + 1024.0 * 1024);
  // Stage 3: the shards, the gathered parameters (at most three 25 MiB buckets) and activations.
  EXPECT_DOUBLE_EQ(planning::hetrain_step_peak_bytes(psi, 4, 3, 1e8), (W + W + O) / 4 + W + 1e8);
  EXPECT_DOUBLE_EQ(planning::hetrain_step_peak_bytes(100 * psi, 4, 3, 1e10),
                   100 * (W + W + O) / 4 + 3 * 25.0 * 1024 * 1024 + 1e10);
}

// The state device's peak under offload: the optimizer state (and under optimizer+params the
// parameter shards) on the host, so the update adds nothing on the device.
TEST(EngineStepPeak, OffloadLeavesTheHostsStatesOut) {
  const double psi = 1e6, W = 4 * psi;
  // Stage 0 over 2 ranks, small activations: the backward's end (exchange buffer and gradient
  // tensors) instead of the update's 28 bytes a parameter.
  EXPECT_DOUBLE_EQ(planning::hetrain_step_peak_bytes(psi, 2, 0, 1e5, true), W + W + W + W);
  // Stage 3 with optimizer+params: the gradient shard, gathered parameters and activations.
  EXPECT_DOUBLE_EQ(planning::hetrain_step_peak_bytes(psi, 4, 3, 1e8, true, true), W / 4 + W + 1e8);
  EXPECT_DOUBLE_EQ(planning::hetrain_step_peak_bytes(psi, 4, 3, 1e8, true, false),
                   (W + W) / 4 + W + 1e8);
}

INSTANTIATE_TEST_SUITE_P(HetrainPresets, EngineMemory,
                         ::testing::Values("fashion-mlp", "fashion-cnn", "gpt-mini"),
                         [](const ::testing::TestParamInfo<std::string>& i) {
                           std::string n = i.param;
                           for (char& ch : n)
                             if (ch == '-') ch = '_';
                           return n;
                         });

}  // namespace
}  // namespace hetrain
