// Measured runs against the planner's predictions: the planner's own error, and a
// per-hardware correction fitted from those runs.
//
// File format (JSON), as `hetrain train` appends to it:
//   {"version": 1,
//    "runs": [{"label": "gpt2-124m seq 256 on this CPU",
//              "model": {"preset": "gpt2-124m", "seq": 256},   // or layers/hidden/heads/seq/vocab
//              "hardware": "local", "gpus": 1,
//              "global_batch": 8, "micro_batch": 8,
//              "tp": 1, "pp": 1, "zero": 0, "offload": "none", "recompute": "none",
//              "precision": "bf16",
//              "step_time_s": 1.84,                 // measured, median of steady steps
//              "peak_memory_bytes": 2.1e9,          // optional, measured peak per device
//              "source": "hetrain train ... commit abc123, 2025-01-01"}]}
// Every field except label, peak_memory_bytes, source and the strategy fields (defaults as
// in `hetrain plan`) is required.
#pragma once

#include <array>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "hetrain/planning/plan.h"

namespace hetrain::planning {

struct MeasuredRun {
  std::string label, hardware, source;
  Job job;
  int gpus = 1;
  Strategy strategy;
  double step_time_s = 0;
  std::optional<double> peak_memory_bytes;
  std::string origin;  // "FILE: runs[i]", named by errors about the run
};

/// Parses a measured-runs file; errors name the file, the run index and the field.
std::vector<MeasuredRun> load_measured_runs(const std::string& path);
/// $XDG_CACHE_HOME/hetrain/measured_runs.json (default ~/.cache/hetrain/...).
std::string default_measured_runs_path();

struct RunComparison {
  MeasuredRun run;
  Plan predicted;
  double step_error = 0;                 // (predicted - measured) / measured
  std::optional<double> memory_error;    // same for peak memory
  std::optional<double> loo_step_error;  // calibrated on the other runs of that hardware
};

/// A measured run that could not be compared: its hardware is not in the catalog (runs on
/// `local` before `hetrain bench` has written this machine's device profile).
struct SkippedRun {
  std::string label, hardware, reason;
};

struct CalibrationReport {
  std::vector<RunComparison> runs;
  std::vector<SkippedRun> skipped;
  double mean_abs_step_error = 0, max_abs_step_error = 0;
  std::optional<double> mean_abs_loo_error;  // leave-one-out, when a hardware has >= 2 runs
  /// Per hardware: median of measured/predicted step time. Planning with --calibrate
  /// multiplies that hardware's modelled compute time by it (communication is not
  /// calibrated: single-device runs cannot measure it).
  std::map<std::string, double> step_scale;
  /// Per hardware with at least two runs: a scale per part of the time model (TimePart
  /// order), fitted by least squares on the relative error of its runs; parts that no run
  /// exercises keep the median scale. Replaces step_scale when present.
  std::map<std::string, std::array<double, 4>> part_scale;
};

/// Runs whose hardware the catalog lacks are listed in `skipped`, not an error: a measured
/// run on `local` must not stop planning for other hardware.
CalibrationReport compare_measured(const std::vector<MeasuredRun>& runs, const Catalog& catalog);
/// Why runs on `hardware` cannot be compared (the missing device profile for `local`).
std::string missing_hardware_reason(const std::string& hardware);
/// A copy of the catalog with each calibrated hardware's compute time corrected.
Catalog calibrated(const Catalog& catalog, const CalibrationReport& report);

}  // namespace hetrain::planning
