// Issue 27: published runs and the efficiency model's fit, --explain, the nearest fitting plan,
// and measured runs on hardware the catalog lacks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "hetrain/base/error.h"
#include "hetrain/planning/calibration.h"
#include "hetrain/planning/explain.h"
#include "hetrain/planning/validate.h"

using namespace hetrain;
using namespace hetrain::planning;
namespace fs = std::filesystem;

namespace {
Catalog catalog() { return Catalog::load(std::string(HETRAIN_SOURCE_DIR) + "/data/hardware.json"); }
}  // namespace

TEST(PlanValidate, PublishedRunsTableCoversScalesAndHardware) {
  const auto runs = load_published_runs(default_published_runs_path());
  ASSERT_GE(runs.size(), 15u);
  double lo = 1e30, hi = 0;
  std::set<std::string> hardware, splits;
  for (const auto& r : runs) {
    const double n = static_cast<double>(r.job.model.params());
    lo = std::min(lo, n), hi = std::max(hi, n);
    hardware.insert(r.hardware);
    splits.insert(r.split);
    EXPECT_FALSE(r.source.empty()) << r.id;
    EXPECT_GT(r.reported, 0) << r.id;
  }
  EXPECT_LT(lo, 200e6);
  EXPECT_GT(hi, 900e9);
  // V100, A100, H100 and TPU, as the issue asks.
  EXPECT_TRUE(hardware.count("v100-sxm2-32gb") && hardware.count("a100-80gb-sxm") &&
              hardware.count("h100-sxm") && hardware.count("tpu-v3"));
  EXPECT_EQ(splits.size(), 2u);
  // The model shapes are the published ones: Megatron-LM's 1T model and GPT-2 small.
  auto by_id = [&](const std::string& id) {
    auto it = std::find_if(runs.begin(), runs.end(), [&](const auto& r) { return r.id == id; });
    EXPECT_NE(it, runs.end()) << id;
    return *it;
  };
  EXPECT_NEAR(by_id("megatron-gpt-1008b").job.model.params() / 1e9, 1008, 10);
  EXPECT_EQ(by_id("llama-65b").job.model.params(), 65'285'660'672);  // as the llama-65b preset
  EXPECT_EQ(by_id("megatron-gpt-1.7b").split, "train");
  EXPECT_EQ(by_id("llama-65b").split, "held-out");
  // Llama 3's published interleaved schedule: its virtual stages are searched (not published).
  EXPECT_FALSE(by_id("llama3-405b-8192").virtual_stages.has_value());
  EXPECT_EQ(by_id("megatron-gpt-1008b").virtual_stages, 1);
  EXPECT_EQ(by_id("megatron2019-gpt-8.3b").job.model.params() / 100'000'000, 83);
  // Megatron-LM 2019's released code all-reduced the gradients after the backward.
  EXPECT_FALSE(by_id("megatron2019-gpt-8.3b").overlap_dp);
  EXPECT_TRUE(by_id("megatron-gpt-1008b").overlap_dp);
  // nanoGPT's "about 4 days" (README, 2023-01-31) was run by the code of 2023-01-27: the
  // unfused attention (flash attention came on 01-30), the unpadded vocabulary (padding to
  // 50304 came on 02-04); 12 x 1024 tokens per micro-batch, 5 per GPU on 8 GPUs, 600,000 steps.
  const PublishedRun nano = by_id("nanogpt-gpt2-124m");
  EXPECT_EQ(nano.job.model.tf.vocab, 50257);
  EXPECT_FALSE(nano.job.fused_attention);
  EXPECT_TRUE(nano.job.model.tf.bias);
  EXPECT_FALSE(nano.job.model.tf.dropout);
  EXPECT_EQ(nano.micro_batch, 12);
  EXPECT_EQ(nano.job.global_batch, 12 * 5 * 8);
  EXPECT_DOUBLE_EQ(nano.job.tokens, 12.0 * 1024 * 5 * 8 * 600'000);
}

TEST(PlanValidate, CatalogEfficiencyModelIsTheFitOnTheTrainRuns) {
  // The shipped figures come from the fit on the train split (rounded to 4 digits), not from
  // tuning on the held-out runs.
  const Catalog cat = catalog();
  const EfficiencyModel fit =
      fit_efficiency(load_published_runs(default_published_runs_path()), cat);
  const EfficiencyModel& m = cat.efficiency;
  auto near = [](double a, double b) { return std::abs(a - b) <= 1e-3 * std::abs(b) + 1e-6; };
  EXPECT_TRUE(near(m.gemm_half_size, fit.gemm_half_size)) << fit.gemm_half_size;
  EXPECT_TRUE(near(m.elementwise_fraction, fit.elementwise_fraction)) << fit.elementwise_fraction;
  EXPECT_TRUE(near(m.fused_attention, fit.fused_attention)) << fit.fused_attention;
  EXPECT_TRUE(near(m.kernel_overhead_us, fit.kernel_overhead_us)) << fit.kernel_overhead_us;
  EXPECT_TRUE(near(m.link_efficiency, fit.link_efficiency)) << fit.link_efficiency;
  EXPECT_TRUE(near(m.step_overhead, fit.step_overhead)) << fit.step_overhead;
}

TEST(PlanValidate, ErrorsOnTimePerSplit) {
  const Catalog cat = catalog();
  const auto runs = load_published_runs(default_published_runs_path());
  const ValidationReport rep = validate(runs, cat, cat.efficiency);
  ASSERT_EQ(rep.runs.size(), runs.size());
  size_t held = 0;
  for (const auto& p : rep.runs) {
    held += !p.run->train();
    // The error is on time: a rate reported higher than predicted means the run was faster.
    if (p.run->metric == ReportedMetric::achieved_tflops_per_gpu) {
      EXPECT_NEAR(p.error, p.run->reported / p.plan.achieved_tflops_per_gpu - 1, 1e-12);
    }
    if (p.run->metric == ReportedMetric::train_days) {
      EXPECT_NEAR(p.error, p.plan.train_days / p.run->reported - 1, 1e-12);
    }
    // Plans fit, except a run that published every dimension deciding its memory: it ran as
    // published, and is judged on time even where the memory model disagrees.
    const PublishedRun& r = *p.run;
    if (!(r.tp && r.pp && r.zero && r.offload && r.recompute && r.micro_batch)) {
      EXPECT_TRUE(p.plan.fits) << r.id;
    }
  }
  EXPECT_EQ(rep.held_out.count, held);
  // The issue's targets: held-out median within 10%, worst within 25% (docs/PLANNING.md
  // lists every run).
  EXPECT_LE(rep.held_out.median_abs_error, 0.10);
  EXPECT_LE(rep.held_out.max_abs_error, 0.25);
  EXPECT_LE(rep.held_out.median_abs_error, rep.held_out.max_abs_error);
}

TEST(PlanValidate, NanoGptRowIsJudgedOnTheCodeThatRanIt) {
  // The same row with the later code's inputs (flash attention, vocabulary padded to 50304),
  // which the table carried before: the planner's time for the 124M model then drops by the
  // unfused attention's passes over the 12 x 1024 x 1024 scores per layer, and the error goes
  // past -25%. The row as run (unfused, 50257) is within 25% of the reported 4 days.
  const Catalog cat = catalog();
  auto runs = load_published_runs(default_published_runs_path());
  auto it = std::find_if(runs.begin(), runs.end(),
                         [](const auto& r) { return r.id == "nanogpt-gpt2-124m"; });
  ASSERT_NE(it, runs.end());
  const std::vector<PublishedRun> as_run{*it};
  PublishedRun later = *it;
  later.job.fused_attention = true;
  later.job.model.tf.vocab = 50304;
  const std::vector<PublishedRun> as_later{later};
  const double err_run = validate(as_run, cat, cat.efficiency).runs.at(0).error;
  const double err_later = validate(as_later, cat, cat.efficiency).runs.at(0).error;
  EXPECT_LE(std::abs(err_run), 0.25) << err_run;
  EXPECT_LT(err_later, -0.25) << err_later;
  EXPECT_LT(err_later, err_run);
}

TEST(PlanValidate, BadFileNamesRunAndField) {
  const fs::path p = fs::temp_directory_path() / "hetrain_bad_runs.json";
  std::ofstream(p) << R"({"version": 1, "runs": [{"id": "x", "split": "train", "source": "s",
    "software": "llm.c",
    "model": {"family": "gpt", "layers": 2, "hidden": 64, "heads": 4, "seq": 16, "vocab": 100},
    "hardware": "a100-80gb-sxm", "gpus": 8, "global_batch": 8, "attention": "fused",
    "reported": {"metric": "speed", "value": 1}}]})";
  try {
    load_published_runs(p.string());
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("run 'x': reported.metric must be"), std::string::npos)
        << e.what();
  }
  fs::remove(p);
}

// Fields of the wrong JSON type are errors naming the file and field, never nlohmann's own
// type_error (which names neither: the fuzzer found `"version": "1"` and `"id": 5`).
TEST(PlanValidate, WrongTypesAreErrorsNamingTheField) {
  const std::string run_head = R"({"id": "x", "split": "train", "source": "s",
    "software": "llm.c",
    "model": {"family": "gpt", "layers": 2, "hidden": 64, "heads": 4, "seq": 16, "vocab": 100},
    "hardware": "a100-80gb-sxm", "gpus": 8, "global_batch": 8, "attention": "fused",
    "reported": {"metric": "mfu", "value": 0.4})";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"version": "1", "runs": []})", "expected {\"version\": 1"},
      {R"({"version": 1, "runs": [{"id": 5}]})", "runs[0]: 'id' must be a string, got 5"},
      {R"({"version": 1, "runs": [)" + run_head + R"(, "strategy": 3}]})",
       "run 'x': 'strategy' must be an object"},
      {R"({"version": 1, "runs": [)" + run_head + R"(, "cluster": []}]})",
       "run 'x': 'cluster' must be an object"},
      {R"({"version": 1, "runs": [)" + run_head + R"(, "strategy": {"schedule": 1}}]})",
       "run 'x' strategy: 'schedule' must be a string, got 1"},
      {R"({"version": 1, "runs": [)" + run_head + R"(, "strategy": {"offload": true}}]})",
       "run 'x' strategy: 'offload' must be a string, got true"},
      {R"({"version": 1, "runs": [)" + run_head + R"(, "precision": null}]})",
       "run 'x': 'precision' must be a string, got null"},
  };
  const fs::path p = fs::temp_directory_path() / "hetrain_wrong_types.json";
  for (const auto& [text, expected] : cases) {
    std::ofstream(p) << text;
    try {
      load_published_runs(p.string());
      ADD_FAILURE() << "no error for " << text;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(p.string()), std::string::npos) << e.what();
    }
  }
  fs::remove(p);
}

TEST(PlanValidate, RunIsJudgedOnTheMemoryStrategyItPublished) {
  // Llama 3 405B pre-trained at 8K tokens "without activation checkpointing" (Llama 3 paper,
  // section 3.3.2). The memory model says that does not fit an H100; the run is judged on the
  // strategy it ran, its interleaved schedule taking the fastest valid chunk count.
  const Catalog cat = catalog();
  const auto runs = load_published_runs(default_published_runs_path());
  const ValidationReport rep = validate(runs, cat, cat.efficiency);
  size_t seen = 0;
  for (const auto& p : rep.runs) {
    if (p.run->id.rfind("llama3-405b", 0) != 0) continue;
    ++seen;
    EXPECT_EQ(p.plan.strategy.recompute, Recompute::none) << p.run->id;
    EXPECT_FALSE(p.plan.fits) << p.run->id;
    EXPECT_NE(p.plan.fit_reason.find("has 80.0 GB"), std::string::npos) << p.plan.fit_reason;
    const int v = p.plan.strategy.virtual_stages;
    EXPECT_TRUE(v == 2 || v == 4) << v;  // 16 x 8 chunks would exceed the 126 layers
    // The fastest valid count: the other one is not faster.
    Strategy other = p.plan.strategy;
    other.virtual_stages = v == 2 ? 4 : 2;
    Hardware hw = cat.get("h100-sxm");
    hw.efficiency = cat.efficiency;
    hw.network_gbs = *p.run->network_gbs;
    EXPECT_GE(evaluate(p.run->job, hw, p.run->gpus, other).train_days, p.plan.train_days);
    EXPECT_NEAR(p.error, p.run->reported / p.plan.mfu - 1, 1e-12);
  }
  EXPECT_EQ(seen, 2u);
}

TEST(PlanValidate, HeldOutRunsOnSoftwareTheFitNeverSawAreMarked) {
  const Catalog cat = catalog();
  const auto runs = load_published_runs(default_published_runs_path());
  const ValidationReport rep = validate(runs, cat, cat.efficiency);
  std::set<std::string> train_software;
  for (const auto& r : runs)
    if (r.train()) train_software.insert(r.software);
  size_t seen = 0, unseen = 0;
  double worst_seen = 0;
  for (const auto& p : rep.runs) {
    EXPECT_EQ(p.stack_in_train, train_software.count(p.run->software) > 0) << p.run->id;
    if (p.run->train()) continue;
    (p.stack_in_train ? seen : unseen)++;
    if (p.stack_in_train) worst_seen = std::max(worst_seen, std::abs(p.error));
    if (p.run->id == "megatron-gpt-3.6b") {
      EXPECT_TRUE(p.stack_in_train);
    }
    if (p.run->id == "gpt-j-6b") {
      EXPECT_FALSE(p.stack_in_train);
    }
  }
  EXPECT_EQ(rep.held_out_seen_stack.count, seen);
  EXPECT_EQ(rep.held_out_new_stack.count, unseen);
  EXPECT_EQ(seen + unseen, rep.held_out.count);
  EXPECT_DOUBLE_EQ(rep.held_out_seen_stack.max_abs_error, worst_seen);
  EXPECT_GT(seen, 0u);

  // A run without its software is an error naming the run and the field.
  const fs::path f = fs::temp_directory_path() / "hetrain_runs_no_software.json";
  std::ofstream(f) << R"({"version": 1, "runs": [{"id": "y", "split": "train", "source": "s",
    "model": {"family": "gpt", "layers": 2, "hidden": 64, "heads": 4, "seq": 16, "vocab": 100},
    "hardware": "a100-80gb-sxm", "gpus": 8, "global_batch": 8, "attention": "fused",
    "reported": {"metric": "mfu", "value": 0.4}}]})";
  try {
    load_published_runs(f.string());
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("run 'y': 'software'"), std::string::npos) << e.what();
  }
  fs::remove(f);
}

TEST(PlanExplain, TermsAddUpToTheStepAndNeighboursMove) {
  const Catalog cat = catalog();
  Job j;
  j.model = preset("gpt3-175b");
  j.tokens = 300e9;
  j.global_batch = 1536;
  Strategy s;
  s.tp = 8, s.pp = 16, s.recompute = Recompute::full;
  const Hardware& hw = cat.get("a100-80gb-sxm");
  const Plan p = evaluate(j, hw, 1024, s);
  const PlanExplanation ex = explain_plan(j, hw, p);
  double sum = 0;
  for (size_t i = 0; i < ex.terms.size(); ++i) {
    sum += ex.terms[i].seconds;
    if (i) {
      EXPECT_GE(ex.terms[i - 1].seconds, ex.terms[i].seconds);
    }
  }
  EXPECT_NEAR(sum, p.time.step, 1e-9 * p.time.step);
  EXPECT_EQ(ex.terms.front().name, "compute: weight GEMMs and logits");
  bool bubble = false;
  for (const auto& t : ex.terms) bubble |= t.name == "pipeline bubble";
  EXPECT_TRUE(bubble);
  ASSERT_TRUE(ex.smaller && ex.larger);
  EXPECT_LT(ex.smaller->gpus, 1024);
  EXPECT_GT(ex.larger->gpus, 1024);
  EXPECT_EQ(ex.smaller->gpus % 128, 0);  // whole tp x pp groups that divide the batch
  EXPECT_GT(ex.smaller->train_days, p.train_days);
  EXPECT_LT(ex.larger->train_days, p.train_days);
}

TEST(PlanSearch, NearestFittingPlanChangesFewestDimensions) {
  // LLaMA-65B on 2048 A100s with everything at the defaults needs about 1.1 TB per device.
  const Catalog cat = catalog();
  Job j;
  j.model = preset("llama-65b");
  j.tokens = 1.4e12;
  j.global_batch = 2048;
  Strategy s;
  const Hardware& hw = cat.get("a100-80gb-sxm");
  const Plan p = evaluate(j, hw, 2048, s);
  ASSERT_FALSE(p.fits);
  auto n = nearest_fitting(j, hw, 2048, s);
  ASSERT_TRUE(n.has_value());
  EXPECT_TRUE(n->fits);
  EXPECT_LE(n->memory.total, n->memory.capacity);
  // One dimension changed (ZeRO-3 shards the 16 bytes a parameter over 2048 ranks).
  EXPECT_EQ(strategy_changes(s, n->strategy), "zero 0 -> 3");
}

TEST(PlanCalibration, RunsOnHardwareTheCatalogLacksAreSkipped) {
  // `hetrain train` records runs on `local`; without a device profile `local` is not in the
  // catalog, which must not stop the comparison (nor planning).
  const fs::path p = fs::temp_directory_path() / "hetrain_local_runs.json";
  std::ofstream(p) << R"({"version": 1, "runs": [{"label": "mine", "model": {"layers": 1,
    "hidden": 32, "heads": 2, "seq": 16, "vocab": 256}, "hardware": "local", "gpus": 1,
    "global_batch": 4, "micro_batch": 4, "step_time_s": 0.01}]})";
  const Catalog cat = catalog();
  ASSERT_FALSE(cat.contains("local"));
  CalibrationReport rep = compare_measured(load_measured_runs(p.string()), cat);
  fs::remove(p);
  EXPECT_TRUE(rep.runs.empty());
  ASSERT_EQ(rep.skipped.size(), 1u);
  EXPECT_EQ(rep.skipped[0].label, "mine");
  EXPECT_NE(rep.skipped[0].reason.find("hetrain bench"), std::string::npos);
}
