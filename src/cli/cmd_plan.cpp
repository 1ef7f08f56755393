// hetrain plan: memory, time and cost of a training job on hardware you may not have, and
// a search for the cheapest hardware, device count and strategy under budget and deadline.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <sstream>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/onnx_cli.h"
#include "cli/plan_validate.h"
#include "hetrain/base/error.h"
#include "hetrain/planning/calibration.h"
#include "hetrain/planning/explain.h"
#include "hetrain/planning/report.h"
#include "hetrain/planning/validate.h"

namespace hetrain::cli {

using namespace hetrain::planning;

namespace {

std::string fixed(double v, int prec) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", prec, v);
  return buf;
}

std::string sig(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.4g", v);
  return buf;
}

std::string money(double v) { return v >= 1000 ? "$" + fixed(v, 0) : "$" + fixed(v, 2); }

std::string with_commas(int64_t v) {
  std::string s = std::to_string(v), out;
  int n = 0;
  for (auto it = s.rbegin(); it != s.rend(); ++it) {
    if (n && n % 3 == 0) out.insert(out.begin(), ',');
    out.insert(out.begin(), *it);
    ++n;
  }
  return out;
}

std::string pad(const std::string& s, size_t w) {
  return s.size() >= w ? s + " " : s + std::string(w - s.size(), ' ');
}

void print_hardware(const Catalog& cat) {
  std::cout << "hardware catalog: " << cat.path << "\n"
            << pad("id", 16) << pad("bf16 TF", 9) << pad("f32 TF", 8) << pad("fp8 TF", 8)
            << pad("mem GB", 8) << pad("GB/s", 7) << pad("link", 16) << pad("link GB/s", 10)
            << pad("/node", 6) << pad("PCIe", 5) << pad("TDP W", 6) << "$/h\n";
  for (const auto& h : cat.all()) {
    std::cout << pad(h.id, 16) << pad(sig(h.tflops_bf16), 9) << pad(sig(h.tflops_f32), 8)
              << pad(sig(h.tflops_fp8), 8) << pad(sig(h.mem_gb), 8) << pad(sig(h.mem_bw_gbs), 7)
              << pad(h.link_kind, 16) << pad(sig(h.link_gbs), 10)
              << pad(std::to_string(h.gpus_per_node), 6) << pad(std::to_string(h.pcie_gen), 5)
              << pad(sig(h.tdp_w), 6) << (h.price_per_hour > 0 ? fixed(h.price_per_hour, 2) : "-")
              << "\n";
  }
  std::cout << "\nRates are dense peaks; link GB/s counts both directions; $/h per device, "
               "on-demand list price.\nSources and dates for every figure: "
            << cat.path << " (\"sources\").\n";
}

nlohmann::json hardware_json(const Catalog& cat) {
  nlohmann::json a = nlohmann::json::array();
  for (const auto& h : cat.all()) {
    nlohmann::json src;
    for (const auto& [k, s] : h.sources) src[k] = {{"doc", s.doc}, {"date", s.date}};
    a.push_back(
        {{"id", h.id},
         {"name", h.name},
         {"peak_tflops",
          {{"f32", h.tflops_f32},
           {"tf32", h.tflops_tf32},
           {"bf16", h.tflops_bf16},
           {"f16", h.tflops_f16},
           {"fp8", h.tflops_fp8}}},
         {"mem_gb", h.mem_gb},
         {"mem_bw_gbs", h.mem_bw_gbs},
         {"link", {{"kind", h.link_kind}, {"gbs", h.link_gbs}, {"gpus_per_node", h.gpus_per_node}}},
         {"pcie_gen", h.pcie_gen},
         {"tdp_w", h.tdp_w},
         {"price_usd_per_hour", h.price_per_hour},
         {"measured", h.measured},
         {"sources", src}});
  }
  return {{"catalog", cat.path}, {"hardware", a}};
}

/// Width of the labels of the memory and time rows: the longest label ("optimizer (states, master
/// weights)", 34) and a gap, so every value starts under the header's "GB (1e9)".
constexpr size_t kLabelWidth = 36;

void row(const std::string& name, double bytes) {
  std::cout << "  " << pad(name, kLabelWidth) << pad(fixed(bytes / 1e9, 2), 10)
            << fixed(bytes / (1024.0 * 1024 * 1024), 2) << "\n";
}

void trow(const std::string& name, double s) {
  std::cout << "  " << pad(name, kLabelWidth) << sig(s) << " s\n";
}

void print_plan(const Job& job, const Plan& p, const Hardware& hw) {
  const auto& m = p.memory;
  const auto& t = p.time;
  const ModelSpec& model = job.model;
  std::cout << "plan: " << model.name << " on " << p.gpus << " x " << p.hardware << " ("
            << p.strategy.describe() << ")\n"
            << "  data parallel " << p.dp << ", " << p.micro_batches
            << " micro-batches per step per replica, precision " << to_string(job.precision) << "\n"
            << "model: " << with_commas(p.params) << " parameters";
  if (model.is_transformer()) std::cout << ", seq " << model.tf.seq;
  std::cout << ", global batch " << job.global_batch << " samples ("
            << sig(static_cast<double>(job.global_batch * model.tokens_per_sample()))
            << " tokens) per step\n\n";
  std::cout << pad("memory per device", kLabelWidth + 2) << pad("GB (1e9)", 10) << "GiB (2^30)\n";
  row("weights", m.weights);
  row("gradients", m.gradients);
  row("optimizer (states, master weights)", m.optimizer);
  row("activations", m.activations);
  row("temporary buffers", m.temporary);
  row("reserved (runtime context)", m.reserved);
  row("total", m.total);
  row("device memory", m.capacity);
  if (m.host_per_device > 0) row("host memory for offload", m.host_per_device);
  std::cout << "  -> " << (p.fits ? "fits" : "DOES NOT FIT: " + p.fit_reason) << "\n\n";
  std::cout << "time per step\n";
  if (job.achieved_tflops) {
    trow("step at --achieved-tflops " + sig(*job.achieved_tflops), t.step);
    std::cout << "    (end to end, as published figures count it: FLOPs incl. recompute / wall "
                 "time;\n     communication, bubble and optimizer are inside; --kernel-tflops "
                 "adds them)\n";
  }
  if (!job.achieved_tflops) trow("compute (fwd + bwd + recompute)", t.compute);
  if (t.recompute > 0) trow("  of which recompute", t.recompute);
  if (t.tp_comm > 0) trow("tensor-parallel communication", t.tp_comm);
  if (t.pp_comm > 0) trow("pipeline sends", t.pp_comm);
  if (t.bubble > 0) trow("pipeline bubble", t.bubble);
  if (t.dp_comm > 0) {
    trow("data-parallel/ZeRO comm (total)", t.dp_comm);
    trow("  exposed after overlap", t.dp_exposed);
  }
  if (!job.achieved_tflops) {
    trow(p.strategy.offload == Offload::none ? "optimizer step" : "optimizer step (CPU)",
         t.optimizer);
    if (t.offload > 0) trow("offload transfers (exposed)", t.offload);
    trow("step", t.step);
  }
  std::cout << "\nthroughput: " << sig(p.tokens_per_s)
            << (model.is_transformer() ? " tokens/s" : " images/s") << ", "
            << sig(p.achieved_tflops_per_gpu) << " TFLOP/s per device (recompute included; "
            << "compute alone runs at " << sig(p.compute_tflops_per_gpu) << "), MFU "
            << fixed(100 * p.mfu, 1) << "% of " << sig(hw.peak_tflops(job.precision))
            << " TFLOP/s peak\n"
            << "flops per step: " << sig(p.flops_per_step) << " (model "
            << sig(p.model_flops_per_step) << ")\n"
            << "training: " << sig(job.tokens)
            << (model.is_transformer() ? " tokens = " : " images = ") << sig(p.steps) << " steps, "
            << sig(p.train_days) << " days, " << sig(p.gpu_hours) << " device-hours, "
            << (p.priced ? money(p.cost_usd) : std::string("cost unknown (no price; --price)"))
            << "\n";
}

void print_plan_line(const Plan& p) {
  std::cout << "  " << pad(p.hardware, 15) << pad(std::to_string(p.gpus), 6)
            << pad(p.priced ? money(p.cost_usd) : "-", 12) << pad(sig(p.train_days), 9)
            << pad(fixed(p.memory.total / 1e9, 1) + "/" + fixed(p.memory.capacity / 1e9, 0), 10)
            << pad(fixed(100 * p.mfu, 1) + "%", 7) << p.strategy.describe() << "\n";
}

void print_calibration(const CalibrationReport& rep, const std::string& path, bool calibrate) {
  std::cout << "measured runs (" << path << "): predicted vs measured step time\n";
  if (calibrate)
    for (const auto& k : rep.skipped)
      std::cout << "  skipped " << pad(k.label.empty() ? k.hardware : k.label, 40) << k.reason
                << "\n";
  for (const auto& c : rep.runs) {
    std::cout << "  " << pad(c.run.label.empty() ? c.run.job.model.name : c.run.label, 40)
              << pad(c.run.hardware, 12) << "measured " << sig(c.run.step_time_s)
              << " s, predicted " << sig(c.predicted.time.step) << " s, error "
              << fixed(100 * c.step_error, 1) << "%";
    if (c.memory_error) std::cout << "; memory error " << fixed(100 * *c.memory_error, 1) << "%";
    if (c.loo_step_error)
      std::cout << "; calibrated (leave-one-out) " << fixed(100 * *c.loo_step_error, 1) << "%";
    std::cout << "\n";
  }
  std::cout << "  mean |error| " << fixed(100 * rep.mean_abs_step_error, 1) << "%, max "
            << fixed(100 * rep.max_abs_step_error, 1) << "%";
  if (rep.mean_abs_loo_error)
    std::cout << "; after calibration (leave-one-out) " << fixed(100 * *rep.mean_abs_loo_error, 1)
              << "%";
  std::cout << "\n\n";
}

// --explain for one plan: the terms of its step time, largest first, and how the time moves
// with the next-smaller and next-larger device count.
void print_explain(const Job& job, const Catalog& cat, const Hardware& hw, const Plan& plan) {
  (void)cat;
  PlanExplanation ex = explain_plan(job, hw, plan);
  std::cout << "\nwhere the step time goes (" << sig(plan.time.step) << " s):\n";
  for (const auto& t : ex.terms)
    if (t.seconds >= 5e-4 * plan.time.step)  // terms under 0.05% are left out
      std::cout << "  " << pad(t.name, 52) << pad(sig(t.seconds) + " s", 12)
                << fixed(100 * t.seconds / plan.time.step, 1) << "%\n";
  auto neighbour = [&](const char* which, const std::optional<Plan>& q) {
    if (!q) {
      std::cout << "  " << which << ": none (" << (ex.note.empty() ? "no valid count" : ex.note)
                << ")\n";
      return;
    }
    std::cout << "  " << which << ": " << q->gpus << " devices";
    if (q->strategy.describe() != plan.strategy.describe())
      std::cout << " (" << strategy_changes(plan.strategy, q->strategy) << " to fit)";
    std::cout << ": step " << sig(q->time.step) << " s, " << sig(q->train_days) << " days ("
              << fixed(q->train_days / plan.train_days, 2) << "x), " << sig(q->gpu_hours)
              << " device-hours (" << fixed(q->gpu_hours / plan.gpu_hours, 2) << "x)\n";
  };
  std::cout << "\nwith fewer or more devices (" << plan.gpus << " now: " << sig(plan.train_days)
            << " days, " << sig(plan.gpu_hours) << " device-hours):\n";
  neighbour("next smaller", ex.smaller);
  neighbour("next larger", ex.larger);
}

int64_t positive_int(const ArgParser& p, const std::string& flag, double max = 9e15) {
  double v = parse_count(p.get(flag), "--" + flag);
  if (!(v >= 1) || v != std::floor(v) || v > max)
    fail("[plan] --", flag, " expects a positive integer up to ", max, ", got '", p.get(flag), "'");
  return static_cast<int64_t>(v);
}
// Device counts and parallel degrees are ints; a million devices is past any real cluster.
constexpr double kMaxDevices = 1e6;

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

}  // namespace

int cmd_plan(const Args& args) {
  ArgParser p("plan",
              "Memory per device, step time, days and cost of training a model on catalog "
              "hardware;\nwith hardware, device count or strategy left open, a search for the "
              "cheapest plan\nunder --budget and --deadline that says why the other hardware "
              "lost.");
  p.option("preset", "ID", "model preset (see --list-presets)")
      .option("model", "KIND",
              "build a model from flags: gpt (with --layers --hidden --heads --seq --vocab)")
      .option("onnx", "FILE",
              "an ONNX model: its parameter count and, per sample, the FLOPs of its matrix "
              "products and convolutions (planned as a data-parallel graph; --seq sizes a "
              "symbolic sequence axis)")
      .option("layers", "L", "transformer layers")
      .option("hidden", "H", "hidden size")
      .option("heads", "A", "attention heads")
      .option("seq", "S", "sequence length (also overrides a preset's)")
      .option("vocab", "V", "vocabulary size")
      .option(
          "tokens", "T",
          "training tokens (images for a conv net), e.g. 300e9, 1.4T (default: 20 per parameter)")
      .option("global-batch", "B", "samples per optimizer step (default: ~1M tokens; 1024 images)")
      .option("micro-batch", "b", "samples per device per micro-step (searched when not given)")
      .option("recompute-layers", "k",
              "with --recompute full: recompute only k of a device's layers, the others keep "
              "their activations (0 or not given: all; a search tries a quarter, half and "
              "three quarters when it is open)")
      .option("virtual-stages", "v",
              "interleaved pipeline schedule: layer chunks per device, bubble / v (needs --pp > 1; "
              "a fixed plan without it runs plain 1F1B, a search tries 1, 2, 4, 8)")
      .option("hardware", "ID[,ID..]", "catalog id(s); see --list-hardware")
      .option("gpus", "N", "device count")
      .option("tp", "t", "tensor-parallel size")
      .option("pp", "p", "pipeline-parallel stages")
      .option("zero", "0|1|2|3", "ZeRO stage")
      .option("offload", "MODE", "none|optimizer|optimizer+params")
      .option("recompute", "MODE", "none|selective|full")
      .option("precision", "P", "bf16|fp16|fp32", "bf16")
      .option("attention", "KIND",
              "fused (FlashAttention-style: no s x s scores kept) or unfused (Megatron-LM 2021)",
              "fused")
      .flag("no-sequence-parallel", "do not shard activations along the sequence under tp")
      .flag("no-dp-overlap",
            "all-reduce the data-parallel gradients after the backward instead of overlapping "
            "them with it (Megatron-LM 2019's local DDP)")
      .option("achieved-tflops", "X",
              "end-to-end TFLOP/s per device as papers publish it (FLOPs incl. recompute / "
              "wall time): the step is FLOPs / (devices x X), nothing added")
      .option("kernel-tflops", "X",
              "compute rate per device instead of the efficiency model; communication, "
              "bubble and optimizer are added")
      .option("price", "USD", "price per device-hour instead of the catalog's")
      .option("budget", "USD", "search: maximum cost")
      .option("deadline", "DAYS", "search: maximum training days")
      .option("max-gpus", "N", "search: largest device count", "4096")
      .option("top", "N", "search: plans to list", "10")
      .flag("search", "search even when hardware, count and every strategy dimension are given")
      .flag("explain",
            "the terms of the plan's step time and the neighbouring device counts; for a "
            "search also its decision path")
      .option("catalog", "FILE", "hardware catalog (default: data/hardware.json)")
      .option("measured", "FILE",
              "measured runs to report the planner's error against (default: "
              "$XDG_CACHE_HOME/hetrain/measured_runs.json if present)")
      .flag("calibrate", "correct each hardware's compute rate from the measured runs")
      .flag("validate",
            "predict the published training runs (--runs) and print the error, then refit "
            "the efficiency model on their train split")
      .option("runs", "FILE", "published runs for --validate (default: data/published_runs.json)")
      .flag("list-hardware", "print the hardware catalog")
      .flag("list-presets", "print the model presets")
      .flag("json", "machine-readable output")
      .epilog(
          "examples:\n"
          "  hetrain plan --list-hardware\n"
          "  hetrain plan --preset llama-7b --hardware a100-80gb-sxm --gpus 64 --zero 3 "
          "--micro-batch 2 --tokens 1T\n"
          "      (tp, pp, offload, recompute not given: searched on those 64 devices)\n"
          "  hetrain plan --validate   # the planner against published training runs\n"
          "  hetrain plan --preset gpt3-175b --tokens 300B --budget 5e6 --deadline 60 --explain\n"
          "  hetrain plan --model gpt --layers 24 --hidden 2048 --heads 16 --seq 2048 --vocab "
          "50257 --json\n"
          "numbers accept 300e9, 7B, 1.4T, 124M, 8k.");
  if (!p.parse(args)) return 0;
  if (!p.positional().empty()) fail("[plan] unexpected argument '", p.positional()[0], "'");
  bool json_out = p.get_flag("json");

  std::string warning;
  Catalog cat;
  if (p.given("catalog")) {
    cat = Catalog::load(p.get("catalog"));
    std::string prof = Catalog::device_profile_path();
    if (!prof.empty()) cat.load_device_profile(prof, &warning);
  } else {
    cat = Catalog::load_default(&warning);
  }
  if (!warning.empty()) std::cerr << "hetrain plan: warning: " << warning << "\n";

  if (p.get_flag("list-hardware")) {
    if (json_out)
      std::cout << hardware_json(cat).dump(2) << "\n";
    else
      print_hardware(cat);
    return 0;
  }
  if (p.get_flag("validate"))
    return plan_validate(cat, p.given("runs") ? p.get("runs") : default_published_runs_path(),
                         json_out);
  if (p.given("runs")) fail("[plan] --runs goes with --validate");
  if (p.get_flag("list-presets")) {
    nlohmann::json a = nlohmann::json::array();
    for (const auto& id : preset_ids()) {
      ModelSpec m = preset(id);
      if (json_out) {
        a.push_back({{"id", id}, {"params", m.params()}});
      } else {
        std::cout << pad(id, 12) << pad(with_commas(m.params()), 18);
        if (m.is_transformer())
          std::cout << "layers " << m.tf.layers << ", hidden " << m.tf.hidden << ", heads "
                    << m.tf.heads << ", seq " << m.tf.seq;
        else
          std::cout << "conv net, " << m.conv.layers.size() << " layers";
        std::cout << "\n";
      }
    }
    if (json_out) std::cout << a.dump(2) << "\n";
    return 0;
  }

  // ---- the model ----
  Job job;
  if (p.given("preset") + p.given("model") + p.given("onnx") > 1)
    fail("[plan] give one of --preset, --model and --onnx");
  if (p.given("onnx")) {
    for (const char* f : {"layers", "hidden", "heads", "vocab"})
      if (p.given(f)) fail("[plan] --", f, " does not apply to --onnx (only --seq may be given)");
    job.model = onnx_model_spec(p.get("onnx"), p.given("seq")
                                                   ? std::optional<int64_t>(positive_int(p, "seq"))
                                                   : std::nullopt);
  } else if (p.given("preset")) {
    job.model = preset(p.get("preset"));
    for (const char* f : {"layers", "hidden", "heads", "vocab"})
      if (p.given(f)) fail("[plan] --", f, " does not apply to --preset (only --seq may override)");
    if (p.given("seq")) {
      if (!job.model.is_transformer()) fail("[plan] --seq does not apply to a conv net");
      job.model.tf.seq = positive_int(p, "seq");
    }
  } else if (p.given("model")) {
    if (p.get("model") != "gpt")
      fail("[plan] --model expects 'gpt' (other architectures: use --preset), got '",
           p.get("model"), "'");
    for (const char* f : {"layers", "hidden", "heads", "seq", "vocab"})
      if (!p.given(f)) fail("[plan] --model gpt needs --", f);
    job.model =
        gpt_model(positive_int(p, "layers"), positive_int(p, "hidden"), positive_int(p, "heads"),
                  positive_int(p, "seq"), positive_int(p, "vocab"));
  } else {
    fail(
        "[plan] give a model: --preset ID (see --list-presets), --model gpt --layers L "
        "--hidden H --heads A --seq S --vocab V, or --onnx FILE");
  }
  job.model.check();
  job.precision = precision_from_string(p.get("precision"));
  if (p.get("attention") != "fused" && p.get("attention") != "unfused")
    fail("[plan] --attention expects fused or unfused, got '", p.get("attention"), "'");
  job.fused_attention = p.get("attention") == "fused";
  job.tokens = p.given("tokens") ? parse_count(p.get("tokens"), "--tokens")
                                 : 20.0 * static_cast<double>(job.model.params());
  // Past any real training run (~1e13 tokens) by five orders; larger values overflow days.
  if (job.tokens > 1e18) fail("[plan] --tokens must be at most 1e18, got '", p.get("tokens"), "'");
  if (p.given("global-batch")) {
    job.global_batch = positive_int(p, "global-batch");
  } else {
    job.global_batch =
        job.model.is_transformer()
            ? std::max<int64_t>(1, std::llround((1 << 20) / double(job.model.tf.seq)))
            : 1024;
  }
  if (p.given("achieved-tflops")) {
    job.achieved_tflops = p.get_double("achieved-tflops");
    if (!(*job.achieved_tflops > 0) || !std::isfinite(*job.achieved_tflops))
      fail("[plan] --achieved-tflops must be a positive number");
  }
  if (p.given("kernel-tflops")) {
    if (p.given("achieved-tflops"))
      fail(
          "[plan] give --achieved-tflops (end to end) or --kernel-tflops (compute only), not both");
    job.kernel_tflops = p.get_double("kernel-tflops");
    if (!(*job.kernel_tflops > 0) || !std::isfinite(*job.kernel_tflops))
      fail("[plan] --kernel-tflops must be a positive number");
  }
  if (p.given("price")) {
    job.price_per_hour = parse_count(p.get("price"), "--price");
    if (*job.price_per_hour > 1e6)
      fail("[plan] --price is per device-hour: at most 1e6, got '", p.get("price"), "'");
  }

  // ---- measured runs: the planner's own error ----
  nlohmann::json out;
  std::string measured = p.given("measured") ? p.get("measured") : default_measured_runs_path();
  bool have_measured =
      p.given("measured") || (!measured.empty() && std::filesystem::exists(measured));
  if (have_measured) {
    CalibrationReport rep = compare_measured(load_measured_runs(measured), cat);
    // Runs on hardware the catalog lacks (`local` before `hetrain bench`) are reported only
    // when they are needed: for --calibrate, or when nothing else could be compared.
    const bool calibrate = p.get_flag("calibrate");
    if (calibrate && rep.runs.empty())
      fail("[plan] --calibrate: no measured run in '", measured, "' can be compared: ",
           rep.skipped.empty() ? std::string("the file has no runs") : rep.skipped[0].reason);
    if (json_out)
      out["calibration"] = to_json(rep);
    else if (!rep.runs.empty())
      print_calibration(rep, measured, calibrate);
    if (calibrate) {
      cat = calibrated(cat, rep);
      if (!json_out)
        for (const auto& [id, scale] : rep.step_scale) {
          std::cout << "calibration applied: " << id;
          if (auto it = rep.part_scale.find(id); it != rep.part_scale.end()) {
            for (size_t k = 0; k < it->second.size(); ++k)
              std::cout << (k ? ", " : " ") << to_string(static_cast<TimePart>(k)) << " x"
                        << sig(it->second[k]);
            std::cout << " (least squares over its runs)\n\n";
          } else {
            std::cout << " compute time x" << sig(scale) << " (median measured/predicted)\n\n";
          }
        }
    }
  } else if (p.get_flag("calibrate")) {
    fail("[plan] --calibrate needs measured runs: --measured FILE (format: docs/PLANNING.md)");
  }

  std::vector<std::string> hw_ids =
      p.given("hardware") ? split(p.get("hardware")) : std::vector<std::string>{};
  for (const auto& id : hw_ids) cat.get(id);  // unknown ids fail here, listing the known ones
  // Hetrain's own engine (`local`) keeps its attention scores: unfused unless told otherwise.
  if (!p.given("attention") && hw_ids == std::vector<std::string>{"local"})
    job.fused_attention = false;
  // A fixed plan needs every strategy dimension; the ones not given are searched (with the
  // hardware and device count, when given, held fixed).
  bool strategy_given = true;
  for (const char* f : {"tp", "pp", "zero", "offload", "recompute", "micro-batch"})
    strategy_given = strategy_given && p.given(f);
  bool fixed_plan =
      hw_ids.size() == 1 && p.given("gpus") && strategy_given && !p.get_flag("search");
  Strategy s;
  if (p.given("tp")) s.tp = static_cast<int>(positive_int(p, "tp", kMaxDevices));
  if (p.given("pp")) s.pp = static_cast<int>(positive_int(p, "pp", kMaxDevices));
  if (p.given("zero")) {
    std::string z = p.get("zero");
    if (z != "0" && z != "1" && z != "2" && z != "3")
      fail("[plan] --zero expects 0, 1, 2 or 3, got '", z, "'");
    s.zero = z[0] - '0';
  }
  if (p.given("offload")) s.offload = offload_from_string(p.get("offload"));
  if (p.given("recompute")) s.recompute = recompute_from_string(p.get("recompute"));
  if (p.given("micro-batch")) s.micro_batch = positive_int(p, "micro-batch");
  if (p.given("recompute-layers")) {
    const std::string k = p.get("recompute-layers");
    s.recompute_layers =
        k == "0" ? 0 : static_cast<int>(positive_int(p, "recompute-layers", kMaxDevices));
  }
  if (p.given("virtual-stages"))
    s.virtual_stages = static_cast<int>(positive_int(p, "virtual-stages", kMaxDevices));
  s.sequence_parallel = !p.get_flag("no-sequence-parallel");
  s.overlap_dp = !p.get_flag("no-dp-overlap");

  if (fixed_plan) {
    const Hardware& hw = cat.get(hw_ids[0]);
    int gpus = static_cast<int>(positive_int(p, "gpus", kMaxDevices));
    // This machine's data-parallel ranks are charged the collectives bench --comm measured.
    const int dp = gpus / std::max(1, s.tp * s.pp);
    if (hw.measured && dp > 1 && !find_comm_table(hw.comm_tables, dp))
      fail("[plan] 'local' with ", dp, " data-parallel ranks needs collective timings for ", dp,
           " ranks in its device profile (it has them for: ", comm_table_sizes(hw.comm_tables),
           "); run 'mpirun -np ", dp, " hetrain bench --comm'");
    Plan plan = evaluate(job, hw, gpus, s);
    // Sizes, rates and counts are bounded where they are read; a duration or cost that still
    // overflows (a catalog entry without scale-out bandwidth asked to span nodes) is refused
    // rather than printed as inf or nan.
    if (!std::isfinite(plan.train_days) || !std::isfinite(plan.cost_usd))
      fail("[plan] this plan's numbers overflow on '", hw.id, "' with ", gpus,
           " devices: ", plan.train_days, " days, $", plan.cost_usd,
           " (check --tokens, --price, the model's sizes and the catalog entry)");
    std::optional<Plan> nearest;
    if (!plan.fits) nearest = nearest_fitting(job, hw, gpus, plan.strategy);
    if (json_out) {
      nlohmann::json j = to_json(plan);
      if (!plan.fits) j["nearest_fitting"] = nearest ? to_json(*nearest) : nlohmann::json();
      for (auto it = out.begin(); it != out.end(); ++it) j[it.key()] = it.value();
      std::cout << j.dump(2) << "\n";
      return 0;
    }
    if (!plan.fits) {
      std::cout << "DOES NOT FIT: " << plan.strategy.describe() << " on " << gpus << " x " << hw.id
                << " " << plan.fit_reason << "\n";
      if (nearest)
        std::cout << "nearest plan that fits: " << nearest->strategy.describe() << " ("
                  << strategy_changes(plan.strategy, nearest->strategy)
                  << "): " << sig(nearest->train_days) << " days, "
                  << fixed(nearest->memory.total / 1e9, 1) << " GB per device\n\n";
      else
        std::cout << "no strategy fits on " << gpus << " x " << hw.id
                  << "; more devices are needed (leave --gpus open to search)\n\n";
    }
    print_plan(job, plan, hw);
    if (p.get_flag("explain")) print_explain(job, cat, hw, plan);
    return 0;
  }

  SearchOptions opt;
  opt.hardware = hw_ids;
  if (p.given("gpus")) opt.gpus = {static_cast<int>(positive_int(p, "gpus", kMaxDevices))};
  opt.max_gpus = static_cast<int>(positive_int(p, "max-gpus", kMaxDevices));
  if (p.given("tp")) opt.tp = s.tp;
  if (p.given("pp")) opt.pp = s.pp;
  if (p.given("zero")) opt.zero = s.zero;
  if (p.given("offload")) opt.offload = s.offload;
  if (p.given("recompute")) opt.recompute = s.recompute;
  if (p.given("micro-batch")) opt.micro_batch = s.micro_batch;
  if (p.given("virtual-stages")) opt.virtual_stages = s.virtual_stages;
  if (p.given("recompute-layers")) opt.recompute_layers = s.recompute_layers;
  opt.sequence_parallel = s.sequence_parallel, opt.overlap_dp = s.overlap_dp;
  if (p.given("budget")) opt.budget_usd = parse_count(p.get("budget"), "--budget");
  if (p.given("deadline")) {
    opt.deadline_days = p.get_double("deadline");
    if (!(*opt.deadline_days > 0)) fail("[plan] --deadline must be a positive number of days");
  }
  opt.top = static_cast<size_t>(positive_int(p, "top", kMaxDevices));
  auto t0 = std::chrono::steady_clock::now();
  SearchResult r = search(job, cat, opt);
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (json_out) {
    nlohmann::json j = to_json(r);
    j["search_seconds"] = secs;
    for (auto it = out.begin(); it != out.end(); ++it) j[it.key()] = it.value();
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::cout << "search: " << job.model.name << " (" << with_commas(job.model.params())
            << " parameters), " << sig(job.tokens) << " tokens, global batch " << job.global_batch
            << ", " << to_string(job.precision) << "; " << r.evaluated << " plans in "
            << fixed(secs, 2) << " s\n";
  if (p.get_flag("explain")) {
    std::cout << "\ndecision path:\n";
    for (const auto& line : r.explanation) std::cout << "  " << line << "\n";
  }
  if (r.plans.empty()) {
    std::cout << "\nno plan meets every constraint.\n";
  } else {
    std::cout << "\nbest plan per hardware, cheapest first:\n  " << pad("hardware", 15)
              << pad("gpus", 6) << pad("cost", 12) << pad("days", 9) << pad("GB/dev", 10)
              << pad("MFU", 7) << "strategy\n";
    for (const auto& pl : r.plans) print_plan_line(pl);
    if (!r.alternatives.empty()) {
      std::cout << "\nnext best on " << r.plans.front().hardware << ":\n";
      for (const auto& pl : r.alternatives) print_plan_line(pl);
    }
  }
  if (!r.rejected.empty()) {
    std::cout << "\nrejected:\n";
    for (const auto& x : r.rejected) std::cout << "  " << pad(x.hardware, 15) << x.reason << "\n";
  }
  if (!r.plans.empty()) {
    std::cout << "\n";
    const Hardware& hw = cat.get(r.plans.front().hardware);
    print_plan(job, r.plans.front(), hw);
    if (p.get_flag("explain")) print_explain(job, cat, hw, r.plans.front());
  }
  return 0;
}

}  // namespace hetrain::cli
