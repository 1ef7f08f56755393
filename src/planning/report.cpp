#include "hetrain/planning/report.h"

namespace hetrain::planning {

using nlohmann::json;

json to_json(const Plan& p) {
  const auto& m = p.memory;
  const auto& t = p.time;
  const auto& s = p.strategy;
  json j;
  j["hardware"] = p.hardware;
  j["gpus"] = p.gpus;
  j["strategy"] = {{"tp", s.tp},
                   {"pp", s.pp},
                   {"dp", p.dp},
                   {"zero", s.zero},
                   {"offload", to_string(s.offload)},
                   {"recompute", to_string(s.recompute)},
                   {"micro_batch", s.micro_batch},
                   {"micro_batches_per_step", p.micro_batches},
                   {"virtual_stages", s.virtual_stages},
                   {"recompute_layers", s.recompute_layers},
                   {"sequence_parallel", s.sequence_parallel},
                   {"overlap_dp", s.overlap_dp}};
  j["params"] = p.params;
  j["flops_per_step"] = p.flops_per_step;
  j["model_flops_per_step"] = p.model_flops_per_step;
  j["memory_per_gpu_bytes"] = {{"weights", m.weights},
                               {"gradients", m.gradients},
                               {"optimizer", m.optimizer},
                               {"activations", m.activations},
                               {"temporary", m.temporary},
                               {"reserved", m.reserved},
                               {"total", m.total},
                               {"capacity", m.capacity},
                               {"host_per_gpu", m.host_per_device},
                               {"host_capacity_per_gpu", m.host_capacity}};
  j["fits"] = p.fits;
  if (!p.fits) j["fit_reason"] = p.fit_reason;
  j["time_per_step_s"] = {
      {"compute", t.compute},        {"recompute", t.recompute}, {"tp_comm", t.tp_comm},
      {"pp_comm", t.pp_comm},        {"dp_comm", t.dp_comm},     {"dp_comm_exposed", t.dp_exposed},
      {"pipeline_bubble", t.bubble}, {"optimizer", t.optimizer}, {"offload", t.offload}};
  j["step_time_s"] = t.step;
  j["steps"] = p.steps;
  j["tokens_per_s"] = p.tokens_per_s;
  j["achieved_tflops_per_gpu"] = p.achieved_tflops_per_gpu;
  j["compute_tflops_per_gpu"] = p.compute_tflops_per_gpu;
  j["mfu"] = p.mfu;
  j["train_days"] = p.train_days;
  j["gpu_hours"] = p.gpu_hours;
  j["cost_usd"] = p.priced ? json(p.cost_usd) : json(nullptr);
  return j;
}

json to_json(const SearchResult& r) {
  json j;
  j["plans"] = json::array();
  for (const auto& p : r.plans) j["plans"].push_back(to_json(p));
  j["rejected"] = json::array();
  for (const auto& x : r.rejected)
    j["rejected"].push_back({{"hardware", x.hardware}, {"reason", x.reason}});
  j["alternatives"] = json::array();
  for (const auto& p : r.alternatives) j["alternatives"].push_back(to_json(p));
  j["explanation"] = r.explanation;
  j["evaluated"] = r.evaluated;
  return j;
}

json to_json(const CalibrationReport& r) {
  json j;
  j["runs"] = json::array();
  for (const auto& c : r.runs) {
    json x = {{"label", c.run.label},
              {"hardware", c.run.hardware},
              {"source", c.run.source},
              {"measured_step_time_s", c.run.step_time_s},
              {"predicted_step_time_s", c.predicted.time.step},
              {"step_error", c.step_error}};
    if (c.run.peak_memory_bytes) x["measured_peak_memory_bytes"] = *c.run.peak_memory_bytes;
    x["predicted_memory_bytes"] = c.predicted.memory.total;
    if (c.memory_error) x["memory_error"] = *c.memory_error;
    if (c.loo_step_error) x["leave_one_out_step_error"] = *c.loo_step_error;
    j["runs"].push_back(x);
  }
  if (!r.skipped.empty()) {
    j["skipped"] = json::array();
    for (const auto& k : r.skipped)
      j["skipped"].push_back({{"label", k.label}, {"hardware", k.hardware}, {"reason", k.reason}});
  }
  j["mean_abs_step_error"] = r.mean_abs_step_error;
  j["max_abs_step_error"] = r.max_abs_step_error;
  if (r.mean_abs_loo_error) j["mean_abs_leave_one_out_error"] = *r.mean_abs_loo_error;
  j["step_scale"] = r.step_scale;
  for (const auto& [hw, sc] : r.part_scale)
    for (size_t k = 0; k < sc.size(); ++k)
      j["part_scale"][hw][to_string(static_cast<TimePart>(k))] = sc[k];
  return j;
}

}  // namespace hetrain::planning
