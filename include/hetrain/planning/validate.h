// The planner against published training runs (data/published_runs.json): predict each run,
// compare with the reported figure, and fit the catalog's efficiency model on the runs marked
// "train" (`hetrain plan --validate`).
//
//   auto runs = load_published_runs(default_published_runs_path());
//   ValidationReport r = validate(runs, Catalog::load_default(), catalog.efficiency);
//   r.held_out.median_abs_error ...
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "hetrain/planning/plan.h"

namespace hetrain::planning {

enum class ReportedMetric {
  achieved_tflops_per_gpu,
  mfu,
  tokens_per_s_per_gpu,
  train_days,
  gpu_hours
};
const char* to_string(ReportedMetric m);

struct PublishedRun {
  std::string id, split, source, params_reported, text, strategy_note;
  /// The training code the run used ('software': megatron-lm, llm.c, mesh-transformer-jax..).
  /// The efficiency model is fitted on the train runs' stacks; a held-out run on a stack no
  /// train run used is an extrapolation, and the report says so.
  std::string software;
  Job job;
  std::string hardware;
  std::optional<double> network_gbs;  // the published cluster's scale-out bandwidth per device
  std::optional<int> gpus_per_node;
  int gpus = 0;
  /// The strategy as published; dimensions left out are searched (the fastest fitting plan).
  std::optional<int> tp, pp, zero;
  std::optional<Offload> offload;
  std::optional<Recompute> recompute;
  std::optional<int64_t> micro_batch;
  /// Pipeline schedule: "1f1b" (the default: virtual stages 1) or "interleaved" (virtual
  /// stages as published in 'virtual_stages', else searched).
  std::optional<int> virtual_stages = 1;
  /// Layers per device recomputed under full recompute ('recompute_layers'; 0: all). When the
  /// row gives recompute without it, every layer; when recompute is open, searched.
  std::optional<int> recompute_layers;
  /// The software's data-parallel gradient all-reduce overlaps the backward ('dp_overlap',
  /// default true; Megatron-LM 2019's local DDP all-reduced after the backward).
  bool overlap_dp = true;
  ReportedMetric metric = ReportedMetric::achieved_tflops_per_gpu;
  double reported = 0;
  bool train() const { return split == "train"; }
};

/// Parses a published-runs file; errors name the file, the run and the field.
std::vector<PublishedRun> load_published_runs(const std::string& path);
/// <source dir>/data/published_runs.json.
std::string default_published_runs_path();

struct RunPrediction {
  const PublishedRun* run = nullptr;
  Plan plan;             // the predicted plan (published strategy, open dimensions searched)
  double predicted = 0;  // in the reported figure's unit
  double error = 0;      // on time: predicted time / the time the reported figure implies - 1
  bool stack_in_train = false;  // some train run used the same software
};

struct SplitSummary {
  size_t count = 0;
  double median_abs_error = 0, max_abs_error = 0, mean_abs_error = 0;
};

struct ValidationReport {
  std::vector<RunPrediction> runs;
  SplitSummary train, held_out;
  /// The held-out runs split by whether the fit saw their software stack.
  SplitSummary held_out_seen_stack, held_out_new_stack;
};

/// Predicts every run with the catalog's hardware under efficiency model `m`.
ValidationReport validate(const std::vector<PublishedRun>& runs, const Catalog& catalog,
                          const EfficiencyModel& m);
/// The efficiency model minimising the mean squared log time error over the "train" runs
/// (Nelder-Mead from the plain roofline's neighbourhood; deterministic).
EfficiencyModel fit_efficiency(const std::vector<PublishedRun>& runs, const Catalog& catalog);

}  // namespace hetrain::planning
