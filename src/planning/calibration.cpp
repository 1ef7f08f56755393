#include "hetrain/planning/calibration.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "hetrain/base/error.h"
#include "hetrain/base/file_input.h"

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

// Sizes and counts: whole numbers in [lo, hi] (a double past int64's range does not convert).
int64_t whole(const json& o, const char* key, const std::string& where, int64_t lo, int64_t hi) {
  const double v = num(o, key, where);
  if (v != std::floor(v) || v < static_cast<double>(lo) || v > static_cast<double>(hi))
    fail("[plan] ", where, ": '", key, "' must be an integer in [", lo, ", ", hi, "], got ", v);
  return static_cast<int64_t>(v);
}
constexpr int64_t kMaxSize = 1000000000000;  // model sizes and batches
constexpr int64_t kMaxDevices = 1000000;     // device counts and parallel degrees

// One of a fixed set of names (offload, recompute, precision), the error naming the field.
template <class Parse>
auto choice(const json& o, const char* key, const std::string& where, const char* expected,
            Parse parse) {
  if (o[key].is_string()) {
    try {
      return parse(o[key].get<std::string>());
    } catch (const Error&) {
    }
  }
  fail("[plan] ", where, ": '", key, "' must be one of ", expected, ", got ", o[key].dump());
}

ModelSpec model_from_json(const json& m, const std::string& where) {
  if (!m.is_object()) fail("[plan] ", where, ": 'model' must be an object");
  ModelSpec spec;
  if (m.contains("preset")) {
    if (!m["preset"].is_string()) fail("[plan] ", where, ": model.preset must be a string");
    spec = preset(m["preset"].get<std::string>());
    if (m.contains("seq") && spec.is_transformer())
      spec.tf.seq = whole(m, "seq", where + " model", 1, kMaxSize);
  } else if (m.contains("family")) {
    std::string w = where + " model",
                fam = m["family"].is_string() ? m["family"].get<std::string>() : "";
    auto ints = [&](const char* key) {
      auto it = m.find(key);
      if (it == m.end() || !it->is_array() || it->empty())
        fail("[plan] ", w, ": '", key, "' must be a non-empty array of sizes");
      std::vector<int64_t> v;
      for (const auto& e : *it) {
        if (!e.is_number_integer() || e.get<int64_t>() <= 0 || e.get<int64_t>() > kMaxSize)
          fail("[plan] ", w, ": '", key, "' must hold integers in [1, ", kMaxSize, "]");
        v.push_back(e.get<int64_t>());
      }
      return v;
    };
    auto count = [&](const char* key) { return whole(m, key, w, 1, kMaxSize); };
    if (fam == "mlp") {
      spec = mlp_model(count("inputs"), ints("hidden"), count("classes"));
    } else if (fam == "resnet-small") {
      spec = small_resnet(count("channels"), count("image"), ints("widths"), count("blocks"),
                          count("classes"));
    } else {
      fail("[plan] ", w, ": unknown family '", m["family"].dump(),
           "'; expected \"mlp\" or \"resnet-small\" (or a preset, or a GPT's layers/hidden/...)");
    }
  } else {
    std::string w = where + " model";
    spec = gpt_model(whole(m, "layers", w, 1, kMaxSize), whole(m, "hidden", w, 1, kMaxSize),
                     whole(m, "heads", w, 1, kMaxSize), whole(m, "seq", w, 1, kMaxSize),
                     whole(m, "vocab", w, 1, kMaxSize));
  }
  try {
    spec.check();
  } catch (const Error& e) {
    fail("[plan] ", where, ": 'model': ", e.what());
  }
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

using Parts = std::array<double, 4>;

// The modelled time of each part of a run's step: the step with that part's scale at 1 and
// the others at 0. Exact for single-device runs (step = compute + optimizer step); for
// multi-device runs the overlap terms make it an approximation.
Parts part_times(const MeasuredRun& r, const Catalog& cat) {
  Parts t{};
  for (size_t k = 0; k < t.size(); ++k) {
    Hardware hw = cat.get(r.hardware);
    hw.part_scale = {0, 0, 0, 0};
    hw.part_scale[k] = 1;
    t[k] = evaluate(r.job, hw, r.gpus, r.strategy).time.step;
  }
  return t;
}

double dot(const Parts& s, const Parts& t) {
  return s[0] * t[0] + s[1] * t[1] + s[2] * t[2] + s[3] * t[3];
}

// Scales s minimising sum over runs of (s . t_r / measured_r - 1)^2, plus a small pull
// towards `prior` so that parts the runs cannot tell apart stay at the prior. A part whose
// scale comes out below 5% of the prior is pinned to the prior and the rest refitted.
Parts fit_parts(const std::vector<std::pair<Parts, double>>& rows, double prior) {
  Parts s;
  s.fill(prior);
  std::array<bool, 4> free{};
  for (size_t k = 0; k < 4; ++k)
    for (const auto& [t, m] : rows)
      if (t[k] > 0.01 * m) free[k] = true;
  constexpr double lambda = 1e-3;
  for (int round = 0; round < 4; ++round) {
    double A[4][5] = {};
    for (size_t i = 0; i < 4; ++i) {
      A[i][i] = lambda;
      A[i][4] = lambda * prior;
    }
    for (const auto& [t, m] : rows) {
      double target = 1;
      Parts a{};
      for (size_t k = 0; k < 4; ++k) {
        a[k] = t[k] / m;
        if (!free[k]) target -= prior * a[k];
      }
      for (size_t i = 0; i < 4; ++i) {
        if (!free[i]) continue;
        for (size_t j = 0; j < 4; ++j)
          if (free[j]) A[i][j] += a[i] * a[j];
        A[i][4] += a[i] * target;
      }
    }
    for (size_t i = 0; i < 4; ++i)
      if (!free[i]) {
        for (size_t j = 0; j < 5; ++j) A[i][j] = 0;
        A[i][i] = 1, A[i][4] = prior;
      }
    // Gaussian elimination with partial pivoting (the matrix is symmetric positive definite).
    for (size_t c = 0; c < 4; ++c) {
      size_t piv = c;
      for (size_t r = c + 1; r < 4; ++r)
        if (std::abs(A[r][c]) > std::abs(A[piv][c])) piv = r;
      for (size_t j = 0; j < 5; ++j) std::swap(A[c][j], A[piv][j]);
      for (size_t r = 0; r < 4; ++r) {
        if (r == c) continue;
        double f = A[r][c] / A[c][c];
        for (size_t j = c; j < 5; ++j) A[r][j] -= f * A[c][j];
      }
    }
    bool pinned = false;
    for (size_t k = 0; k < 4; ++k) {
      s[k] = A[k][4] / A[k][k];
      if (free[k] && s[k] < 0.05 * prior) free[k] = false, pinned = true;
    }
    if (!pinned) break;
    s.fill(prior);
  }
  return s;
}

}  // namespace

std::vector<MeasuredRun> load_measured_runs(const std::string& path) {
  const json j = read_json_file(path, "[plan] measured-runs file");
  if (!j.is_object() || !j.contains("version") || j["version"] != 1 || !j.contains("runs") ||
      !j["runs"].is_array())
    fail("[plan] measured-runs file '", path, "': expected {\"version\": 1, \"runs\": [...]}");
  std::vector<MeasuredRun> runs;
  size_t i = 0;
  for (const auto& e : j["runs"]) {
    std::string where = path + ": runs[" + std::to_string(i++) + "]";
    if (!e.is_object()) fail("[plan] ", where, ": expected an object");
    MeasuredRun r;
    r.origin = where;
    for (auto [key, field] : {std::pair{"label", &r.label}, {"source", &r.source}}) {
      if (!e.contains(key)) continue;
      if (!e[key].is_string()) fail("[plan] ", where, ": '", key, "' must be a string");
      *field = e[key].get<std::string>();
    }
    if (!e.contains("model")) fail("[plan] ", where, ": 'model' is missing");
    r.job.model = model_from_json(e["model"], where);
    if (!e.contains("hardware") || !e["hardware"].is_string())
      fail("[plan] ", where, ": 'hardware' must be a catalog id string");
    r.hardware = e["hardware"].get<std::string>();
    // Hetrain's own runs (`local`) keep the attention scores for backward, as its engine does;
    // elsewhere a fused kernel is the default, as in `hetrain plan`.
    r.job.fused_attention = r.hardware != "local";
    if (e.contains("fused_attention")) {
      if (!e["fused_attention"].is_boolean())
        fail("[plan] ", where, ": 'fused_attention' must be true or false");
      r.job.fused_attention = e["fused_attention"].get<bool>();
    }
    r.gpus = static_cast<int>(whole(e, "gpus", where, 1, kMaxDevices));
    r.job.global_batch = whole(e, "global_batch", where, 1, kMaxSize);
    r.job.tokens = static_cast<double>(r.job.global_batch) *
                   static_cast<double>(r.job.model.tokens_per_sample());
    r.strategy.micro_batch = whole(e, "micro_batch", where, 1, kMaxSize);
    r.strategy.tp = e.contains("tp") ? static_cast<int>(whole(e, "tp", where, 1, kMaxDevices)) : 1;
    r.strategy.pp = e.contains("pp") ? static_cast<int>(whole(e, "pp", where, 1, kMaxDevices)) : 1;
    r.strategy.zero = e.contains("zero") ? static_cast<int>(whole(e, "zero", where, 0, 3)) : 0;
    if (e.contains("offload"))
      r.strategy.offload =
          choice(e, "offload", where, "none, optimizer, optimizer+params", offload_from_string);
    if (e.contains("recompute"))
      r.strategy.recompute =
          choice(e, "recompute", where, "none, selective, full", recompute_from_string);
    if (e.contains("precision"))
      r.job.precision = choice(e, "precision", where, "bf16, fp16, fp32", precision_from_string);
    r.step_time_s = num(e, "step_time_s", where);
    if (!(r.step_time_s > 0 && r.step_time_s <= 1e9))
      fail("[plan] ", where, ": 'step_time_s' must be in (0, 1e9] seconds, got ", r.step_time_s);
    if (e.contains("peak_memory_bytes")) {
      r.peak_memory_bytes = num(e, "peak_memory_bytes", where);
      if (!(*r.peak_memory_bytes >= 0 && *r.peak_memory_bytes <= 1e18))
        fail("[plan] ", where, ": 'peak_memory_bytes' must be in [0, 1e18], got ",
             *r.peak_memory_bytes);
    }
    runs.push_back(std::move(r));
  }
  return runs;
}

std::string missing_hardware_reason(const std::string& hardware) {
  if (hardware == "local")
    return "no device profile for this machine (" + Catalog::device_profile_path() +
           "); run 'hetrain bench' to measure it";
  return "hardware '" + hardware + "' is not in the catalog";
}

CalibrationReport compare_measured(const std::vector<MeasuredRun>& runs, const Catalog& cat) {
  CalibrationReport rep;
  std::map<std::string, std::vector<size_t>> by_hw;
  for (const auto& r : runs) {
    if (!cat.contains(r.hardware)) {
      rep.skipped.push_back({r.label, r.hardware, missing_hardware_reason(r.hardware)});
      continue;
    }
    RunComparison c;
    c.run = r;
    // The run's strategy may not fit its model or hardware (its tp does not divide the heads):
    // the planner's message names flags, so the run it came from is named first.
    try {
      c.predicted = predict(r, cat, 1.0);
    } catch (const Error& e) {
      std::string why = e.what();
      if (why.rfind("[plan] ", 0) == 0) why.erase(0, 7);
      fail("[plan] measured run ", r.origin.empty() ? r.label : r.origin, " (hardware '",
           r.hardware, "', gpus ", r.gpus, ", ", r.strategy.describe(), "): ", why);
    }
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
    std::vector<std::pair<Parts, double>> rows;
    for (size_t i : idx) {
      const auto& c = rep.runs[i];
      ratios.push_back(c.run.step_time_s / c.predicted.time.step);
      rows.emplace_back(part_times(c.run, cat), c.run.step_time_s);
    }
    rep.step_scale[hw] = median(ratios);
    if (idx.size() < 2) continue;
    rep.part_scale[hw] = fit_parts(rows, rep.step_scale[hw]);
    for (size_t k = 0; k < idx.size(); ++k) {
      std::vector<double> others;
      std::vector<std::pair<Parts, double>> other_rows;
      for (size_t q = 0; q < idx.size(); ++q)
        if (q != k) others.push_back(ratios[q]), other_rows.push_back(rows[q]);
      auto& c = rep.runs[idx[k]];
      const double predicted = dot(fit_parts(other_rows, median(others)), rows[k].first);
      c.loo_step_error = (predicted - c.run.step_time_s) / c.run.step_time_s;
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
    if (auto it = report.part_scale.find(h.id); it != report.part_scale.end()) {
      for (size_t k = 0; k < 4; ++k) h.part_scale[k] *= it->second[k];
    } else if (auto st = report.step_scale.find(h.id);
               st != report.step_scale.end() && st->second > 0) {
      h.compute_scale *= st->second;
    }
    out.add(std::move(h));
  }
  return out;
}

}  // namespace hetrain::planning
