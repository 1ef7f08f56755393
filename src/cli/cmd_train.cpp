#include <cstdio>
#include <ctime>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/config_flags.h"
#include "cli/onnx_cli.h"
#include "hetrain/base/error.h"
#include "hetrain/base/file_input.h"
#include "hetrain/base/thread_pool.h"
#include "hetrain/distributed/mpi.h"
#include "hetrain/insight/device_profile.h"
#include "hetrain/interop/onnx.h"
#include "hetrain/memory/array.h"
#include "hetrain/planning/calibration.h"
#include "hetrain/runtime/perf_model.h"
#include "hetrain/runtime/scheduler.h"
#include "hetrain/training/memory_plan.h"
#include "hetrain/training/nn.h"
#include "hetrain/training/trainer.h"

namespace hetrain::cli {

namespace {
// Flags that map one-to-one onto config settings.
// clang-format off
const char* const kSettingFlags[] = {
    "data",     "epochs",  "steps",    "batch-size", "lr",        "min-lr",       "optimizer",
    "seed",     "threads", "save",     "save-every", "resume",    "json-log",     "weight-decay",
    "momentum", "clip",    "schedule", "warmup",     "log-every", "eval-batches", "hidden",
    "widths",   "blocks",  "layers",   "heads",      "width",     "context",      "dropout",
    "precision", "grad-scaler", "loss-scale", "loss-scale-growth-interval", "loss-scale-floor",
    "grad-accum", "bucket-mb", "comm-timeout", "zero", "param-persistence-threshold",
    "divergence-factor", "divergence-steps", "memory-budget", "recompute", "state-device",
    "offload"};
// clang-format on
// The run as a record of the planner's measured-runs file (docs/PLANNING.md): the model as
// the planner describes it (IDX image sets are 28x28 grey images in 10 classes).
nlohmann::json measured_run_record(const training::TrainConfig& cfg, const training::TrainResult& r,
                                   const Args& args) {
  nlohmann::json model;
  std::string shape;
  if (cfg.model == "gpt") {
    model = {{"layers", cfg.layers},
             {"hidden", cfg.width},
             {"heads", cfg.heads},
             {"seq", cfg.context},
             {"vocab", 256}};
    shape = std::to_string(cfg.layers) + " layers, width " + std::to_string(cfg.width) +
            ", context " + std::to_string(cfg.context);
  } else if (cfg.model == "mlp") {
    model = {{"family", "mlp"}, {"inputs", 28 * 28}, {"hidden", cfg.hidden}, {"classes", 10}};
    shape = "hidden " + nlohmann::json(cfg.hidden).dump();
  } else {
    model = {{"family", "resnet-small"}, {"channels", 1},        {"image", 28},
             {"widths", cfg.widths},     {"blocks", cfg.blocks}, {"classes", 10}};
    shape = "widths " + nlohmann::json(cfg.widths).dump() + ", " + std::to_string(cfg.blocks) +
            " block(s) per stage";
  }
  std::string cmd = "hetrain train";
  for (const auto& a : args) cmd += " " + a;
  std::time_t t = std::time(nullptr);
  char date[32];
  std::strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", std::gmtime(&t));
  double load = -1;
  if (std::ifstream la("/proc/loadavg"); la) la >> load;
  const size_t skip = 5;
  return {{"label", cfg.preset + " (" + shape + ", batch " + std::to_string(cfg.batch_size) + ", " +
                        std::to_string(r.threads) + " threads) on this CPU"},
          {"model", model},
          {"hardware", "local"},
          {"gpus", 1},
          {"global_batch", cfg.batch_size},
          {"micro_batch", cfg.batch_size},
          {"precision", cfg.precision},
          {"step_time_s", training::steady_step_seconds(r, skip)},
          {"peak_memory_bytes", r.peak_memory_bytes.at("total")},
          {"threads", r.threads},
          {"steps_measured",
           r.step_seconds.size() > skip ? r.step_seconds.size() - skip : r.step_seconds.size()},
          {"load_average_1min", load},
          {"source", cmd + ", " + date}};
}

// Appends `rec` to the measured-runs file atomically (temporary file + rename). A file that
// is not a measured-runs file is left alone, with a warning.
void append_measured_run(const std::string& path, const nlohmann::json& rec) {
  nlohmann::json doc = {{"version", 1}, {"runs", nlohmann::json::array()}};
  if (std::ifstream in(path); in) {
    nlohmann::json old = nlohmann::json::parse(in, nullptr, false);
    if (old.is_discarded() || !json_version_is(old, 1) || !old.contains("runs") ||
        !old["runs"].is_array()) {
      std::fprintf(stderr, "warning: %s is not a measured-runs file; run not recorded\n",
                   path.c_str());
      return;
    }
    doc = std::move(old);
  }
  doc["runs"].push_back(rec);
  insight::write_json_atomic(path, doc);
  std::fprintf(stderr, "recorded step time %.4f s in %s\n", rec["step_time_s"].get<double>(),
               path.c_str());
}
int train_on(const ArgParser& p, const Args& args, training::TrainConfig& cfg,
             distributed::Communicator& comm, const std::optional<distributed::Fault>& fault,
             bool leader, training::StepHooks& hooks, const std::string& onnx_line);
}  // namespace

int cmd_train(const Args& args) {
  ArgParser p("train",
              "Train a model on this machine: the first stage of the Hetrain workflow (validate\n"
              "small). Settings come from the preset, then the --config file, then flags.");
  p.option("preset", "NAME", "fashion-mlp, fashion-cnn or gpt-mini", "fashion-mlp")
      .option("config", "FILE", "TOML file of settings (keys as the flags: lr = 3e-4, ...)")
      .option("data", "PATH",
              "dataset: Fashion-MNIST IDX directory (package dataset-fashion-mnist) or a text "
              "file/directory for gpt (default corpus: package fortunes)")
      .option("epochs", "N", "passes over the training set")
      .option("steps", "N", "optimizer steps (overrides --epochs)")
      .option("batch-size", "N", "examples per step")
      .option("lr", "X", "peak learning rate")
      .option("min-lr", "X", "final learning rate of the cosine schedule")
      .option("optimizer", "NAME", "adamw or sgd")
      .option("weight-decay", "X", "decoupled (adamw) or L2 (sgd) weight decay")
      .option("momentum", "X", "SGD momentum")
      .option("schedule", "NAME", "constant, step or cosine (with --warmup)")
      .option("warmup", "N", "linear warm-up steps")
      .option("clip", "X", "clip the global gradient norm to X (0: off)")
      .option("seed", "N", "seed for initialisation, shuffling and dropout")
      .option("threads", "N",
              "worker threads (0: every CPU this process may use, fewer while other processes "
              "keep some busy, checked every second; N: always N, for runs whose results must "
              "repeat bit for bit)")
      .option("grad-accum", "K",
              "micro-batches per step (gradients summed in order, one optimizer step; "
              "--batch-size stays the whole step's batch)",
              "1")
      .option("bucket-mb", "X",
              "under mpirun: MiB of gradients per reduction bucket (the first: 1 MiB)", "25")
      .option("zero", "S",
              "ZeRO stage: 0 replicates the optimizer state, 1 shards it over the ranks, 2 "
              "also shards the reduced gradients, 3 also the parameters (gathered bucket by "
              "bucket where they are read; every stage gives the same bits)",
              "0")
      .option("param-persistence-threshold", "N",
              "under --zero 3: parameters of at most N elements stay whole on every rank (in "
              "buckets of their own, all-gathered after the update) instead of being gathered "
              "where they are read",
              "0")
      .option("comm-timeout", "S",
              "under mpirun: abort the job when a collective takes longer than S seconds, "
              "naming the step, the collective and the missing ranks (0: no limit)",
              "600")
      .option("save", "DIR", "write a checkpoint (safetensors weights + training state) to DIR")
      .option("save-every", "N", "also checkpoint every N steps, into DIR/step-N")
      .option("resume", "DIR",
              "continue from a checkpoint; the result is bit-identical to an "
              "uninterrupted run")
      .option("json-log", "FILE", "write one JSON record per log interval and a final record")
      .option("log-every", "N", "steps per log interval")
      .option("eval-batches", "N", "validation batches for language models (0: all)")
      .option("hidden", "LIST", "mlp hidden sizes, e.g. 512,256")
      .option("widths", "LIST", "cnn stage widths, e.g. 16,32,64")
      .option("blocks", "N", "cnn residual blocks per stage")
      .option("layers", "N", "gpt layers")
      .option("heads", "N", "gpt attention heads")
      .option("width", "N", "gpt model width")
      .option("context", "N", "gpt context length (bytes)")
      .option("dropout", "X", "gpt dropout probability")
      .option("devices", "LIST",
              "devices to schedule on, CPU first: cpu,cuda:0 or cpu,sim:0,sim:1@4 (cuda:N: a GPU "
              "of this machine; sim:N@S: a test device with its own memory, S times slower than "
              "one CPU core; sim:N:mem=64MiB: that memory's capacity)",
              "cpu")
      .option("memory-budget", "BYTES",
              "the CPU allocator's capacity (2GiB, 512MiB, bytes): passing it stops the run "
              "with an out-of-memory error naming the request and the largest tensors alive")
      .option("recompute", "MODE",
              "activation checkpointing: none, selective (replay cheap nodes: elementwise, "
              "dropout, norms), full (keep only segment inputs) or auto (segments that fit "
              "--memory-budget at the least replayed work); results are bitwise those of none",
              "none")
      .option("placement", "POLICY",
              "where unpinned nodes run: pinned (first device), density (roofline + transfer "
              "cost) or heft (earliest finish time)",
              "heft")
      .option("state-device", "DEV",
              "where parameters and optimizer state live and the optimizer step runs, so that "
              "they stay there between steps: auto (the first GPU in --devices; without one, "
              "or under --zero, the host and where the scheduler places the step), cpu, or a "
              "device of --devices (cuda:N, sim:N; under --zero its shards and gradient "
              "buffers then live there, with NCCL collectives on a GPU)",
              "auto")
      .option("offload", "WHAT",
              "none, or optimizer: the optimizer state and step on the host while parameters "
              "and gradients stay on the state device (a GPU, or a sim device); or "
              "optimizer+params (--zero 3): the parameter shards on the host too, each bucket "
              "gathered onto the state device where it is read and freed after",
              "none")
      .option("precision", "P",
              "fp32, bf16 or fp16: autocast runs matmul, conv and attention in bf16/fp16 and "
              "softmax, norms, losses and accumulating reductions in f32; parameters, gradients "
              "and optimizer state stay f32",
              "fp32")
      .option("grad-scaler", "MODE",
              "dynamic loss scaling: auto (on for fp16, off for bf16/fp32), on or off", "auto")
      .option("loss-scale", "X", "the grad scaler's initial loss scale", "65536")
      .option("loss-scale-growth-interval", "N",
              "clean steps after which the scale doubles (it halves on an inf/NaN gradient, "
              "and that step is skipped)",
              "2000")
      .option("loss-scale-floor", "X",
              "stop with an error when the scale falls below X (gradients non-finite at any "
              "scale)",
              "1")
      .option("onnx", "FILE",
              "fine-tune an imported ONNX model instead of the preset's: images (N, 1, 28, 28) "
              "-> 10 logits train on Fashion-MNIST, byte ids (N, T) -> 256 logits per position on "
              "the text corpus; the initializers are the parameters")
      .option("loss", "NAME", "the training loss (cross-entropy: the only one yet)",
              "cross-entropy")
      .option("export-onnx", "FILE",
              "after training, write the model as ONNX (as 'hetrain export'; checked and "
              "written before the run's result is printed)")
      .option("export-opset", "N", "opset of --export-onnx, 13..21", "17")
      .option("divergence-factor", "F",
              "stop with an error when a step's loss exceeds F times the first step's (0: never)",
              "10000")
      .option("divergence-steps", "N",
              "stop with an error after N steps in a row skipped for inf/NaN gradients (0: never)",
              "100")
      .flag("dry-run",
            "predict one training step's peak memory by tag from its graph (with --recompute's "
            "plan; auto chooses one for --memory-budget), print it and exit: nothing is trained")
      .flag("no-progress", "no live progress bar, even on a terminal")
      .flag("json", "print the final result as JSON on stdout")
      .flag("no-record",
            "do not append the run's step time to $XDG_CACHE_HOME/hetrain/measured_runs.json "
            "(read by 'hetrain plan --measured') nor its kernel times to "
            "$XDG_CACHE_HOME/hetrain/perfmodel.json (read by the scheduler and 'hetrain "
            "simulate')")
      .epilog(
          "examples:\n"
          "  hetrain train --preset fashion-mlp\n"
          "  hetrain train --preset gpt-mini --steps 300 --save ckpt --json-log log.jsonl\n"
          "  hetrain train --preset gpt-mini --steps 600 --resume ckpt\n"
          "  hetrain train --preset fashion-cnn --precision bf16\n"
          "  hetrain train --preset gpt-mini --precision fp16 --json-log log.jsonl  "
          "# loss_scale, skipped_steps\n"
          "  mpirun -np 2 hetrain train --preset gpt-mini --save ckpt  "
          "# data parallel: bitwise equal to --grad-accum 2");
  if (!p.parse(args)) return 0;
  if (!p.positional().empty())
    fail("[train] unexpected argument '", p.positional()[0], "'; see 'hetrain train --help'");

  training::TrainConfig cfg = config_from_flags(p, kSettingFlags);
  training::StepHooks hooks;
  if (p.get("loss") != "cross-entropy")
    fail("[train] --loss must be cross-entropy, got '", p.get("loss"), "'");
  if (p.given("onnx")) {
    if (p.given("export-onnx"))
      fail(
          "[train] --export-onnx writes Hetrain's own models; a model from --onnx is already ONNX");
    hooks.make_model = onnx_model_factory(cfg, p.get("onnx"), p.given("data"));
  }
  std::string onnx_line;
  if (p.given("export-onnx")) {
    interop::OnnxExportOptions opt;
    opt.opset = static_cast<int>(p.get_int("export-opset"));
    if (opt.opset < 13 || opt.opset > interop::kOnnxMaxOpset)
      fail("[train] --export-opset must be between 13 and ", interop::kOnnxMaxOpset, ", got ",
           opt.opset);
    const std::string path = p.get("export-onnx");
    insight::check_writable(path, "--export-onnx file");
    hooks.finished = [&cfg, &onnx_line, path, opt](nn::Module& model) {
      onnx_line = export_info_line(interop::export_onnx(cfg, model, path, opt), path);
    };
  }
  cfg.progress = !p.get_flag("no-progress");
  training::validate(cfg);
  if (p.get_flag("dry-run")) {
    training::dry_run(cfg, stdout);
    return 0;
  }
  const std::optional<distributed::Fault> fault = distributed::fault_from_env();
  // Under mpirun: one rank of a data-parallel job; otherwise a world of one.
  std::unique_ptr<distributed::Communicator> comm =
      distributed::make_world_communicator({.timeout_s = cfg.comm_timeout});
  const bool leader = comm->rank() == 0;
  try {
    return train_on(p, args, cfg, *comm, fault, leader, hooks, onnx_line);
  } catch (const Error& e) {
    if (comm->size() == 1) throw;
    std::fprintf(stderr, "hetrain train: rank %d: error: %s\n", comm->rank(), e.what());
    comm->abort_job(1);  // the other ranks must not wait for this one
    throw;
  }
}

namespace {
int train_on(const ArgParser& p, const Args& args, training::TrainConfig& cfg,
             distributed::Communicator& comm, const std::optional<distributed::Fault>& fault,
             bool leader, training::StepHooks& hooks, const std::string& onnx_line) {
  std::string record_path;
  // Only rank 0 records the run and the kernel times (one writer per file).
  if (!p.get_flag("no-record") && !p.given("onnx") && leader) {
    record_path = planning::default_measured_runs_path();
    try {
      insight::check_writable(record_path, "measured-runs file");
    } catch (const Error& e) {
      std::fprintf(stderr, "warning: %s; the run will not be recorded\n", e.what());
      record_path.clear();
    }
  }

  const auto policy = runtime::parse_placement(p.get("placement"));
  set_num_threads(cfg.threads);
  runtime::configure({.devices = runtime::parse_devices(p.get("devices")), .placement = policy});
  // Kernel times of the first steps calibrate the performance models (saved after the run).
  const std::string perf_path =
      p.get_flag("no-record") || !leader ? "" : runtime::perf_model_path();
  if (!perf_path.empty()) {
    const std::string warn = runtime::perf_models().load(perf_path);
    if (!warn.empty()) std::fprintf(stderr, "warning: %s\n", warn.c_str());
    runtime::set_perf_recording(true);
  }

  const TransferStats moved0 = transfer_stats();
  if (fault && fault->point.empty())
    hooks.begin = [&](int64_t step) { distributed::inject_fault(*fault, comm.rank(), step); };
  if (fault && !fault->point.empty())
    hooks.checkpoint = [&](int64_t step, const std::string& point) {
      if (point == fault->point) distributed::inject_fault(*fault, comm.rank(), step);
    };
  if (!leader) hooks.finished = nullptr;  // rank 0 exports
  training::TrainResult r = training::train(cfg, hooks, comm);
  if (!leader) return 0;
  if (!onnx_line.empty()) std::fprintf(stderr, "%s\n", onnx_line.c_str());
  runtime::set_perf_recording(false);
  if (runtime::heterogeneous()) {
    const runtime::SchedulerStats ss = runtime::scheduler_stats();
    const TransferStats moved = transfer_stats();
    std::fprintf(stderr,
                 "scheduler (%s over %s): %lld placements computed, %lld reused, %lld copies "
                 "(%.1f MB)\n",
                 runtime::placement_name(policy), p.get("devices").c_str(),
                 static_cast<long long>(ss.plans), static_cast<long long>(ss.plan_hits),
                 static_cast<long long>(moved.copies - moved0.copies),
                 1e-6 * static_cast<double>(moved.bytes - moved0.bytes));
  }
  if (!perf_path.empty()) {
    try {
      runtime::perf_models().save(perf_path);
    } catch (const Error& e) {
      std::fprintf(stderr, "warning: performance models not saved: %s\n", e.what());
    }
  }

  // Recording is a by-product: a full disk or an unreadable cache never fails the training.
  if (!record_path.empty() && r.team_changes > 0) {
    // Its steps ran on more than one team size, and other work shared the CPUs: its step time
    // describes neither team, and would mislead the planner's calibration.
    std::fprintf(stderr,
                 "note: run not recorded in %s: other processes kept CPUs busy and the team "
                 "changed size %lld time(s) during the run\n",
                 record_path.c_str(), static_cast<long long>(r.team_changes));
    record_path.clear();
  }
  if (!record_path.empty()) {
    try {
      append_measured_run(record_path, measured_run_record(cfg, r, args));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "warning: run not recorded in %s: %s\n", record_path.c_str(), e.what());
    }
  }

  double peak_mib = static_cast<double>(r.peak_memory_bytes["total"]) / (1024.0 * 1024.0);
  if (p.get_flag("json")) {
    nlohmann::json j = {{"steps", r.steps},
                        {"train_loss", r.train_loss},
                        {"wall_s", r.wall_s},
                        {"samples_per_s", r.samples_per_s},
                        {"peak_memory_bytes", r.peak_memory_bytes},
                        {"precision", r.precision},
                        {"skipped_steps", r.skipped_steps},
                        {"world_size", r.world_size},
                        {"comm_s", r.comm_s},
                        {"exposed_comm_s", r.exposed_comm_s}};
    if (r.grad_scaler) j["loss_scale"] = r.loss_scale;
    if (r.test_accuracy >= 0) {
      j["test_accuracy"] = r.test_accuracy;
      j["test_loss"] = r.test_loss;
    } else {
      j["val_loss"] = r.val_loss;
      j["unigram_entropy"] = r.unigram_entropy;
    }
    std::cout << j.dump(2) << "\n";
  } else if (r.test_accuracy >= 0) {
    std::printf(
        "result: test accuracy %.2f%% (test loss %.4f), train loss %s, %lld steps in %.1f s, "
        "%.0f samples/s, peak memory %.1f MiB\n",
        100.0 * r.test_accuracy, r.test_loss, training::format_loss(r.train_loss).c_str(),
        static_cast<long long>(r.steps), r.wall_s, r.samples_per_s, peak_mib);
  } else {
    std::printf(
        "result: val loss %.4f nats/byte (unigram entropy %.4f, ratio %.2f), train loss %s, "
        "%lld steps in %.1f s, %.0f samples/s, peak memory %.1f MiB\n",
        r.val_loss, r.unigram_entropy, r.val_loss / r.unigram_entropy,
        training::format_loss(r.train_loss).c_str(), static_cast<long long>(r.steps), r.wall_s,
        r.samples_per_s, peak_mib);
  }
  return 0;
}

}  // namespace

}  // namespace hetrain::cli
