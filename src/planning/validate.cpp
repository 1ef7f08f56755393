// Published training runs against the planner, and the efficiency model's fit.
#include "hetrain/planning/validate.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <nlohmann/json.hpp>
#include <set>

#include "hetrain/base/error.h"
#include "hetrain/base/file_input.h"
#include "planning/internal.h"

namespace hetrain::planning {

using nlohmann::json;

const char* to_string(ReportedMetric m) {
  switch (m) {
    case ReportedMetric::achieved_tflops_per_gpu:
      return "achieved_tflops_per_gpu";
    case ReportedMetric::mfu:
      return "mfu";
    case ReportedMetric::tokens_per_s_per_gpu:
      return "tokens_per_s_per_gpu";
    case ReportedMetric::train_days:
      return "train_days";
    case ReportedMetric::gpu_hours:
      return "gpu_hours";
  }
  return "?";
}

std::string default_published_runs_path() {
  return std::string(HETRAIN_SOURCE_DIR) + "/data/published_runs.json";
}

namespace {

double positive(const json& o, const char* key, const std::string& where) {
  auto it = o.find(key);
  if (it == o.end() || !it->is_number() || !std::isfinite(it->get<double>()) ||
      it->get<double>() <= 0)
    fail("[plan] ", where, ": '", key, "' must be a positive number");
  return it->get<double>();
}

int64_t count(const json& o, const char* key, const std::string& where) {
  double v = positive(o, key, where);
  if (v != std::floor(v) || v > 1e12) fail("[plan] ", where, ": '", key, "' must be an integer");
  return static_cast<int64_t>(v);
}

bool flag(const json& o, const char* key, bool dflt, const std::string& where) {
  if (!o.contains(key)) return dflt;
  if (!o[key].is_boolean()) fail("[plan] ", where, ": '", key, "' must be true or false");
  return o[key].get<bool>();
}

// A GPT (learned positions, LayerNorm, GELU, biases, tied embeddings) or a LLaMA (RoPE,
// RMSNorm, SwiGLU, no biases, untied) with the published shape.
ModelSpec model_from(const json& m, const std::string& where) {
  if (!m.is_object()) fail("[plan] ", where, ": 'model' must be an object");
  const std::string fam = json_string(m, "family", "", "[plan] " + where + " model");
  if (fam != "gpt" && fam != "llama")
    fail("[plan] ", where, ": model.family must be \"gpt\" or \"llama\", got '", fam, "'");
  ModelSpec spec =
      gpt_model(count(m, "layers", where), count(m, "hidden", where), count(m, "heads", where),
                count(m, "seq", where), count(m, "vocab", where));
  auto& t = spec.tf;
  if (fam == "llama") {
    spec.family = ModelFamily::llama;
    t.norm = Norm::rmsnorm, t.mlp = MlpKind::swiglu, t.bias = false, t.tied_embeddings = false;
    t.dropout = false, t.max_positions = 0;
  }
  if (m.contains("kv_heads")) t.kv_heads = count(m, "kv_heads", where);
  if (m.contains("ffn")) t.ffn_hidden = count(m, "ffn", where);
  if (m.contains("positions")) {
    const std::string pos = m["positions"].is_string() ? m["positions"].get<std::string>() : "";
    if (pos != "learned" && pos != "none")
      fail("[plan] ", where, ": model.positions must be \"learned\" or \"none\"");
    t.max_positions = pos == "learned" ? t.seq : 0;
  }
  t.bias = flag(m, "bias", t.bias, where);
  t.dropout = flag(m, "dropout", t.dropout, where);
  t.tied_embeddings = flag(m, "tied", t.tied_embeddings, where);
  t.embedding_norm = flag(m, "embedding_norm", t.embedding_norm, where);
  spec.check();
  return spec;
}

ReportedMetric metric_from(const std::string& s, const std::string& where) {
  for (auto m : {ReportedMetric::achieved_tflops_per_gpu, ReportedMetric::mfu,
                 ReportedMetric::tokens_per_s_per_gpu, ReportedMetric::train_days,
                 ReportedMetric::gpu_hours})
    if (s == to_string(m)) return m;
  fail("[plan] ", where,
       ": reported.metric must be achieved_tflops_per_gpu, mfu, tokens_per_s_per_gpu, "
       "train_days or gpu_hours, got '",
       s, "'");
}

PublishedRun run_from(const json& e, const std::string& file, size_t index) {
  std::string where = file + ": runs[" + std::to_string(index) + "]";
  if (!e.is_object()) fail("[plan] ", where, ": expected an object");
  PublishedRun r;
  auto text = [&](const char* key, const std::string& dflt = "") {
    return json_string(e, key, dflt, "[plan] " + where);
  };
  r.id = text("id");
  if (r.id.empty()) fail("[plan] ", where, ": 'id' must be a non-empty string");
  where = file + ": run '" + r.id + "'";
  r.split = text("split");
  if (r.split != "train" && r.split != "held-out")
    fail("[plan] ", where, ": 'split' must be \"train\" or \"held-out\"");
  r.source = text("source");
  if (r.source.empty()) fail("[plan] ", where, ": 'source' (the citation) is missing");
  r.software = text("software");
  if (r.software.empty())
    fail("[plan] ", where, ": 'software' (the training code the run used) is missing");
  r.params_reported = text("params_reported");
  r.strategy_note = text("strategy_note");
  r.job.model = model_from(e.value("model", json()), where);
  r.job.model.name = r.id;
  r.hardware = text("hardware");
  if (r.hardware.empty()) fail("[plan] ", where, ": 'hardware' must be a catalog id");
  if (e.contains("cluster")) {
    const json& c = e["cluster"];
    if (!c.is_object()) fail("[plan] ", where, ": 'cluster' must be an object");
    if (c.contains("network_gbs_per_device"))
      r.network_gbs = positive(c, "network_gbs_per_device", where + " cluster");
    if (c.contains("gpus_per_node"))
      r.gpus_per_node = static_cast<int>(count(c, "gpus_per_node", where + " cluster"));
  }
  r.gpus = static_cast<int>(count(e, "gpus", where));
  r.job.global_batch = count(e, "global_batch", where);
  r.job.tokens = e.contains("tokens") && !e["tokens"].is_null()
                     ? positive(e, "tokens", where)
                     : static_cast<double>(r.job.global_batch * r.job.model.tf.seq);
  r.job.precision = precision_from_string(text("precision", "bf16"));
  const std::string attn = text("attention");
  if (attn != "fused" && attn != "unfused")
    fail("[plan] ", where, ": 'attention' must be \"fused\" or \"unfused\"");
  r.job.fused_attention = attn == "fused";
  if (e.contains("strategy")) {
    const json& s = e["strategy"];
    const std::string sw = where + " strategy";
    if (!s.is_object()) fail("[plan] ", where, ": 'strategy' must be an object");
    if (s.contains("tp")) r.tp = static_cast<int>(count(s, "tp", sw));
    if (s.contains("pp")) r.pp = static_cast<int>(count(s, "pp", sw));
    if (s.contains("zero")) {
      if (!s["zero"].is_number_integer() || s["zero"].get<int>() < 0 || s["zero"].get<int>() > 3)
        fail("[plan] ", sw, ": 'zero' must be 0, 1, 2 or 3");
      r.zero = s["zero"].get<int>();
    }
    if (s.contains("offload"))
      r.offload = offload_from_string(json_string(s, "offload", "", "[plan] " + sw));
    if (s.contains("recompute"))
      r.recompute = recompute_from_string(json_string(s, "recompute", "", "[plan] " + sw));
    if (s.contains("micro_batch")) r.micro_batch = count(s, "micro_batch", sw);
    if (s.contains("recompute_layers")) {
      if (!s["recompute_layers"].is_number_integer() || s["recompute_layers"].get<int>() < 0)
        fail("[plan] ", sw, ": 'recompute_layers' must be a whole number >= 0 (0: every layer)");
      r.recompute_layers = s["recompute_layers"].get<int>();
    }
    r.overlap_dp = flag(s, "dp_overlap", true, sw);
    const std::string schedule = json_string(s, "schedule", "1f1b", "[plan] " + sw);
    if (schedule != "1f1b" && schedule != "interleaved")
      fail("[plan] ", sw, ": 'schedule' must be \"1f1b\" or \"interleaved\", got '", schedule, "'");
    if (schedule == "interleaved")
      r.virtual_stages = s.contains("virtual_stages")
                             ? std::optional<int>(static_cast<int>(count(s, "virtual_stages", sw)))
                             : std::nullopt;
  }
  const json rep = e.value("reported", json());
  if (!rep.is_object()) fail("[plan] ", where, ": 'reported' must be an object");
  r.metric = metric_from(json_string(rep, "metric", "", "[plan] " + where + " reported"), where);
  r.reported = positive(rep, "value", where + " reported");
  r.text = json_string(rep, "text", "", "[plan] " + where + " reported");
  return r;
}

Hardware hardware_for(const PublishedRun& r, const Catalog& cat, const EfficiencyModel& m) {
  Hardware hw = cat.get(r.hardware);
  hw.efficiency = m;
  if (r.network_gbs) hw.network_gbs = *r.network_gbs;
  if (r.gpus_per_node) hw.gpus_per_node = *r.gpus_per_node;
  return hw;
}

// The published strategy; open dimensions searched for the fastest plan that fits. A run that
// publishes every dimension that decides its memory (tp, pp, ZeRO stage, offload, recompute,
// micro-batch) ran in the memory it had: it is judged on that strategy even where the memory
// model says it does not fit (the plan's `fits` says so), and an interleaved schedule whose
// chunks per device are not published takes the fastest valid count (2, 4 or 8).
Plan predict_plan(const PublishedRun& r, const Hardware& hw) {
  if (r.tp && r.pp && r.zero && r.offload && r.recompute && r.micro_batch) {
    Strategy s;
    s.recompute_layers = r.recompute_layers.value_or(0);
    s.tp = *r.tp, s.pp = *r.pp, s.zero = *r.zero, s.offload = *r.offload;
    s.recompute = *r.recompute, s.micro_batch = *r.micro_batch;
    s.overlap_dp = r.overlap_dp;
    if (r.virtual_stages) {
      s.virtual_stages = *r.virtual_stages;
      return evaluate(r.job, hw, r.gpus, s);
    }
    std::optional<Plan> best;
    for (int v : {2, 4, 8}) {
      s.virtual_stages = v;
      if (!detail::strategy_problem(r.job, hw, r.gpus, s).empty()) continue;
      Plan p = evaluate(r.job, hw, r.gpus, s);
      if (!best || p.train_days < best->train_days) best = std::move(p);
    }
    if (!best)
      fail("[plan] published run '", r.id, "': no interleaved schedule with 2, 4 or 8 chunks ",
           "per device is valid for its strategy");
    return *best;
  }
  Catalog one;
  Hardware h = hw;
  h.price_per_hour = 0;  // rank by time alone
  one.add(h);
  SearchOptions o;
  o.hardware = {hw.id};
  o.gpus = {r.gpus};
  o.max_gpus = r.gpus;
  o.tp = r.tp, o.pp = r.pp, o.zero = r.zero, o.offload = r.offload, o.recompute = r.recompute;
  o.micro_batch = r.micro_batch;
  o.virtual_stages = r.virtual_stages;
  o.overlap_dp = r.overlap_dp;
  // A published recompute mode without a layer count is every layer; an open one is searched.
  if (r.recompute || r.recompute_layers) o.recompute_layers = r.recompute_layers.value_or(0);
  o.top = 1;
  SearchResult res = search(r.job, one, o);
  if (res.plans.empty())
    fail("[plan] published run '", r.id,
         "': no plan fits: ", res.rejected.empty() ? std::string("?") : res.rejected[0].reason);
  return res.plans.front();
}

double figure(ReportedMetric m, const Plan& p) {
  switch (m) {
    case ReportedMetric::achieved_tflops_per_gpu:
      return p.achieved_tflops_per_gpu;
    case ReportedMetric::mfu:
      return p.mfu;
    case ReportedMetric::tokens_per_s_per_gpu:
      return p.tokens_per_s / p.gpus;
    case ReportedMetric::train_days:
      return p.train_days;
    case ReportedMetric::gpu_hours:
      return p.gpu_hours;
  }
  return 0;
}

bool is_rate(ReportedMetric m) {
  return m != ReportedMetric::train_days && m != ReportedMetric::gpu_hours;
}

SplitSummary summarise(const std::vector<double>& errs) {
  SplitSummary s;
  s.count = errs.size();
  if (errs.empty()) return s;
  std::vector<double> a;
  for (double e : errs) a.push_back(std::abs(e));
  std::sort(a.begin(), a.end());
  size_t n = a.size();
  s.median_abs_error = n % 2 ? a[n / 2] : 0.5 * (a[n / 2 - 1] + a[n / 2]);
  s.max_abs_error = a.back();
  for (double e : a) s.mean_abs_error += e / n;
  return s;
}

}  // namespace

std::vector<PublishedRun> load_published_runs(const std::string& path) {
  const json j = read_json_file(path, "[plan] published-runs file");
  if (!j.is_object() || !json_version_is(j, 1) || !j.contains("runs") || !j["runs"].is_array())
    fail("[plan] published-runs file '", path, "': expected {\"version\": 1, \"runs\": [...]}");
  std::vector<PublishedRun> runs;
  size_t i = 0;
  for (const auto& e : j["runs"]) {
    runs.push_back(run_from(e, path, i++));
    for (size_t k = 0; k + 1 < runs.size(); ++k)
      if (runs[k].id == runs.back().id)
        fail("[plan] published-runs file '", path, "': duplicate id '", runs.back().id, "'");
  }
  return runs;
}

ValidationReport validate(const std::vector<PublishedRun>& runs, const Catalog& catalog,
                          const EfficiencyModel& m) {
  ValidationReport rep;
  std::set<std::string> train_stacks;
  for (const auto& r : runs)
    if (r.train()) train_stacks.insert(r.software);
  std::vector<double> train, held, held_seen, held_new;
  for (const auto& r : runs) {
    RunPrediction p;
    p.run = &r;
    p.plan = predict_plan(r, hardware_for(r, catalog, m));
    p.predicted = figure(r.metric, p.plan);
    p.error = is_rate(r.metric) ? r.reported / p.predicted - 1 : p.predicted / r.reported - 1;
    p.stack_in_train = train_stacks.count(r.software) > 0;
    (r.train() ? train : held).push_back(p.error);
    if (!r.train()) (p.stack_in_train ? held_seen : held_new).push_back(p.error);
    rep.runs.push_back(std::move(p));
  }
  rep.train = summarise(train);
  rep.held_out = summarise(held);
  rep.held_out_seen_stack = summarise(held_seen);
  rep.held_out_new_stack = summarise(held_new);
  return rep;
}

namespace {

constexpr size_t kParams = 6;
using Theta = std::array<double, kParams>;

// The parameters in a space where every point is valid: logs for scales, a logistic for
// fractions bounded by one.
EfficiencyModel model_of(const Theta& t) {
  auto unit = [](double x) { return 1 / (1 + std::exp(-x)); };
  EfficiencyModel m;
  m.gemm_half_size = std::exp(t[0]);
  m.elementwise_fraction = std::exp(t[1]);
  m.fused_attention = 0.05 + 0.95 * unit(t[2]);
  m.kernel_overhead_us = std::exp(t[3]);
  m.link_efficiency = 0.1 + 0.9 * unit(t[4]);
  m.step_overhead = std::exp(t[5]);
  return m;
}

}  // namespace

EfficiencyModel fit_efficiency(const std::vector<PublishedRun>& runs, const Catalog& catalog) {
  std::vector<PublishedRun> train;
  for (const auto& r : runs)
    if (r.train()) train.push_back(r);
  if (train.empty()) fail("[plan] no published run is marked \"train\": nothing to fit");
  auto loss = [&](const Theta& t) {
    const EfficiencyModel m = model_of(t);
    double sum = 0;
    for (const auto& r : train) {
      Plan p = predict_plan(r, hardware_for(r, catalog, m));
      double ratio =
          is_rate(r.metric) ? r.reported / figure(r.metric, p) : figure(r.metric, p) / r.reported;
      sum += std::log(ratio) * std::log(ratio);
    }
    return sum / train.size();
  };
  // Start: half size 128, 60% of the elementwise passes, fused attention at 60%, 20 us per
  // layer, links at 80%, 5% end-to-end loss.
  Theta x0 = {std::log(128.0), std::log(0.6), 0.4, std::log(20.0), 1.1, std::log(0.05)};
  std::array<Theta, kParams + 1> simplex;
  std::array<double, kParams + 1> f;
  for (size_t i = 0; i <= kParams; ++i) {
    simplex[i] = x0;
    if (i > 0) simplex[i][i - 1] += 0.7;
    f[i] = loss(simplex[i]);
  }
  for (int iter = 0; iter < 600; ++iter) {
    std::array<size_t, kParams + 1> idx;
    for (size_t i = 0; i <= kParams; ++i) idx[i] = i;
    std::sort(idx.begin(), idx.end(), [&](size_t a, size_t b) { return f[a] < f[b]; });
    const size_t best = idx[0], worst = idx[kParams], second = idx[kParams - 1];
    if (f[worst] - f[best] < 1e-10) break;
    Theta c{};
    for (size_t i = 0; i <= kParams; ++i)
      if (i != worst)
        for (size_t k = 0; k < kParams; ++k) c[k] += simplex[i][k] / kParams;
    auto along = [&](double a) {
      Theta t;
      for (size_t k = 0; k < kParams; ++k) t[k] = c[k] + a * (simplex[worst][k] - c[k]);
      return t;
    };
    Theta xr = along(-1);
    double fr = loss(xr);
    if (fr < f[best]) {
      Theta xe = along(-2);
      double fe = loss(xe);
      if (fe < fr) xr = xe, fr = fe;
      simplex[worst] = xr, f[worst] = fr;
    } else if (fr < f[second]) {
      simplex[worst] = xr, f[worst] = fr;
    } else {
      Theta xc = along(0.5);
      double fc = loss(xc);
      if (fc < f[worst]) {
        simplex[worst] = xc, f[worst] = fc;
      } else {
        for (size_t i = 0; i <= kParams; ++i) {
          if (i == best) continue;
          for (size_t k = 0; k < kParams; ++k)
            simplex[i][k] = simplex[best][k] + 0.5 * (simplex[i][k] - simplex[best][k]);
          f[i] = loss(simplex[i]);
        }
      }
    }
  }
  size_t best = static_cast<size_t>(std::min_element(f.begin(), f.end()) - f.begin());
  return model_of(simplex[best]);
}

}  // namespace hetrain::planning
