// The training loop behind `hetrain train`: presets, configuration, checkpoints with exact
// resume, progress display and a JSON log.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "hetrain/memory/device.h"

namespace hetrain::nn {
class Module;
}

namespace hetrain::distributed {
class Communicator;
}

namespace hetrain::training {

struct TrainConfig {
  std::string preset = "fashion-mlp";  // fashion-mlp | fashion-cnn | gpt-mini
  std::string model;                   // mlp | cnn | gpt (from the preset)
  std::string data;                    // dataset directory or text file/dir
  // model shape
  std::vector<int64_t> hidden;  // mlp hidden sizes
  std::vector<int64_t> widths;  // cnn stage widths
  int64_t blocks = 1;           // cnn residual blocks per stage
  int64_t layers = 4, heads = 4, width = 128, context = 64;
  double dropout = 0.0;
  // optimisation
  int64_t epochs = 0, steps = 0;  // steps wins when > 0
  int64_t batch_size = 128;
  double lr = 1e-3, min_lr = 0, weight_decay = 0, momentum = 0.9, clip = 0;
  std::string optimizer = "adamw";  // adamw | sgd
  std::string schedule = "cosine";  // constant | step | cosine
  int64_t warmup = 0;
  uint64_t seed = 0;
  int threads = 0;  // 0: every CPU of the process's affinity mask that other work leaves free
  // memory: the CPU allocator's capacity in bytes (0: no limit); passing it is an
  // OutOfMemoryError naming the request and what is alive
  int64_t memory_budget = 0;
  // activation checkpointing (graph/recompute.h): none | selective | full | auto (auto fits
  // memory_budget at the least replayed work)
  std::string recompute = "none";
  // data parallelism and accumulation: a step is grad_accum micro-batches on each of the
  // world's ranks, batch_size examples in all (the global batch)
  int64_t grad_accum = 1;
  double bucket_mb = 25;  // gradient bucket size (the first bucket: at most 1 MiB)
  int64_t param_persistence_threshold = 0;  // zero 3: parameters this small stay whole
  // ZeRO stage of the sharded optimizer (distributed/sharded_optimizer.h): 0 replicates the
  // optimizer state, 1 shards it, 2 also shards the reduced gradients
  int64_t zero = 0;
  double comm_timeout = 600;  // seconds a collective may take before the job is aborted
  // where the parameters and optimizer state (under ZeRO: their shards and the gradient
  // buffers) live and the optimizer step runs: auto (the first GPU among the configured
  // devices, as PyTorch's model.to("cuda"); without one, or under ZeRO, the host, the step
  // wherever the scheduler places it), cpu, or a configured device (cuda:N, sim:N; under ZeRO
  // sim:N only: its collectives need host-addressable memory)
  std::string state_device = "auto";
  // offload (training/offload.h): none, optimizer (the optimizer state and step on the host
  // while parameters and gradients stay on the state device, an accelerator), or
  // optimizer+params (zero 3: the parameter shards on the host too, the gathered buckets on
  // the state device)
  std::string offload = "none";
  // mixed precision (graph/autocast.h, training/amp.h)
  std::string precision = "fp32";    // fp32 | bf16 | fp16
  std::string grad_scaler = "auto";  // auto (on for fp16 only) | on | off
  double loss_scale = 65536.0;       // the scaler's initial scale
  int64_t loss_scale_growth_interval = 2000;
  double loss_scale_floor = 1.0;  // training stops when the scale falls below it
  // divergence: training stops with an error when a step's loss exceeds divergence_factor
  // times the first step's, or after divergence_steps skipped steps in a row (0: never)
  double divergence_factor = 1e4;
  int64_t divergence_steps = 100;
  // output
  std::string save_dir, resume_dir, json_log;
  int64_t save_every = 0, log_every = 50;
  int64_t eval_batches = 0;  // language models: validation batches (0: all)
  bool progress = true;      // a live bar when stderr is a terminal
  bool final_eval = true;    // evaluate on the test/validation set after the last step
};

/// The device cfg.state_device names among the runtime's configured devices, where the optimizer
/// step is pinned; none for auto without a GPU or under ZeRO (the scheduler places the step).
/// Throws naming the value when it is not a configured device, or a GPU under ZeRO.
std::optional<Device> resolve_state_device(const TrainConfig& cfg);

// Reading and checking settings. `command` is the subcommand whose flags or files gave them
// (train, profile, simulate): every error these throw starts with "[command] ".

/// A preset's defaults; throws for an unknown name (listing the known ones).
TrainConfig preset_config(const std::string& name, const std::string& command = "train");
std::vector<std::string> preset_names();
/// Applies "key = value" settings (TOML file keys or flags; '-' and '_' are the same) and
/// checks every value; an unknown key or bad value names it and where it came from.
void apply_setting(TrainConfig& cfg, const std::string& key, const std::string& value,
                   const std::string& origin, const std::string& command = "train");
/// Reads a TOML file of settings (top-level keys, or keys inside any table). Its 'preset' key,
/// applied first, is skipped when allow_preset is false (a --preset flag wins).
void apply_toml_file(TrainConfig& cfg, const std::string& path, bool allow_preset = true,
                     const std::string& command = "train");
/// The same for TOML text; errors name `origin` (a checkpoint's metadata, say).
void apply_toml_string(TrainConfig& cfg, const std::string& text, const std::string& origin,
                       bool allow_preset = true, const std::string& command = "train");
/// Checks the whole configuration for consistency (positive sizes, known names, ...).
void validate(const TrainConfig& cfg, const std::string& command = "train");
std::string config_to_toml(const TrainConfig& cfg);

struct TrainResult {
  int64_t steps = 0;
  double train_loss = 0;
  double test_loss = 0, test_accuracy = -1;  // classification
  double val_loss = -1;                      // language models
  double unigram_entropy = -1;               // language models: of the validation bytes
  double wall_s = 0, samples_per_s = 0;
  std::map<std::string, int64_t> peak_memory_bytes;
  /// Growth of the process's resident memory over the training loop (its high-water mark
  /// minus the RSS before the first step; process_memory.h), -1 where it cannot be measured.
  /// For comparison with other frameworks, which have no allocator counters in common with ours.
  int64_t peak_rss_growth_bytes = -1;
  std::vector<double> step_seconds;  // wall time of each step of this run (data to optimizer)
  int threads = 1;                   // worker threads used (at the end of the run)
  int64_t team_changes = 0;          // times the team followed the free CPUs (--threads 0)
  std::string precision = "fp32";
  int world_size = 1;           // ranks that trained together
  double comm_s = 0;            // time in gradient collectives over the run
  double exposed_comm_s = 0;    // time the step waited for them
  bool ranks_identical = true;  // every rank ended with the same parameter bytes
  bool grad_scaler = false;     // whether dynamic loss scaling ran
  double loss_scale = 0;        // the scale at the end (0 without a scaler)
  int64_t skipped_steps = 0;    // optimizer steps skipped for non-finite gradients
};

/// Median of step_seconds without the first `skip` steps (warm-up: primitive creation,
/// buffer cache, page faults); all steps when there are no more than `skip`.
double steady_step_seconds(const TrainResult& r, size_t skip = 5);

/// Builds the model a run trains in place of build_model's (train --onnx: an imported graph).
using ModelFactory = std::function<std::shared_ptr<nn::Module>(const TrainConfig& cfg)>;

/// Called around each optimizer step (the profiler's step marks): begin before the batch is
/// loaded, end after the step's loss has been read. Either may be empty.
struct StepHooks {
  std::function<void(int64_t step)> begin;
  std::function<void(int64_t step, double loss)> end;
  /// Called once after the final evaluation and checkpoint, with the trained model in eval
  /// mode (`hetrain train --export-onnx`).
  std::function<void(nn::Module& model)> finished;
  /// Called while a sharded checkpoint of `step` is written (fault injection for the crash
  /// tests): at "shard" on every rank once its shard file is written, at "commit" on rank 0
  /// once the index is.
  std::function<void(int64_t step, const std::string& point)> checkpoint;
  /// When set, builds the model instead of build_model (its input and output must be the
  /// family's: images -> 10 logits, or byte ids -> 256 logits per position).
  ModelFactory make_model;
};
/// Whether cfg trains with a GradScaler (grad-scaler on, or auto with fp16).
bool uses_grad_scaler(const TrainConfig& cfg);

/// The model train() builds for cfg (mlp, cnn or gpt), initialised from cfg.seed.
std::shared_ptr<nn::Module> build_model(const TrainConfig& cfg);
/// The configuration a checkpoint directory (checkpoint.h) was trained with (its training state's
/// metadata) and its weights loaded into the model build_model makes of it.
std::pair<TrainConfig, std::shared_ptr<nn::Module>> load_trained_model(const std::string& dir);

/// Runs training as configured. Output (progress, log lines) goes to stderr; the JSON log
/// to cfg.json_log.
TrainResult train(const TrainConfig& cfg, const StepHooks& hooks = {});
/// Data-parallel training over comm's ranks (every rank calls it with the same cfg): rank 0's
/// parameters and buffers are broadcast at the start; rank r trains on examples
/// [r * B / N, (r + 1) * B / N) of each global batch of B = cfg.batch_size, as cfg.grad_accum
/// micro-batches; gradients are summed over all N * grad_accum micro-batches in a fixed
/// order (distributed/grad_reducer.h), so the result is bitwise that of one process with
/// --grad-accum N * grad_accum. Only rank 0 prints, logs and checkpoints.
TrainResult train(const TrainConfig& cfg, const StepHooks& hooks, distributed::Communicator& comm);

/// Builds cfg's model and optimizer as train() does and runs `steps` training steps on synthetic
/// batches of the preset's shapes (no dataset read), calling after_step(i) after each. Under
/// runtime::SimulateScope no kernel runs: this is how `hetrain simulate` sees a step.
void run_synthetic_steps(const TrainConfig& cfg, int64_t steps,
                         const std::function<void(int64_t)>& after_step = {},
                         const ModelFactory& make_model = {});

/// Formats a loss the way the logs do (9 significant digits).
std::string format_loss(double v);

}  // namespace hetrain::training
