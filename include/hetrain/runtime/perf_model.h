// Performance models: measured kernel times per (primitive, device class, dtype), learned while
// the executor runs and kept on disk per machine ($XDG_CACHE_HOME/hetrain/perfmodel.json).
//
// For a size seen before the model answers from history (mean of the samples at that input
// footprint); for an unseen size from a regression t = a * size^b + c over the sizes seen.
// Each answer carries a confidence: too few or too noisy samples, or a size far outside the
// fitted range, are not trusted and the scheduler falls back to the roofline estimate (which
// explores the device) until measurements make the model trustworthy.
#pragma once

#include <cstdint>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <unordered_map>
#include <vector>

#include "hetrain/base/dtype.h"
#include "hetrain/runtime/scheduler.h"

namespace hetrain::runtime {

/// The class of a device for performance models: devices of one class share measurements
/// ("cpu:2t" for the CPU with 2 threads, "sim@4" for sim devices slowed 4 times).
std::string device_class(const DeviceModel& d);

struct PerfEstimate {
  double seconds = 0;
  bool trusted = false;
  const char* source = "none";  // "history", "regression" or "none"
};

class PerfModels {
 public:
  /// Records one measured kernel time. A sample over 4x the mean of 3+ earlier ones at the same
  /// footprint is counted as an outlier and left out (a preempted run, not the kernel).
  void record(const std::string& prim, const std::string& dev_class, Dtype dtype,
              uint64_t footprint, double size, double seconds);
  PerfEstimate estimate(const std::string& prim, const std::string& dev_class, Dtype dtype,
                        uint64_t footprint, double size) const;
  /// Bumped whenever an entry becomes trusted (cached plans made without it are redone).
  uint64_t generation() const;
  bool empty() const;
  void clear();

  nlohmann::json to_json() const;
  /// Replaces the models with those in j; throws Error naming the bad field.
  void from_json(const nlohmann::json& j);

  /// Loads path; a missing file leaves the models empty. A corrupt file, or one written on
  /// another machine, is renamed to path + ".bad" and the models start empty: the returned
  /// warning says so (empty when all went well).
  std::string load(const std::string& path);
  /// Writes atomically (temporary file, then rename); throws Error naming the path.
  void save(const std::string& path) const;

 private:
  struct Stat {
    double size = 0;
    int64_t n = 0;
    double mean = 0, m2 = 0;
    int64_t outliers = 0;
  };
  struct Fit {
    double a = 0, b = 1, c = 0, rel_rms = 1, min_size = 0, max_size = 0;
    bool ok = false;
  };
  struct Entry {
    std::unordered_map<uint64_t, Stat> history;
    mutable Fit fit;
    mutable bool fit_dirty = true;
  };
  static bool stat_trusted(const Stat& s);
  static void refit(const Entry& e);

  mutable std::mutex mu_;
  std::unordered_map<std::string, Entry> models_;  // "prim|class|dtype"
  uint64_t generation_ = 0;
};

/// The process-wide models the executor records into and placement reads.
PerfModels& perf_models();
/// Records kernel times while on (off by default; `hetrain train` turns it on). Costs two clock
/// reads and a map update per node.
void set_perf_recording(bool on);
bool perf_recording();
/// $XDG_CACHE_HOME/hetrain/perfmodel.json (default ~/.cache/hetrain/perfmodel.json).
std::string perf_model_path();
/// This machine, as recorded in the model file: host name and CPU model.
std::string machine_id();

/// Footprint of a node for history: its input and output shapes and dtypes.
uint64_t shape_footprint(const std::vector<std::vector<int64_t>>& shapes);

/// Durations from performance models where trusted, from the roofline otherwise.
class CalibratedModel : public DurationModel {
 public:
  CalibratedModel(std::vector<DeviceModel> devices, const PerfModels& models);
  double node_seconds(const TaskNode& node, int d) const override;
  double copy_seconds(double bytes, int d) const override {
    return roofline_.copy_seconds(bytes, d);
  }
  int workers(int d) const override { return roofline_.workers(d); }
  int shared_cores() const override { return roofline_.shared_cores(); }
  double core_seconds(double seconds, int d) const override {
    return roofline_.core_seconds(seconds, d);
  }
  /// The estimate behind node_seconds (for explain).
  PerfEstimate estimate(const TaskNode& node, int d) const;

 private:
  RooflineModel roofline_;
  const PerfModels& models_;
  std::vector<std::string> classes_;
};

}  // namespace hetrain::runtime
