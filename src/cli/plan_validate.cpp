#include "cli/plan_validate.h"

#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "hetrain/planning/validate.h"

namespace hetrain::cli {

using namespace hetrain::planning;

namespace {

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string pad(const std::string& s, size_t w) {
  return s.size() >= w ? s + " " : s + std::string(w - s.size(), ' ');
}

std::string figure(ReportedMetric m, double v) {
  switch (m) {
    case ReportedMetric::achieved_tflops_per_gpu:
      return fmt("%.0f TF/s/GPU", v);
    case ReportedMetric::mfu:
      return fmt("%.1f%% MFU", 100 * v);
    case ReportedMetric::tokens_per_s_per_gpu:
      return fmt("%.0f tok/s/GPU", v);
    case ReportedMetric::train_days:
      return v < 1 ? fmt("%.2f h", 24 * v) : fmt("%.2f days", v);
    case ReportedMetric::gpu_hours:
      return fmt("%.4g GPU-h", v);
  }
  return "?";
}

nlohmann::json model_json(const EfficiencyModel& m) {
  return {{"gemm_half_size", m.gemm_half_size},   {"elementwise_fraction", m.elementwise_fraction},
          {"fused_attention", m.fused_attention}, {"kernel_overhead_us", m.kernel_overhead_us},
          {"link_efficiency", m.link_efficiency}, {"step_overhead", m.step_overhead}};
}

void print_model(const char* what, const EfficiencyModel& m) {
  std::cout << "  " << pad(what, 34) << "gemm_half_size " << fmt("%.4g", m.gemm_half_size)
            << ", elementwise_fraction " << fmt("%.4g", m.elementwise_fraction)
            << ", fused_attention " << fmt("%.4g", m.fused_attention) << ",\n"
            << std::string(36, ' ') << "kernel_overhead_us " << fmt("%.4g", m.kernel_overhead_us)
            << ", link_efficiency " << fmt("%.4g", m.link_efficiency) << ", step_overhead "
            << fmt("%.4g", m.step_overhead) << "\n";
}

void print_summary(const char* what, const SplitSummary& s) {
  std::cout << "  " << pad(what, 10) << s.count << " runs: median |error| "
            << fmt("%.1f%%", 100 * s.median_abs_error) << ", mean "
            << fmt("%.1f%%", 100 * s.mean_abs_error) << ", worst "
            << fmt("%.1f%%", 100 * s.max_abs_error) << "\n";
}

}  // namespace

int plan_validate(const Catalog& catalog, const std::string& path, bool json_out) {
  const auto runs = load_published_runs(path);
  const ValidationReport rep = validate(runs, catalog, catalog.efficiency);
  const EfficiencyModel refit = fit_efficiency(runs, catalog);
  if (json_out) {
    nlohmann::json j;
    j["runs_file"] = path;
    j["efficiency_model"] = model_json(catalog.efficiency);
    j["refit_on_train"] = model_json(refit);
    for (const auto& p : rep.runs)
      j["runs"].push_back({{"id", p.run->id},
                           {"split", p.run->split},
                           {"metric", to_string(p.run->metric)},
                           {"reported", p.run->reported},
                           {"predicted", p.predicted},
                           {"error", p.error},
                           {"strategy", p.plan.strategy.describe()},
                           {"fits_memory_model", p.plan.fits},
                           {"software", p.run->software},
                           {"software_in_train", p.stack_in_train},
                           {"source", p.run->source}});
    for (auto [key, s] : {std::pair{"train", rep.train}, std::pair{"held_out", rep.held_out},
                          std::pair{"held_out_seen_software", rep.held_out_seen_stack},
                          std::pair{"held_out_new_software", rep.held_out_new_stack}})
      j[key] = {{"count", s.count},
                {"median_abs_error", s.median_abs_error},
                {"mean_abs_error", s.mean_abs_error},
                {"max_abs_error", s.max_abs_error}};
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::cout << "published runs (" << path << ") against the planner, catalog " << catalog.path
            << "\nerror on time: predicted step time / the step time the reported figure implies"
               " - 1\n\n"
            << "  " << pad("run", 22) << pad("split", 9) << pad("hardware", 15) << pad("gpus", 6)
            << pad("reported", 16) << pad("predicted", 16) << pad("error", 8) << "strategy\n";
  for (const auto& p : rep.runs) {
    const PublishedRun& r = *p.run;
    std::cout << "  " << pad(r.id, 22) << pad(r.split, 9) << pad(r.hardware, 15)
              << pad(std::to_string(r.gpus), 6) << pad(figure(r.metric, r.reported), 16)
              << pad(figure(r.metric, p.predicted), 16) << pad(fmt("%+.1f%%", 100 * p.error), 8)
              << p.plan.strategy.describe() << "\n";
  }
  bool header = false;
  for (const auto& p : rep.runs) {
    if (p.plan.fits) continue;
    if (!header)
      std::cout << "\nran as published, although the memory model says it does not fit (judged "
                   "on time):\n";
    header = true;
    std::cout << "  " << pad(p.run->id, 22) << p.plan.fit_reason << "\n";
  }
  std::string unseen;
  for (const auto& p : rep.runs)
    if (!p.run->train() && !p.stack_in_train)
      unseen += "\n  " + pad(p.run->id, 22) + p.run->software;
  if (!unseen.empty())
    std::cout << "\nheld out on software no train run used (the fit extrapolates):" << unseen
              << "\n";
  std::cout << "\n";
  print_summary("train", rep.train);
  print_summary("held-out", rep.held_out);
  std::cout << "  of the held-out runs:\n";
  print_summary("  software the fit saw", rep.held_out_seen_stack);
  print_summary("  software it did not", rep.held_out_new_stack);
  std::cout << "\nefficiency model\n";
  print_model("catalog (used above)", catalog.efficiency);
  print_model("refit on the train runs", refit);
  return 0;
}

}  // namespace hetrain::cli
