// hetrain profile: trains a few steps with the profiler on and shows where time and memory go
// against this machine's measured roofline.
#include <cstdio>
#include <fstream>
#include <iostream>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/config_flags.h"
#include "cli/onnx_cli.h"
#include "hetrain/base/error.h"
#include "hetrain/base/file_output.h"
#include "hetrain/base/thread_pool.h"
#include "hetrain/graph/recompute.h"
#include "hetrain/insight/device_profile.h"
#include "hetrain/insight/profiler.h"
#include "hetrain/insight/report.h"
#include "hetrain/training/memory_plan.h"
#include "hetrain/training/trainer.h"

namespace hetrain::cli {

namespace {
const char* const kSettingFlags[] = {"data",          "batch-size", "seed",     "threads",
                                     "memory-budget", "recompute",  "precision"};

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at <= s.size()) {
    const size_t end = std::min(s.find(',', at), s.size());
    out.push_back(s.substr(at, end - at));
    at = end + 1;
  }
  return out;
}

/// --sweep-layers: per depth and recompute mode, the memory model's prediction (dry run) and
/// the allocator's activations peak over the steps after the warm-up; the chart to --report.
int profile_sweep(const ArgParser& p, const training::TrainConfig& base, long long warmup,
                  const std::string& command) {
  if (base.model != "gpt")
    fail(
        "[profile] --sweep-layers applies to a GPT (gpt-mini or a config with model = \"gpt\"), "
        "not model '",
        base.model, "'");
  if (!p.given("report"))
    fail("[profile] --sweep-layers writes its chart to --report FILE (.svg: the chart alone)");
  std::vector<int64_t> depths;
  for (const std::string& v : split_commas(p.get("sweep-layers"))) {
    char* end = nullptr;
    const long long n = std::strtoll(v.c_str(), &end, 10);
    if (v.empty() || *end != '\0' || n < 1 || n > 100000)
      fail(
          "[profile] flag --sweep-layers: expected layer counts >= 1 separated by commas, such as "
          "8,16,32, got '",
          p.get("sweep-layers"), "'");
    depths.push_back(n);
  }
  // Every point's configuration is checked before the first one trains: a bad mode or depth
  // fails at once, not after the points before it have run.
  std::vector<training::TrainConfig> configs;
  for (int64_t layers : depths) {
    for (const std::string& mode : split_commas(p.get("sweep-recompute"))) {
      parse_recompute(mode, "[profile] flag --sweep-recompute");
      training::TrainConfig c = base;
      c.layers = layers;
      c.recompute = mode;
      training::validate(c, "profile");
      configs.push_back(std::move(c));
    }
  }
  std::vector<insight::DepthPoint> points;
  constexpr auto kActs = static_cast<size_t>(MemoryTag::activations);
  std::printf("%8s %10s %16s %16s\n", "layers", "recompute", "predicted (MiB)", "measured (MiB)");
  for (const training::TrainConfig& c : configs) {
    const int64_t layers = c.layers;
    const std::string& mode = c.recompute;
    insight::DepthPoint d{mode, layers, 0, training::dry_run(c, nullptr).peak[kActs]};
    training::StepHooks hooks;
    hooks.begin = [&](int64_t step) {
      if (step == warmup) host_allocator().reset_peak();
    };
    training::train(c, hooks);
    d.measured = host_allocator().stats().peak[kActs];
    std::printf("%8lld %10s %16.2f %16.2f\n", static_cast<long long>(layers), mode.c_str(),
                static_cast<double>(d.predicted) / 1048576.0,
                static_cast<double>(d.measured) / 1048576.0);
    points.push_back(d);
  }
  const std::string file = p.get("report"),
                    title = "Activations peak against depth: " + base.preset + ", width " +
                            std::to_string(base.width) + ", batch " +
                            std::to_string(base.batch_size);
  const bool svg = file.size() >= 4 && file.compare(file.size() - 4, 4, ".svg") == 0;
  write_output_file(file,
                    svg ? insight::render_depth_svg(points, title)
                        : insight::render_depth_html(points, title, command),
                    "--report file");
  std::printf("report: %s\n", file.c_str());
  return 0;
}

/// The files asked for: --trace, --json, --report.
void write_outputs(const ArgParser& p, const insight::ReportInput& in,
                   const insight::Profiler& prof) {
  if (p.given("trace")) {
    write_output_file(p.get("trace"), prof.chrome_trace().dump(), "--trace file");
    std::printf("trace: %s (%zu node events)\n", p.get("trace").c_str(), prof.nodes().size());
  }
  if (p.given("json")) {
    insight::write_json_atomic(p.get("json"), insight::profile_json(in));
    std::printf("json: %s\n", p.get("json").c_str());
  }
  if (p.given("report")) {
    write_output_file(p.get("report"), insight::render_html_report(in), "--report file");
    std::printf("report: %s\n", p.get("report").c_str());
  }
}

}  // namespace

int cmd_profile(const Args& args) {
  ArgParser p("profile",
              "Train a few steps of a preset or config with the profiler on (the second stage of\n"
              "the Hetrain workflow: analyse). Prints, per primitive: calls, total time, share of\n"
              "the step, achieved GFLOP/s and GB/s, compute density (FLOP/byte), and whether it\n"
              "is compute- or memory-bound against the roofline of this machine's device profile\n"
              "(FMA peak and triad bandwidth from 'hetrain bench'; a missing, stale or foreign\n"
              "profile is re-measured with 'hetrain bench --quick' first).");
  p.option("preset", "NAME", "fashion-mlp, fashion-cnn or gpt-mini", "gpt-mini")
      .option("config", "FILE", "TOML file of training settings (as for 'hetrain train')")
      .option("steps", "N", "profiled steps", "5")
      .option("warmup-steps", "N",
              "steps run first and not profiled (primitive creation, buffer cache, page faults)",
              "1")
      .option("data", "PATH", "dataset (see 'hetrain train --help'; default: the preset's)")
      .option("batch-size", "N", "examples per step (default: the preset's)")
      .option("seed", "N", "seed for initialisation, shuffling and dropout")
      .option("threads", "N", "worker threads (0: every core)")
      .option("memory-budget", "BYTES", "the CPU allocator's capacity (see 'hetrain train --help')")
      .option("recompute", "MODE", "none, selective, full or auto (see 'hetrain train --help')")
      .option("precision", "P",
              "fp32, bf16 or fp16: profile the autocast run (see 'hetrain train --help'; "
              "default: the preset's or --config's, else fp32)")
      .option("trace", "FILE",
              "write a Chrome trace JSON (open in https://ui.perfetto.dev or chrome://tracing): "
              "one track per worker thread, a step event around its nodes, FLOPs/bytes/shapes "
              "in each event's args, host memory by tag as a counter track")
      .option("json", "FILE", "write the per-primitive table, steps and device ceilings as JSON")
      .option("report", "FILE",
              "write a self-contained HTML page: roofline, time breakdown, memory timeline by "
              "tag, loss curve and the table (inline SVG, no scripts, no network)")
      .option("sweep-layers", "L1,L2,..",
              "instead of one profile: for a GPT at each depth and --sweep-recompute mode, the "
              "activations peak the memory model predicts and the allocator measures over the "
              "steps after the warm-up; --report FILE gets the chart (FILE.svg: the chart alone)")
      .option("sweep-recompute", "M1,M2,..", "the recompute modes of --sweep-layers",
              "none,full,auto")
      .option("onnx", "FILE",
              "profile an imported ONNX model's training steps (see 'hetrain train --onnx')")
      .flag("no-progress", "no live progress bar, even on a terminal")
      .epilog(
          "examples:\n"
          "  hetrain profile --preset gpt-mini --steps 5\n"
          "  hetrain profile --preset gpt-mini --precision bf16 --steps 10\n"
          "  hetrain profile --preset gpt-mini --steps 5 --trace trace.json --report "
          "report.html\n"
          "  hetrain profile --preset fashion-cnn --steps 3 --threads 1 --json profile.json");
  if (!p.parse(args)) return 0;
  if (!p.positional().empty())
    fail("[profile] unexpected argument '", p.positional()[0], "'; see 'hetrain profile --help'");

  const long long steps = p.get_int("steps"), warmup = p.get_int("warmup-steps");
  if (steps < 1) fail("[profile] --steps must be >= 1, got ", steps);
  if (warmup < 0) fail("[profile] --warmup-steps must be >= 0, got ", warmup);
  training::TrainConfig cfg = config_from_flags(p, kSettingFlags);
  cfg.steps = warmup + steps;
  cfg.log_every = cfg.steps;
  cfg.final_eval = false;
  cfg.save_every = 0;
  cfg.save_dir.clear();
  cfg.json_log.clear();
  cfg.progress = !p.get_flag("no-progress");
  training::validate(cfg, p.command());

  // Every output is checked before any work is done.
  for (const char* f : {"trace", "json", "report"})
    if (p.given(f)) insight::check_writable(p.get(f), std::string("--") + f + " file");

  set_num_threads(cfg.threads);
  cfg.threads = num_threads();  // fixed: a table over two team sizes would describe neither
  if (p.given("sweep-layers")) {
    std::string command = "hetrain profile";
    for (const auto& a : args) command += " " + a;
    return profile_sweep(p, cfg, warmup, command);
  }
  insight::DeviceProfile device =
      insight::stored_or_measured_profile(insight::device_profile_path());

  insight::Profiler prof;
  std::vector<std::pair<int64_t, double>> losses;
  training::StepHooks hooks;
  if (p.given("onnx")) hooks.make_model = onnx_model_factory(cfg, p.get("onnx"), p.given("data"));
  hooks.begin = [&](int64_t step) {
    if (step < warmup) return;
    if (step == warmup) prof.start();
    prof.begin_step(step);
  };
  hooks.end = [&](int64_t step, double loss) {
    losses.emplace_back(step, loss);
    if (step < warmup) return;
    prof.end_step(loss);
    if (step + 1 == cfg.steps) prof.stop();
  };
  training::train(cfg, hooks);
  prof.stop();

  insight::ReportInput in;
  in.title = cfg.preset;
  in.command = "hetrain profile";
  for (const auto& a : args) in.command += " " + a;
  in.config = training::config_to_toml(cfg);
  in.profiler = &prof;
  in.device = device;
  in.rows = insight::roofline_rows(prof.summary(), prof.step_seconds(), device);
  in.losses = losses;
  if (std::ifstream la("/proc/loadavg"); la) la >> in.load_average;

  std::printf(
      "profile of %s: %lld steps after %lld warm-up, %d threads; roofline of %s: %s, triad "
      "%.2f GB/s (per CPU second), ridge %.1f FLOP/byte; load average %.1f\n",
      cfg.preset.c_str(), steps, warmup, num_threads(), device.name.c_str(),
      insight::ceilings_text(in.rows, device).c_str(), device.roof_bw_gbs(),
      device.ridge_flop_per_byte(), in.load_average);
  std::fputs(
      insight::format_table(in.rows, prof.step_seconds(), static_cast<int>(prof.steps().size()))
          .c_str(),
      stdout);
  write_outputs(p, in, prof);
  return 0;
}

}  // namespace hetrain::cli
