// Memory and time model against published worked examples.
#include <gtest/gtest.h>

#include <cmath>

#include "hetrain/base/error.h"
#include "hetrain/planning/plan.h"

using namespace hetrain;
using namespace hetrain::planning;

namespace {
double states(const ModelStates& m) { return m.weights + m.gradients + m.optimizer; }

const Catalog& catalog() {
  static Catalog c = Catalog::load(std::string(HETRAIN_SOURCE_DIR) + "/data/hardware.json");
  return c;
}

Job gpt3_job() {
  Job j;
  j.model = preset("gpt3-175b");
  j.tokens = 300e9;
  j.global_batch = 1536;
  return j;
}
}  // namespace

TEST(PlanMemory, ZeroPaperWorkedExample) {
  // Rajbhandari et al. 2020 (ZeRO), Figure 1: 7.5B parameters, Nd = 64, K = 12.
  double P = 7.5e9;
  EXPECT_DOUBLE_EQ(states(model_state_bytes(P, 64, 0, Offload::none, Precision::bf16)), 120e9);
  EXPECT_NEAR(states(model_state_bytes(P, 64, 1, Offload::none, Precision::bf16)) / 1e9, 31.4,
              0.05);
  EXPECT_NEAR(states(model_state_bytes(P, 64, 2, Offload::none, Precision::bf16)) / 1e9, 16.6,
              0.05);
  EXPECT_NEAR(states(model_state_bytes(P, 64, 3, Offload::none, Precision::bf16)) / 1e9, 1.9, 0.05);
}

TEST(PlanMemory, OffloadMovesOptimizerToHost) {
  // ZeRO-Offload: 16-bit weights stay on the GPU; optimizer states and fp32 gradients
  // (K + 4 = 16 bytes per parameter of the shard) go to host memory.
  ModelStates m = model_state_bytes(10e9, 1, 1, Offload::optimizer, Precision::bf16);
  EXPECT_DOUBLE_EQ(m.optimizer, 0);
  EXPECT_DOUBLE_EQ(m.weights, 20e9);
  EXPECT_DOUBLE_EQ(m.host, 160e9);
}

TEST(PlanMemory, PlanBreakdownAddsUp) {
  Job j;
  j.model = preset("llama-7b");
  j.tokens = 1e12;
  j.global_batch = 512;
  Strategy s;
  s.zero = 3;
  s.micro_batch = 2;
  Plan p = evaluate(j, catalog().get("a100-80gb-sxm"), 64, s);
  const auto& m = p.memory;
  EXPECT_DOUBLE_EQ(
      m.total, m.weights + m.gradients + m.optimizer + m.activations + m.temporary + m.reserved);
  EXPECT_NEAR(m.weights, 2.0 * 6'738'415'616 / 64, 1);
  EXPECT_TRUE(p.fits);
  EXPECT_GT(p.mfu, 0.2);
  EXPECT_LT(p.mfu, 0.8);
}

TEST(PlanComm, RingAllReduceIsAlphaBeta) {
  double n = 1e9, B = 100e9;
  EXPECT_DOUBLE_EQ(ring_allreduce_time(n, 8, B, 0), 2.0 * 7 / 8 * n / B);
  EXPECT_DOUBLE_EQ(ring_allreduce_time(n, 8, B, 1e-5), 2.0 * 7 / 8 * n / B + 2 * 7 * 1e-5);
  EXPECT_DOUBLE_EQ(reduce_scatter_time(n, 8, B, 0), 7.0 / 8 * n / B);
  // Small messages: the tree's log(p) latency wins over the ring's p.
  EXPECT_LT(allreduce_time(1e3, 1024, B, 1e-5), ring_allreduce_time(1e3, 1024, B, 1e-5));
  EXPECT_EQ(allreduce_time(1e9, 1, B, 1e-5), 0);
}

TEST(PlanComm, Zero3MovesOneAndAHalfTimesDataParallel) {
  Job j;
  j.model = preset("gpt2-1.5b");
  j.tokens = 1e9;
  j.global_batch = 8;  // one micro-batch per replica
  Strategy s;
  Plan dp = evaluate(j, catalog().get("a100-80gb-sxm"), 8, s);
  s.zero = 3;
  Plan z3 = evaluate(j, catalog().get("a100-80gb-sxm"), 8, s);
  EXPECT_NEAR(z3.time.dp_comm / dp.time.dp_comm, 1.5, 1e-9);
}

TEST(PlanTime, GemmRoofline) {
  double peak = 312e12, bw = 2039e9;
  // A large square GEMM is compute bound at the efficiency.
  EXPECT_DOUBLE_EQ(gemm_time(8192, 8192, 8192, peak, 0.8, bw, 2),
                   2.0 * 8192 * 8192 * 8192 / (peak * 0.8));
  // A thin one (k = 16) is memory bound.
  double m = 8192, n = 8192, k = 16;
  EXPECT_DOUBLE_EQ(gemm_time(m, n, k, peak, 0.8, bw, 2), 2 * (m * k + k * n + m * n) / (bw * 0.8));
  // Tile quantisation: 129 rows cost as much as 256.
  EXPECT_DOUBLE_EQ(gemm_time(129, 8192, 8192, peak, 0.8, bw, 2),
                   gemm_time(256, 8192, 8192, peak, 0.8, bw, 2));
}

TEST(PlanTime, MegatronEndToEndEstimate) {
  // Narayanan et al. 2021, section 5.1: GPT-3 175B on 300B tokens with 1024 A100 at
  // 140 TFLOP/s each takes about 34 days (T = 8TP/(nX), full recompute). The published
  // figure is end to end: --achieved-tflops is the same quantity, so nothing is added.
  Job j = gpt3_job();
  j.achieved_tflops = 140;
  Strategy s;
  s.tp = 8, s.pp = 16, s.recompute = Recompute::full;
  Plan p = evaluate(j, catalog().get("a100-80gb-sxm"), 1024, s);
  double paper = 8 * 300e9 * 174.6e9 / (1024 * 140e12) / 86400;
  EXPECT_NEAR(paper, 33.9, 0.2);
  // The step is exactly the step's FLOPs over 1024 x 140 TFLOP/s ...
  EXPECT_NEAR(p.time.step, p.flops_per_step / (1024 * 140e12), 1e-9 * p.time.step);
  EXPECT_NEAR(p.achieved_tflops_per_gpu, 140, 1e-9);
  // ... and the days are the paper's, plus what 8TP omits (attention scores and logits, +2.7%).
  EXPECT_GT(p.train_days / paper, 1.0);
  EXPECT_LT(p.train_days / paper, 1.04);
  EXPECT_EQ(p.time.tp_comm + p.time.bubble + p.time.dp_exposed + p.time.optimizer, 0);
}

TEST(PlanTime, KernelTflopsAddsCommunicationAndBubble) {
  // --kernel-tflops replaces the compute rate only: the pipeline bubble and tensor-parallel
  // communication come on top, so the same 140 takes longer than the end-to-end figure.
  Job j = gpt3_job();
  j.kernel_tflops = 140;
  Strategy s;
  s.tp = 8, s.pp = 16, s.recompute = Recompute::full;
  Plan p = evaluate(j, catalog().get("a100-80gb-sxm"), 1024, s);
  double compute_days = p.steps * p.time.compute / 86400;
  double paper = 8 * 300e9 * 174.6e9 / (1024 * 140e12) / 86400;
  EXPECT_NEAR(compute_days / paper, 1.0, 0.05);
  EXPECT_NEAR(p.compute_tflops_per_gpu, 140, 1e-6);
  EXPECT_GT(p.time.bubble, 0);
  EXPECT_GT(p.time.tp_comm, 0);
  EXPECT_GT(p.train_days, 1.1 * compute_days);
}

TEST(PlanTime, InterleavedScheduleDividesTheBubble) {
  // Narayanan et al. 2021, section 2.2.2: with v chunks of layers per device the fill and
  // drain take (p - 1) / v micro-batch times instead of p - 1; each chunk sends its own
  // activations and gradients, so the point-to-point traffic is v times the 1F1B's; the first
  // stage keeps (1 + (p - 1) / (p v)) times the 1F1B's activations (Korthikanti et al. 2022).
  Job j = gpt3_job();
  Strategy s;
  s.tp = 8, s.pp = 16, s.recompute = Recompute::full;
  const Hardware& hw = catalog().get("a100-80gb-sxm");
  Plan one = evaluate(j, hw, 1024, s);
  s.virtual_stages = 4;
  Plan four = evaluate(j, hw, 1024, s);
  const double mbs = static_cast<double>(one.micro_batches);
  ASSERT_EQ(four.micro_batches, one.micro_batches);
  EXPECT_DOUBLE_EQ(four.time.compute, one.time.compute);
  EXPECT_NEAR(four.time.pp_comm, 4 * one.time.pp_comm, 1e-12 * one.time.pp_comm);
  const double t_mb = (four.time.compute + four.time.tp_comm + four.time.pp_comm) / mbs;
  EXPECT_NEAR(four.time.bubble, 15.0 / 4 * t_mb, 1e-9 * t_mb);
  const double t_mb1 = (one.time.compute + one.time.tp_comm + one.time.pp_comm) / mbs;
  EXPECT_NEAR(one.time.bubble, 15.0 * t_mb1, 1e-9 * t_mb1);
  EXPECT_LT(four.time.step, one.time.step);
  // The embedding's dropout mask is outside the factor (first stage: seq x micro-batch x hidden /
  // tp bytes).
  const double extra = 2048.0 * 12288 / 8;  // one byte per element
  EXPECT_NEAR((four.memory.activations - extra) / (one.memory.activations - extra),
              1 + 15.0 / (16 * 4), 1e-9);
  // A chunk needs a layer and a pipeline: the checks name the flag.
  s.virtual_stages = 7;  // 16 x 7 = 112 > 96 layers
  EXPECT_THROW(evaluate(j, hw, 1024, s), Error);
  s.pp = 1, s.virtual_stages = 2;
  EXPECT_THROW(evaluate(j, hw, 1024, s), Error);
}

TEST(PlanTime, GradientsAllReducedAfterTheBackwardAreAllExposed) {
  // Megatron-LM 2019's local DDP all-reduced every gradient after the backward: the whole
  // data-parallel time is on the step, where the overlapped all-reduce hides all but what
  // outlasts the last backward and the last bucket.
  Job j;
  j.model = gpt_model(72, 3072, 32, 1024, 51200);
  j.global_batch = 512;
  j.tokens = 512.0 * 1024;
  j.precision = Precision::fp16;
  j.fused_attention = false;
  Strategy s;
  s.tp = 8, s.recompute = Recompute::full, s.micro_batch = 8;
  const Hardware& hw = catalog().get("v100-sxm2-32gb");
  const Plan overlapped = evaluate(j, hw, 512, s);
  s.overlap_dp = false;
  const Plan after = evaluate(j, hw, 512, s);
  ASSERT_GT(overlapped.time.dp_comm, 0);
  EXPECT_DOUBLE_EQ(after.time.dp_comm, overlapped.time.dp_comm);
  EXPECT_LT(overlapped.time.dp_exposed, overlapped.time.dp_comm);
  EXPECT_DOUBLE_EQ(after.time.dp_exposed, after.time.dp_comm);
  // Only the exposed part moves, and the end-to-end overhead scales with the step.
  const double k = 1 + hw.efficiency.step_overhead;
  EXPECT_NEAR(after.time.step - overlapped.time.step,
              k * (after.time.dp_comm - overlapped.time.dp_exposed), 1e-9 * after.time.step);
  EXPECT_NE(after.strategy.describe().find("no-dp-overlap"), std::string::npos);
  // Without data parallelism there is nothing to overlap.
  s.micro_batch = 1;
  j.global_batch = 8;
  const Plan one = evaluate(j, hw, 8, s);
  s.overlap_dp = true;
  EXPECT_DOUBLE_EQ(evaluate(j, hw, 8, s).time.step, one.time.step);
}

TEST(PlanTime, RecomputingSomeLayersInterpolatesMemoryAndTime) {
  // Full recompute of k of a device's L layers (Megatron-LM's --recompute-num-layers): the
  // recomputed forward is k/L of full recompute's, two tensor-parallel all-reduces per
  // recomputed layer, and the activations are k layers' full-recompute bytes plus L - k layers'
  // kept bytes.
  Job j = gpt3_job();
  const Hardware& hw = catalog().get("a100-80gb-sxm");
  Strategy s;
  s.tp = 8, s.pp = 8, s.recompute = Recompute::full;  // 96 / 8 = 12 layers per device
  Plan all = evaluate(j, hw, 1024, s);
  s.recompute_layers = 3;
  Plan some = evaluate(j, hw, 1024, s);
  s.recompute_layers = 0, s.recompute = Recompute::selective;
  Plan none = evaluate(j, hw, 1024, s);  // with a fused kernel, what no recompute keeps
  EXPECT_NEAR(some.time.recompute, all.time.recompute / 4, 1e-9 * all.time.recompute);
  const double tp_mb_all = all.time.tp_comm, tp_mb_none = none.time.tp_comm;
  EXPECT_NEAR(some.time.tp_comm, tp_mb_none + (tp_mb_all - tp_mb_none) / 4, 1e-9 * tp_mb_all);
  const double share = 0.25;
  EXPECT_NEAR(some.memory.activations - all.memory.activations,
              (1 - share) * (none.memory.activations - all.memory.activations),
              1e-6 * none.memory.activations);
  EXPECT_NEAR(some.flops_per_step - none.model_flops_per_step,
              share * (all.flops_per_step - all.model_flops_per_step), 1e-9 * all.flops_per_step);
  // Not fewer than the layers, and only with full recompute.
  s.recompute = Recompute::full, s.recompute_layers = 12;
  EXPECT_THROW(evaluate(j, hw, 1024, s), Error);
  s.recompute = Recompute::selective, s.recompute_layers = 3;
  EXPECT_THROW(evaluate(j, hw, 1024, s), Error);
}

TEST(PlanSearch, RecomputesTheFewestLayersThatFit) {
  // Full recompute with the layer count left open: the search keeps the fewest recomputed
  // layers that fit (one fewer does not), which is faster than recomputing all of them.
  Job j = gpt3_job();
  const Hardware& hw = catalog().get("a100-80gb-sxm");
  SearchOptions o;
  o.hardware = {"a100-80gb-sxm"};
  o.gpus = {1024};
  o.tp = 8, o.pp = 16, o.zero = 1, o.virtual_stages = 1, o.micro_batch = 8;
  o.offload = Offload::none, o.recompute = Recompute::full;
  SearchResult r = search(j, catalog(), o);
  ASSERT_FALSE(r.plans.empty());
  const Plan& best = r.plans.front();
  const int k = best.strategy.recompute_layers;
  ASSERT_GT(k, 0);
  ASSERT_LT(k, 6);  // 96 layers / 16 stages
  EXPECT_TRUE(best.fits);
  Strategy s = best.strategy;
  s.recompute_layers = 0;
  EXPECT_LT(best.train_days, evaluate(j, hw, 1024, s).train_days);
  s.recompute_layers = k - 1;
  if (k > 1) {
    EXPECT_FALSE(evaluate(j, hw, 1024, s).fits);
  } else {
    s.recompute = Recompute::selective, s.recompute_layers = 0;
    EXPECT_FALSE(evaluate(j, hw, 1024, s).fits);
  }
}

TEST(PlanSearch, InterleavingIsSearchedWithAPipeline) {
  // Left open, the virtual stages are searched with the other dimensions: with pp fixed at
  // 16 the best GPT-3 plan interleaves, and it is faster than the best plain 1F1B plan.
  Job j = gpt3_job();
  SearchOptions o;
  o.hardware = {"a100-80gb-sxm"};
  o.gpus = {1024};
  o.tp = 8, o.pp = 16;
  SearchResult open = search(j, catalog(), o);
  ASSERT_FALSE(open.plans.empty());
  o.virtual_stages = 1;
  SearchResult plain = search(j, catalog(), o);
  ASSERT_FALSE(plain.plans.empty());
  EXPECT_GT(open.plans.front().strategy.virtual_stages, 1);
  EXPECT_LT(open.plans.front().train_days, plain.plans.front().train_days);
}

TEST(PlanSearch, SoftwarePropertiesReachEveryCandidate) {
  // Sequence parallelism and the data-parallel overlap are the software's, not searched: every
  // plan of a search carries the ones given, and the interleaved variants keep them.
  Job j = gpt3_job();
  SearchOptions o;
  o.hardware = {"a100-80gb-sxm"};
  o.gpus = {1024};
  o.tp = 8, o.pp = 16, o.top = 5;
  o.sequence_parallel = false, o.overlap_dp = false;
  SearchResult r = search(j, catalog(), o);
  ASSERT_FALSE(r.plans.empty());
  for (const auto& ps : {r.plans, r.alternatives})
    for (const Plan& p : ps) {
      EXPECT_FALSE(p.strategy.sequence_parallel) << p.strategy.describe();
      EXPECT_FALSE(p.strategy.overlap_dp) << p.strategy.describe();
      EXPECT_DOUBLE_EQ(p.time.dp_exposed, p.time.dp_comm) << p.strategy.describe();
    }
}

TEST(PlanTime, InconsistentInputIsAnError) {
  Job j = gpt3_job();
  Strategy s;
  s.tp = 5;
  auto message = [&](int gpus, const Strategy& st, const std::string& hw) {
    try {
      evaluate(j, catalog().get(hw), gpus, st);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message(10, s, "h100-sxm").find("--tp 5 does not divide the 96 attention heads"),
            std::string::npos);
  s.tp = 8;
  EXPECT_NE(message(12, s, "h100-sxm").find("--gpus 12 is not divisible by tp x pp"),
            std::string::npos);
  s.tp = 1;
  s.offload = Offload::optimizer_params;
  EXPECT_NE(message(8, s, "h100-sxm").find("needs --zero 3"), std::string::npos);
  s.offload = Offload::none;
  EXPECT_NE(message(8, s, "v100-sxm2-32gb").find("no bf16 matmul rate"), std::string::npos);
  EXPECT_NE(message(1000, s, "h100-sxm").find("--global-batch 1536 is not divisible"),
            std::string::npos);
  EXPECT_THROW(catalog().get("h800"), Error);
}

TEST(PlanNumbers, ParseCount) {
  EXPECT_DOUBLE_EQ(parse_count("7B", "--x"), 7e9);
  EXPECT_DOUBLE_EQ(parse_count("1.4T", "--x"), 1.4e12);
  EXPECT_DOUBLE_EQ(parse_count("300e9", "--x"), 300e9);
  EXPECT_DOUBLE_EQ(parse_count("124M", "--x"), 124e6);
  EXPECT_DOUBLE_EQ(parse_count("8k", "--x"), 8e3);
  EXPECT_THROW(parse_count("seven", "--tokens"), Error);
  EXPECT_THROW(parse_count("7X", "--tokens"), Error);
}

TEST(PlanTime, MegatronTable1AchievedTflops) {
  // Narayanan et al. 2021, Table 1: GPT models (seq 2048, vocab 51200, full recompute) on
  // DGX A100 80GB nodes of Selene (8 x 200 Gb/s HDR InfiniBand per node = 25 GB/s per GPU),
  // achieved TFLOP/s per GPU. The planner, uncalibrated, with micro-batch 1.
  struct Row {
    double billions;
    int heads, hidden, layers, tp, pp, gpus, batch;
    double measured;
  };
  const Row rows[] = {{1.7, 24, 2304, 24, 1, 1, 32, 512, 137},
                      {3.6, 32, 3072, 30, 2, 1, 64, 512, 138},
                      {7.5, 32, 4096, 36, 4, 1, 128, 512, 142},
                      {18.4, 48, 6144, 40, 8, 1, 256, 1024, 135},
                      {39.1, 64, 8192, 48, 8, 2, 512, 1536, 138},
                      {76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140},
                      {145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148},
                      {310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155},
                      {529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163},
                      {1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163}};
  Hardware selene = catalog().get("a100-80gb-sxm");
  selene.network_gbs = 25;
  double sum = 0;
  for (const Row& r : rows) {
    Job j;
    j.model = gpt_model(r.layers, r.hidden, r.heads, 2048, 51200);
    j.tokens = 1e9;
    j.global_batch = r.batch;
    j.fused_attention = false;  // Megatron-LM 2021: the unfused attention core
    EXPECT_NEAR(j.model.params() / 1e9, r.billions, 0.05 * r.billions) << r.billions;
    Strategy s;
    s.tp = r.tp, s.pp = r.pp, s.recompute = Recompute::full;
    Plan p = evaluate(j, selene, r.gpus, s);
    double err = (p.achieved_tflops_per_gpu - r.measured) / r.measured;
    EXPECT_TRUE(p.fits) << r.billions;
    EXPECT_LT(std::abs(err), 0.25) << r.billions << "B: predicted " << p.achieved_tflops_per_gpu;
    sum += std::abs(err);
  }
  EXPECT_LT(sum / 10, 0.15);  // mean |error|; docs/PLANNING.md lists each row
}
