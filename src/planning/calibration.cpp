#include "hetrain/planning/calibration.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

#include "hetrain/base/error.h"

namespace hetrain::planning {

using nlohmann::json;

std::string default_measured_runs_path() {
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x)
    return std::string(x) + "/hetrain/measured_runs.json";
  if (const char* home = std::getenv("HOME"); home && *home)
    return std::string(home) + "/.cache/hetrain/measured_runs.json";
  return "";
}

namespace {

double num(const json& o, const char* key, const std::string& where) {
  auto it = o.find(key);
  if (it == o.end() || !it->is_number()) fail("[plan] ", where, ": '", key, "' must be a number");
  return it->get<double>();
}

ModelSpec model_from_json(const json& m, const std::string& where) {
  if (!m.is_object()) fail("[plan] ", where, ": 'model' must be an object");
  ModelSpec spec;
  if (m.contains("preset")) {
    if (!m["preset"].is_string()) fail("[plan] ", where, ": model.preset must be a string");
    spec = preset(m["preset"].get<std::string>());
    if (m.contains("seq") && spec.is_transformer())
      spec.tf.seq = static_cast<int64_t>(num(m, "seq", where + " model"));
  } else {
    std::string w = where + " model";
    spec = gpt_model(
        static_cast<int64_t>(num(m, "layers", w)), static_cast<int64_t>(num(m, "hidden", w)),
        static_cast<int64_t>(num(m, "heads", w)), static_cast<int64_t>(num(m, "seq", w)),
        static_cast<int64_t>(num(m, "vocab", w)));
  }
  spec.check();
  return spec;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

Plan predict(const MeasuredRun& r, const Catalog& cat, double scale) {
  Hardware hw = cat.get(r.hardware);
  hw.compute_scale *= scale;
  return evaluate(r.job, hw, r.gpus, r.strategy);
}

}  // namespace

std::vector<MeasuredRun> load_measured_runs(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("[plan] cannot open measured-runs file '", path, "'");
  json j;
  try {
    j = json::parse(std::string(std::istreambuf_iterator<char>(in), {}));
  } catch (const json::parse_error& e) {
    fail("[plan] measured-runs file '", path, "' is not valid JSON: ", e.what());
  }
  if (!j.is_object() || j.value("version", 0) != 1 || !j.contains("runs") || !j["runs"].is_array())
    fail("[plan] measured-runs file '", path, "': expected {\"version\": 1, \"runs\": [...]}");
  std::vector<MeasuredRun> runs;
  size_t i = 0;
  for (const auto& e : j["runs"]) {
    std::string where = path + ": runs[" + std::to_string(i++) + "]";
    if (!e.is_object()) fail("[plan] ", where, ": expected an object");
    MeasuredRun r;
    r.label = e.value("label", std::string());
    r.source = e.value("source", std::string());
    if (!e.contains("model")) fail("[plan] ", where, ": 'model' is missing");
    r.job.model = model_from_json(e["model"], where);
    if (!e.contains("hardware") || !e["hardware"].is_string())
      fail("[plan] ", where, ": 'hardware' must be a catalog id string");
    r.hardware = e["hardware"].get<std::string>();
    r.gpus = static_cast<int>(num(e, "gpus", where));
    r.job.global_batch = static_cast<int64_t>(num(e, "global_batch", where));
    r.job.tokens = static_cast<double>(r.job.global_batch * r.job.model.tokens_per_sample());
    r.strategy.micro_batch = static_cast<int64_t>(num(e, "micro_batch", where));
    r.strategy.tp = e.contains("tp") ? static_cast<int>(num(e, "tp", where)) : 1;
    r.strategy.pp = e.contains("pp") ? static_cast<int>(num(e, "pp", where)) : 1;
    r.strategy.zero = e.contains("zero") ? static_cast<int>(num(e, "zero", where)) : 0;
    if (e.contains("offload"))
      r.strategy.offload = offload_from_string(e["offload"].get<std::string>());
    if (e.contains("recompute"))
      r.strategy.recompute = recompute_from_string(e["recompute"].get<std::string>());
    if (e.contains("precision"))
      r.job.precision = precision_from_string(e["precision"].get<std::string>());
    r.step_time_s = num(e, "step_time_s", where);
    if (r.step_time_s <= 0) fail("[plan] ", where, ": 'step_time_s' must be positive");
    if (e.contains("peak_memory_bytes")) r.peak_memory_bytes = num(e, "peak_memory_bytes", where);
    runs.push_back(std::move(r));
  }
  return runs;
}

CalibrationReport compare_measured(const std::vector<MeasuredRun>& runs, const Catalog& cat) {
  CalibrationReport rep;
  std::map<std::string, std::vector<size_t>> by_hw;
  for (const auto& r : runs) {
    RunComparison c;
    c.run = r;
    c.predicted = predict(r, cat, 1.0);
    c.step_error = (c.predicted.time.step - r.step_time_s) / r.step_time_s;
    if (r.peak_memory_bytes && *r.peak_memory_bytes > 0)
      c.memory_error = (c.predicted.memory.total - *r.peak_memory_bytes) / *r.peak_memory_bytes;
    by_hw[r.hardware].push_back(rep.runs.size());
    rep.runs.push_back(std::move(c));
  }
  double sum = 0, loo_sum = 0;
  size_t loo_n = 0;
  for (const auto& c : rep.runs) {
    sum += std::abs(c.step_error);
    rep.max_abs_step_error = std::max(rep.max_abs_step_error, std::abs(c.step_error));
  }
  if (!rep.runs.empty()) rep.mean_abs_step_error = sum / rep.runs.size();
  for (const auto& [hw, idx] : by_hw) {
    std::vector<double> ratios;
    for (size_t i : idx)
      ratios.push_back(rep.runs[i].run.step_time_s / rep.runs[i].predicted.time.step);
    rep.step_scale[hw] = median(ratios);
    if (idx.size() < 2) continue;
    for (size_t k = 0; k < idx.size(); ++k) {
      std::vector<double> others;
      for (size_t q = 0; q < idx.size(); ++q)
        if (q != k) others.push_back(ratios[q]);
      auto& c = rep.runs[idx[k]];
      Plan p = predict(c.run, cat, median(others));
      c.loo_step_error = (p.time.step - c.run.step_time_s) / c.run.step_time_s;
      loo_sum += std::abs(*c.loo_step_error);
      ++loo_n;
    }
  }
  if (loo_n) rep.mean_abs_loo_error = loo_sum / loo_n;
  return rep;
}

Catalog calibrated(const Catalog& catalog, const CalibrationReport& report) {
  Catalog out;
  out.path = catalog.path;
  for (Hardware h : catalog.all()) {
    if (auto it = report.step_scale.find(h.id); it != report.step_scale.end() && it->second > 0)
      h.compute_scale *= it->second;
    out.add(std::move(h));
  }
  return out;
}

}  // namespace hetrain::planning
