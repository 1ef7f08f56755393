// hetrain simulate: the scheduler of a real run, with durations from performance models or a
// hardware description and no kernel run; predicts step time, utilisation and bytes moved.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/config_flags.h"
#include "cli/onnx_cli.h"
#include "hetrain/base/error.h"
#include "hetrain/base/file_output.h"
#include "hetrain/base/thread_pool.h"
#include "hetrain/distributed/communicator.h"
#include "hetrain/distributed/grad_reducer.h"
#include "hetrain/distributed/sharded_optimizer.h"
#include "hetrain/insight/device_profile.h"
#include "hetrain/planning/catalog.h"
#include "hetrain/runtime/perf_model.h"
#include "hetrain/runtime/scheduler.h"
#include "hetrain/training/trainer.h"

namespace hetrain::cli {

namespace {
const char* const kModelFlags[] = {"batch-size", "optimizer",     "seed",      "threads",
                                   "hidden",     "widths",        "blocks",    "layers",
                                   "heads",      "width",         "context",   "dropout",
                                   "clip",       "memory-budget", "recompute", "bucket-mb"};

/// Sim devices modelled as catalog hardware: its f32 rate at its GEMM efficiency, its memory
/// bandwidth and its PCIe link.
void apply_hardware(std::vector<runtime::DeviceModel>& devs, const std::string& id) {
  std::string warning;
  planning::Catalog cat = planning::Catalog::load_default(&warning);
  if (!cat.contains(id)) {
    std::string known;
    for (const auto& h : cat.all()) known += (known.empty() ? "" : ", ") + h.id;
    fail("[simulate] --hardware: unknown hardware '", id, "' in ", cat.path, "; known: ", known);
  }
  const planning::Hardware& h = cat.get(id);
  for (auto& d : devs) {
    if (d.device.kind == DeviceKind::cpu) continue;
    d.hardware = id;
    d.slowdown = 1;
    d.host_cores = 0;  // hardware of its own, not a thread on this machine's cores
    d.gflops = h.tflops_f32 * 1e3 * h.gemm_efficiency;
    d.gbps = h.mem_bw_gbs;
    d.link_gbps = h.pcie_bw() > 0 ? h.pcie_bw() * 1e-9 : d.link_gbps;
    d.link_latency_s = h.alpha_intra_us * 1e-6;
  }
}

/// The CPU's roofline from this machine's device profile ('hetrain bench'), when there is one:
/// its measured f32 GEMM rate and triad bandwidth; sim devices keep their share of it.
void apply_local_profile(std::vector<runtime::DeviceModel>& devs) {
  std::string warning;
  planning::Catalog cat = planning::Catalog::load_default(&warning);
  if (!warning.empty()) std::fprintf(stderr, "warning: %s\n", warning.c_str());
  if (!cat.contains("local")) return;
  const planning::Hardware& h = cat.get("local");
  if (h.tflops_f32 <= 0 || h.mem_bw_gbs <= 0) return;
  const double f = h.tflops_f32 * 1e3 / devs[0].gflops, b = h.mem_bw_gbs / devs[0].gbps;
  for (auto& d : devs)
    if (d.hardware.empty()) {
      d.gflops *= f;
      d.gbps *= b;
    }
}

/// The gradient reduction of a data-parallel step on `ranks` of this machine's CPU ranks: the
/// trainer's buckets for this model (GradReducer's own layout) and the collective timings
/// 'mpirun -np RANKS hetrain bench --comm' stored in the device profile.
struct DdpPrediction {
  planning::DdpCommTime comm;
  std::vector<double> bucket_bytes;
  std::string backend, date;
};
DdpPrediction predict_ddp_comm(const training::TrainConfig& cfg, int ranks,
                               const training::ModelFactory& make_model) {
  std::string warning;
  planning::Catalog cat = planning::Catalog::load_default(&warning);
  const std::string how =
      "run 'hetrain bench' and 'mpirun -np " + std::to_string(ranks) + " hetrain bench --comm'";
  if (!cat.contains("local"))
    fail("[simulate] --ranks ", ranks, " needs this machine's device profile (",
         insight::device_profile_path(), ") with collective timings: ", how,
         warning.empty() ? "" : "; " + warning);
  const planning::Hardware& h = cat.get("local");
  const planning::CommTable* t = planning::find_comm_table(h.comm_tables, ranks);
  if (!t)
    fail("[simulate] --ranks ", ranks, ": the device profile ", insight::device_profile_path(),
         " has collective timings for ", planning::comm_table_sizes(h.comm_tables),
         " rank(s), not ", ranks, "; ", how);
  std::shared_ptr<nn::Module> model = make_model ? make_model(cfg) : training::build_model(cfg);
  std::vector<Tensor*> params = model->parameters();
  std::unique_ptr<distributed::Communicator> one = distributed::make_local_communicator();
  distributed::GradReducer layout(params, *one,
                                  distributed::ShardedOptimizer::bucket_options(0, cfg.bucket_mb));
  DdpPrediction r;
  r.backend = t->backend;
  r.date = t->date;
  for (const auto& bucket : layout.buckets()) {
    double bytes = 0;
    for (size_t i : bucket) bytes += 4.0 * static_cast<double>(params[i]->numel());
    r.bucket_bytes.push_back(bytes);
  }
  r.comm = planning::ddp_comm_time(*t, r.bucket_bytes);
  return r;
}

nlohmann::json ddp_json(const DdpPrediction& d, int ranks, double rank_step_s) {
  return {{"ranks", ranks},
          {"rank_step_time_s", rank_step_s},
          {"comm_s", d.comm.total_s},
          {"exposed_comm_s", d.comm.total_s},
          {"last_bucket_s", d.comm.last_s},
          {"bucket_bytes", d.bucket_bytes},
          {"collective", planning::kDdpReduceOp},
          {"timings",
           {{"profile", insight::device_profile_path()},
            {"world_size", ranks},
            {"backend", d.backend},
            {"date", d.date}}}};
}

void write_trace(const std::string& path, const runtime::SimulationLog& log,
                 const std::vector<runtime::DeviceModel>& devs) {
  nlohmann::json ev = nlohmann::json::array();
  for (size_t d = 0; d < devs.size(); ++d) {
    ev.push_back({{"ph", "M"},
                  {"name", "thread_name"},
                  {"pid", 1},
                  {"tid", d},
                  {"args", {{"name", devs[d].device.str()}}}});
    ev.push_back({{"ph", "M"},
                  {"name", "thread_name"},
                  {"pid", 1},
                  {"tid", 100 + d},
                  {"args", {{"name", "copies into " + devs[d].device.str()}}}});
  }
  for (const auto& t : log.tasks) {
    nlohmann::json e = {{"name", t.name},
                        {"ph", "X"},
                        {"pid", 1},
                        {"tid", (t.copy ? 100 : 0) + t.device},
                        {"ts", t.start * 1e6},
                        {"dur", (t.finish - t.start) * 1e6}};
    e["args"] = t.copy ? nlohmann::json{{"bytes", t.bytes}}
                       : nlohmann::json{
                             {"flops", t.flops}, {"bytes", t.bytes}, {"duration_from", t.source}};
    ev.push_back(std::move(e));
  }
  try {
    write_output_file(path,
                      nlohmann::json{{"traceEvents", ev}, {"displayTimeUnit", "ms"}}.dump() + "\n",
                      "--trace file");
  } catch (const Error& e) {
    fail("[simulate] ", e.what());
  }
}
}  // namespace

int cmd_simulate(const Args& args) {
  ArgParser p("simulate",
              "Predict a training step on a set of devices without running a kernel: the real\n"
              "scheduler (placement, copies, queues) with durations from the performance\n"
              "models this machine has measured ('hetrain perfmodel show') where they are\n"
              "trusted, else from each device's roofline (rate, bandwidth, link: the CPU's from\n"
              "'hetrain bench' when it has run, sim devices a core's share of it).");
  p.option("preset", "NAME", "fashion-mlp, fashion-cnn or gpt-mini", "gpt-mini")
      .option("config", "FILE", "TOML file of settings, as for 'hetrain train'")
      .option("devices", "LIST",
              "devices, CPU first: cpu,sim:0,sim:1@4 (sim:N@S: a sim device S times slower "
              "than one CPU core)",
              "cpu")
      .option("placement", "POLICY", "pinned (all on the first device), density or heft", "heft")
      .option("hardware", "ID", "model the sim devices as this catalog entry (data/hardware.json)")
      .option("ranks", "N",
              "data-parallel CPU ranks (mpirun -np N hetrain train): the step of one rank's "
              "share of --batch-size plus the gradient buckets' reduction, timed by 'mpirun -np "
              "N hetrain bench --comm' (stored in the device profile)",
              "1")
      .option("bucket-mb", "MIB", "gradient bucket size under --ranks (see 'hetrain train --help')")
      .option("steps", "N",
              "steps to simulate; the last one is reported (the first creates "
              "optimizer state)",
              "3")
      .option("trace", "FILE", "write the predicted timeline of all steps as Chrome trace JSON")
      .option("explain-threshold", "FLOPS",
              "--explain-placement lists nodes of at least this "
              "many FLOPs",
              "1e6")
      .option("onnx", "FILE",
              "simulate an imported ONNX model's training steps (see 'hetrain train --onnx')")
      .option("batch-size", "N", "examples per step")
      .option("optimizer", "NAME", "adamw or sgd")
      .option("seed", "N", "seed for initialisation")
      .option("threads", "N", "CPU worker threads (0: every core)")
      .option("memory-budget", "BYTES", "the CPU allocator's capacity (see 'hetrain train --help')")
      .option("recompute", "MODE", "none, selective, full or auto (see 'hetrain train --help')")
      .option("hidden", "LIST", "mlp hidden sizes")
      .option("widths", "LIST", "cnn stage widths")
      .option("blocks", "N", "cnn residual blocks per stage")
      .option("layers", "N", "gpt layers")
      .option("heads", "N", "gpt attention heads")
      .option("width", "N", "gpt model width")
      .option("context", "N", "gpt context length")
      .option("dropout", "X", "gpt dropout probability")
      .option("clip", "X", "gradient clipping norm (0: off)")
      .flag("explain-placement",
            "print, per node above the threshold, the device chosen and the predicted finish "
            "time on every device")
      .flag("json", "print the prediction as JSON on stdout")
      .epilog(
          "examples:\n"
          "  hetrain simulate --preset gpt-mini --devices cpu,sim:0 --json\n"
          "  hetrain simulate --devices cpu,sim:0,sim:1 --hardware a100-80gb-sxm "
          "--trace step.json\n"
          "  hetrain simulate --devices cpu,sim:0@4 --placement density --explain-placement\n"
          "  hetrain simulate --preset gpt-mini --threads 1 --ranks 2\n"
          "  hetrain simulate --onnx model.onnx --devices cpu,sim:0 --json");
  if (!p.parse(args)) return 0;
  if (!p.positional().empty())
    fail("[simulate] unexpected argument '", p.positional()[0], "'; see 'hetrain simulate --help'");

  training::TrainConfig cfg = config_from_flags(p, kModelFlags);
  training::ModelFactory make_model;
  if (p.given("onnx")) make_model = onnx_model_factory(cfg, p.get("onnx"), false);
  const long long steps = p.get_int("steps");
  if (steps < 1 || steps > 100) fail("[simulate] --steps must be in 1..100, got ", steps);
  const long long ranks = p.get_int("ranks");
  if (ranks < 1 || ranks > 4096) fail("[simulate] --ranks must be in 1..4096, got ", ranks);
  if (cfg.batch_size % ranks != 0)
    fail("[simulate] --batch-size ", cfg.batch_size, " must divide by --ranks ", ranks,
         " (each rank takes its share of the global batch)");
  std::optional<DdpPrediction> ddp;
  if (ranks > 1) {
    ddp = predict_ddp_comm(cfg, static_cast<int>(ranks), make_model);
    cfg.batch_size /= ranks;  // what one rank computes
  }
  const double threshold = p.get_double("explain-threshold");
  if (p.given("trace")) {
    try {
      check_output_file(p.get("trace"), "--trace file");
    } catch (const Error& e) {
      fail("[simulate] ", e.what());
    }
  }
  set_num_threads(cfg.threads);
  std::vector<runtime::DeviceModel> devs = runtime::parse_devices(p.get("devices"));
  apply_local_profile(devs);
  if (p.given("hardware")) apply_hardware(devs, p.get("hardware"));
  const runtime::PlacementPolicy policy = runtime::parse_placement(p.get("placement"));

  const std::string warn = runtime::perf_models().load(runtime::perf_model_path());
  if (!warn.empty()) std::fprintf(stderr, "warning: %s\n", warn.c_str());
  runtime::configure({.devices = devs, .placement = policy});

  runtime::SimulationLog log;
  log.explain = p.get_flag("explain-placement");
  struct Mark {
    double clock = 0, bytes = 0, host = 0, lb = 0;
    int64_t copies = 0, nodes = 0;
    size_t tasks = 0;
    std::vector<double> busy;
  };
  Mark before_last, end;
  {
    runtime::SimulateScope sim(log);
    training::run_synthetic_steps(
        cfg, steps,
        [&](int64_t s) {
          Mark m{log.clock,  log.bytes_moved, log.host_s,       log.lower_bound,
                 log.copies, log.nodes,       log.tasks.size(), log.busy};
          if (s == steps - 2) before_last = m;
          end = m;
        },
        make_model);
  }
  runtime::configure({});
  const double sim_s = end.clock - before_last.clock;  // one rank's step under --ranks
  const double step_s = sim_s + (ddp ? ddp->comm.total_s : 0);
  std::map<std::string, int64_t> sources;
  for (size_t i = before_last.tasks; i < log.tasks.size(); ++i)
    if (!log.tasks[i].copy) ++sources[log.tasks[i].source];

  nlohmann::json jdev = nlohmann::json::array();
  for (size_t d = 0; d < devs.size(); ++d) {
    const double busy = end.busy.size() > d
                            ? end.busy[d] - (before_last.busy.size() > d ? before_last.busy[d] : 0)
                            : 0;
    jdev.push_back(
        {{"device", devs[d].device.str()},
         {"model",
          {{"gflops", devs[d].gflops},
           {"gbps", devs[d].gbps},
           {"link_gbps", devs[d].link_gbps},
           {"slowdown", devs[d].slowdown},
           {"hardware", devs[d].hardware},
           {"perf_class", runtime::device_class(devs[d])}}},
         {"workers", devs[d].workers},
         {"busy_s", busy},
         {"utilisation", sim_s > 0 ? busy / (sim_s * std::max(1, devs[d].workers)) : 0}});
  }
  nlohmann::json explain = nlohmann::json::array();
  if (log.explain)
    for (size_t i = before_last.tasks; i < log.tasks.size(); ++i) {
      const auto& t = log.tasks[i];
      if (t.copy || t.flops < threshold) continue;
      nlohmann::json alt = nlohmann::json::object();
      for (size_t d = 0; d < t.finish_on.size(); ++d)
        if (t.finish_on[d] >= 0) alt[devs[d].device.str()] = t.finish_on[d] - before_last.clock;
      explain.push_back({{"node", t.name},
                         {"flops", t.flops},
                         {"device", devs[static_cast<size_t>(t.device)].device.str()},
                         {"finish_s", t.finish - before_last.clock},
                         {"finish_on_s", alt},
                         {"duration_from", t.source}});
    }
  if (p.given("trace")) write_trace(p.get("trace"), log, devs);

  const double bytes = end.bytes - before_last.bytes;
  const int64_t copies = end.copies - before_last.copies, nodes = end.nodes - before_last.nodes;
  const double host = end.host - before_last.host;
  if (p.get_flag("json")) {
    nlohmann::json j = {
        {"preset", cfg.preset},        {"placement", runtime::placement_name(policy)},
        {"steps_simulated", steps},    {"step_time_s", step_s},
        {"host_time_s", host},         {"lower_bound_s", end.lb - before_last.lb + host},
        {"nodes_per_step", nodes},     {"bytes_moved_per_step", bytes},
        {"copies_per_step", copies},   {"devices", jdev},
        {"duration_sources", sources}, {"perf_models", runtime::perf_model_path()}};
    if (log.explain) j["explain"] = explain;
    if (p.given("trace")) j["trace"] = p.get("trace");
    if (ddp) j["data_parallel"] = ddp_json(*ddp, static_cast<int>(ranks), sim_s);
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::printf("simulated %s on %s, placement %s: step time %.4f s (host %.4f s), %lld nodes\n",
              cfg.preset.c_str(), p.get("devices").c_str(), runtime::placement_name(policy), step_s,
              host, static_cast<long long>(nodes));
  if (ddp)
    std::printf(
        "  %lld ranks: %.4f s one rank's step (batch %lld) + %.4f s reducing %d gradient "
        "bucket(s) of %.3f MB (%s, measured %s; on CPU ranks none of it overlaps)\n",
        ranks, sim_s, static_cast<long long>(cfg.batch_size), ddp->comm.total_s, ddp->comm.buckets,
        [&] {
          double b = 0;
          for (double x : ddp->bucket_bytes) b += x;
          return b * 1e-6;
        }(),
        ddp->backend.c_str(), ddp->date.c_str());
  for (const auto& d : jdev)
    std::printf("  %-8s busy %.4f s  utilisation %5.1f%%\n", d["device"].get<std::string>().c_str(),
                d["busy_s"].get<double>(), 100 * d["utilisation"].get<double>());
  std::printf("  moved %.3f MB in %lld copies per step\n", bytes * 1e-6,
              static_cast<long long>(copies));
  std::printf("  durations from:");
  for (const auto& [k, v] : sources) std::printf(" %s %lld", k.c_str(), static_cast<long long>(v));
  std::printf(" (performance models: %s)\n", runtime::perf_model_path().c_str());
  if (log.explain) {
    std::printf("\nplacement of nodes of >= %.3g FLOPs (predicted finish, ms from step start):\n",
                threshold);
    for (const auto& e : explain) {
      std::printf("  %-20s %10.3g FLOPs -> %-6s %8.3f", e["node"].get<std::string>().c_str(),
                  e["flops"].get<double>(), e["device"].get<std::string>().c_str(),
                  1e3 * e["finish_s"].get<double>());
      std::printf("   alternatives:");
      for (const auto& [dn, t] : e["finish_on_s"].items())
        std::printf(" %s %.3f", dn.c_str(), 1e3 * t.get<double>());
      std::printf("  [%s]\n", e["duration_from"].get<std::string>().c_str());
    }
  }
  if (p.given("trace")) std::printf("trace: %s\n", p.get("trace").c_str());
  return 0;
}

}  // namespace hetrain::cli
