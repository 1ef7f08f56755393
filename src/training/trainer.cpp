// The training loop behind `hetrain train`.
#include "hetrain/training/trainer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include "hetrain/base/byte_size.h"
#include "hetrain/base/cpu_load.h"
#include "hetrain/base/cpu_time.h"
#include "hetrain/base/error.h"
#include "hetrain/base/file_output.h"
#include "hetrain/base/thread_pool.h"
#include "hetrain/distributed/communicator.h"
#include "hetrain/distributed/grad_reducer.h"
#include "hetrain/distributed/sharded_optimizer.h"
#include "hetrain/graph/autodiff.h"
#include "hetrain/graph/recompute.h"
#include "hetrain/interop/safetensors.h"
#include "hetrain/memory/allocator.h"
#include "hetrain/memory/process_memory.h"
#include "hetrain/runtime/eval.h"
#include "hetrain/runtime/perf_model.h"
#include "hetrain/runtime/scheduler.h"
#include "hetrain/training/amp.h"
#include "hetrain/training/checkpoint.h"
#include "hetrain/training/data.h"
#include "hetrain/training/nn.h"
#include "hetrain/training/optim.h"
#include "training/data_parallel.h"
#include "training/offload.h"
#include "training/run_output.h"
#include "training/step.h"
#include "training/train_checkpoint.h"

namespace hetrain::training {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double steady_step_seconds(const TrainResult& r, size_t skip) {
  std::vector<double> v = r.step_seconds;
  if (v.empty()) return 0;
  if (v.size() > skip) v.erase(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(skip));
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::string format_loss(double v) {
  std::ostringstream os;
  os << std::setprecision(9) << v;
  return os.str();
}

namespace {

struct Data {
  std::shared_ptr<data::Dataset> train, test;
  double entropy = -1;
  bool language = false;
};

/// The CPU allocator's capacity while a run lasts: cfg.memory_budget, lifted again on exit.
class MemoryBudgetScope {
 public:
  explicit MemoryBudgetScope(int64_t bytes) {
    host_allocator().set_capacity(bytes, "--memory-budget " + format_bytes(bytes));
  }
  ~MemoryBudgetScope() { host_allocator().set_capacity(0, ""); }
  MemoryBudgetScope(const MemoryBudgetScope&) = delete;
  MemoryBudgetScope& operator=(const MemoryBudgetScope&) = delete;
};

/// The host allocator's live and reserved bytes: their difference is what the cache holds
/// (fragmentation: rounding and blocks cached for sizes not asked for again).
nlohmann::json memory_json(const MemoryStats& s) {
  auto frag = [](int64_t live, int64_t reserved) {
    return reserved > 0 ? 1.0 - static_cast<double>(live) / static_cast<double>(reserved) : 0.0;
  };
  return {{"live_bytes", s.current_total},
          {"reserved_bytes", s.reserved},
          {"peak_live_bytes", s.peak_total},
          {"peak_reserved_bytes", s.peak_reserved},
          {"fragmentation", frag(s.current_total, s.reserved)},
          {"peak_fragmentation", frag(s.peak_total, s.peak_reserved)}};
}

Data load_data(const TrainConfig& c) {
  Data d;
  if (c.model == "gpt") {
    d.language = true;
    data::TextCorpus corpus = data::load_text_corpus(c.data);
    d.entropy = data::unigram_entropy(corpus.val);
    d.train = data::make_text_dataset(std::move(corpus.train), c.context);
    d.test = data::make_text_dataset(std::move(corpus.val), c.context);
  } else {
    d.train = data::load_fashion_mnist(c.data, "train");
    d.test = data::load_fashion_mnist(c.data, "test");
  }
  if (d.train->size() < c.batch_size)
    fail("[train] the training set (", d.train->describe(), ") from --data ", c.data,
         " has fewer examples than one batch of ", c.batch_size);
  return d;
}

std::shared_ptr<nn::Module> build_model(const TrainConfig& c, Generator& init, Generator& dropout) {
  if (c.model == "mlp") return nn::make_mlp(28 * 28, c.hidden, 10, init);
  if (c.model == "cnn") return std::make_shared<nn::ResNet>(1, 10, c.widths, c.blocks, init);
  nn::GptConfig g{.vocab = 256,
                  .context = c.context,
                  .layers = c.layers,
                  .heads = c.heads,
                  .dim = c.width,
                  .dropout = c.dropout};
  (void)dropout;
  return std::make_shared<nn::Gpt>(g, init);
}

}  // namespace

Tensor loss_of(const Tensor& logits, const Tensor& targets, bool language) {
  if (!language) return cross_entropy(logits, targets);
  const int64_t V = logits.shape().back();
  return cross_entropy(reshape(logits, {-1, V}), reshape(targets, {-1}));
}

namespace {

/// Mean loss (and accuracy) over the evaluation set, in eval mode, without gradients.
std::pair<double, double> evaluate(nn::Module& model, const data::Dataset& ds, int64_t batch,
                                   bool language, int64_t max_batches, amp::Precision precision) {
  NoGradScope ng;
  amp::Autocast autocast(precision);  // evaluate the model as it trains
  model.eval();
  double loss_sum = 0;
  int64_t count = 0, correct = 0, batches = 0;
  // One batch at a time: the whole set made up front held every batch's memory at once.
  for (int64_t begin = 0; begin < ds.size(); begin += batch) {
    if (max_batches > 0 && batches >= max_batches) break;
    ++batches;
    std::vector<int64_t> indices;
    for (int64_t i = begin; i < std::min(ds.size(), begin + batch); ++i) indices.push_back(i);
    const data::Batch b = ds.make_batch(indices);
    Tensor logits = model.forward(b.inputs);
    Tensor loss = loss_of(logits, b.targets, language);
    int64_t n = b.targets.numel();
    if (!language) {
      Tensor hits = sum(equal(argmax(logits, 1), b.targets));
      eval({loss, hits});
      correct += hits.item<int64_t>();
    }
    loss_sum += loss.item<double>() * static_cast<double>(n);
    count += n;
  }
  model.train();
  return {count ? loss_sum / static_cast<double>(count) : 0.0,
          count ? static_cast<double>(correct) / static_cast<double>(count) : 0.0};
}

}  // namespace

/// The optimizer train() uses for cfg, over the given parameters (the model's, or a sharded
/// optimizer's shards).
std::unique_ptr<optim::Optimizer> make_optimizer(const TrainConfig& cfg,
                                                 const optim::NamedParams& params) {
  // Weight decay applies to matrices and convolutions, not to biases and norm scales.
  if (cfg.optimizer == "adamw")
    return std::make_unique<optim::AdamW>(
        params, optim::AdamWOptions{.lr = cfg.lr, .weight_decay = cfg.weight_decay});
  return std::make_unique<optim::SGD>(
      params,
      optim::SgdOptions{.lr = cfg.lr, .momentum = cfg.momentum, .weight_decay = cfg.weight_decay});
}

std::unique_ptr<optim::Optimizer> make_optimizer(const TrainConfig& cfg, nn::Module& model) {
  return make_optimizer(cfg, model.named_parameters());
}

data::Batch synthetic_batch(const TrainConfig& cfg) {
  data::Batch batch;
  if (cfg.model == "gpt") {
    batch.inputs = zeros({cfg.batch_size, cfg.context}, Dtype::i64).eval();
    batch.targets = zeros({cfg.batch_size, cfg.context}, Dtype::i64).eval();
  } else {
    batch.inputs = zeros({cfg.batch_size, 1, 28, 28}).eval();
    batch.targets = zeros({cfg.batch_size}, Dtype::i64).eval();
  }
  return batch;
}

StepShape step_shape(const TrainConfig& cfg, const optim::Optimizer& opt, nn::Module& model) {
  StepShape s{.state_slots = cfg.optimizer == "adamw" ? 2 : (cfg.momentum > 0 ? 1 : 0),
              .clip = cfg.clip > 0,
              .state_allocated = opt.steps() > 0,
              .with = {}};
  for (auto& [n, b] : model.named_buffers()) s.with.push_back(*b);
  return s;
}

RecomputeState recompute_state(const TrainConfig& cfg, bool announce) {
  RecomputeState r;
  r.policy.mode = parse_recompute(cfg.recompute, "[train] recompute");
  r.announce = announce;
  return r;
}

namespace {
/// The policy of this backward: auto plans at its first backward.
const RecomputePolicy& step_policy(RecomputeState& rs, const Tensor& root, const TrainConfig& cfg,
                                   const optim::Optimizer& opt, nn::Module& model) {
  if (rs.policy.mode != RecomputeMode::automatic || rs.planned) return rs.policy;
  rs.plan = plan_recompute(root, cfg.memory_budget, step_shape(cfg, opt, model));
  rs.policy = rs.plan.policy;
  rs.planned = true;
  if (rs.announce) std::fputs(rs.plan.announcement(cfg.memory_budget).c_str(), stderr);
  return rs.policy;
}
}  // namespace

StepOutcome train_step(nn::Module& model, optim::Optimizer& opt,
                       const std::vector<data::Batch>& micro, const TrainConfig& cfg, bool language,
                       amp::GradScaler* scaler, int64_t step, distributed::GradReducer* reducer,
                       distributed::Communicator& comm, RecomputeState& recompute) {
  HT_ASSERT(reducer || (micro.size() == 1 && comm.size() == 1));
  std::vector<Tensor> losses;
  for (size_t k = 0; k < micro.size(); ++k) {
    Tensor loss;
    {
      // Parameters stay f32; autocast casts them for the primitives its policy lowers.
      amp::Autocast autocast(amp::precision_from_name(cfg.precision));
      Tensor logits = model.forward(micro[k].inputs);
      loss = loss_of(logits, micro[k].targets, language);
    }
    if (reducer && k + 1 == micro.size()) {
      // The last backward: buckets start their reduction while it runs. Under offload, with
      // nothing that needs every gradient before an update (clipping, a scaler), each bucket's
      // update also runs on the host as soon as the bucket is reduced.
      comm.set_context({step, "gradient reduction"});
      // The reducer's collectives run on the communicator for its buffers' memory (NCCL for a
      // GPU's): a timeout there names the step too.
      if (&reducer->communicator() != &comm)
        reducer->communicator().set_context({step, "gradient reduction"});
      const int64_t divisor = static_cast<int64_t>(micro.size()) * comm.size();
      auto* sharded = dynamic_cast<distributed::ShardedOptimizer*>(&opt);
      const bool stream =
          sharded && streams_updates(cfg, scaler != nullptr) && sharded->stream_next_step();
      reducer->overlap_next_backward(k == 0, stream ? divisor : 0);
    }
    {
      const Tensor root = scaler ? scaler->scale(loss) : loss;
      const RecomputePolicy& policy = step_policy(recompute, root, cfg, opt, model);
      if (recompute.before_backward) recompute.before_backward(root, policy);
      RecomputeScope rc(policy);
      // The running statistics in the same eval: what they read goes once they have run.
      std::vector<Tensor> buffers;
      for (auto& [n, b] : model.named_buffers()) buffers.push_back(*b);
      hetrain::backward(root, Tensor(), buffers);
    }
    for (auto& [n, b] : model.named_buffers()) *b = b->detach();
    if (reducer) reducer->accumulate(k == 0);
    losses.push_back(loss);
  }
  StepOutcome out;
  if (reducer) out.times = reducer->reduce(static_cast<int64_t>(micro.size()) * comm.size());
  if (scaler) scaler->unscale(opt);  // clipping sees the true gradients
  if (cfg.clip > 0) opt.clip_grad_norm(cfg.clip);
  {
    // The update runs where the model state lives: the new parameters and moments stay there,
    // and the next step reads them without a copy. Under offload the optimizer state lives on
    // the host: the update runs there and the new parameters go back to the state device.
    const auto update_start = Clock::now();
    std::optional<DeviceScope> on;
    if (const std::optional<Device> home = optimizer_step_device(cfg)) on.emplace(*home);
    if (scaler)
      scaler->step(opt);  // skipped (and counted) when a gradient is inf/NaN
    else
      opt.step();
    if (!reducer) place_parameters(model, cfg);  // a sharded optimizer's are where it keeps them
    out.update_s = std::chrono::duration<double>(Clock::now() - update_start).count();
  }
  if (const auto* sharded = dynamic_cast<const distributed::ShardedOptimizer*>(&opt))
    out.streamed_buckets = sharded->streamed_buckets();
  opt.zero_grad();
  if (scaler) {
    try {
      scaler->update();
    } catch (const Error& e) {
      fail("[train] step ", step + 1, ": ", e.what());
    }
  }
  if (reducer) {
    std::vector<double> local;
    for (const Tensor& l : losses) local.push_back(l.item<double>());
    comm.set_context({step, "all_gather of the step's losses"});
    out.loss = global_mean_loss(comm, local);
  } else {
    out.loss = losses[0].item<double>();
  }
  return out;
}

namespace {

/// Stops a run that is not training: a finite loss far above the first step's (it exploded), or
/// a long run of steps skipped by the grad scaler (gradients non-finite at every scale).
class Divergence {
 public:
  explicit Divergence(const TrainConfig& cfg)
      : factor_(cfg.divergence_factor), max_skipped_(cfg.divergence_steps) {}
  void check(int64_t step, double loss, bool skipped, double scale) {
    if (std::isfinite(loss) && !std::isfinite(first_)) first_ = loss;
    if (factor_ > 0 && std::isfinite(loss) && loss > factor_ * std::abs(first_))
      fail("[train] the loss diverged at step ", step, ": ", format_loss(loss), " is more than ",
           factor_, " times the first step's ", format_loss(first_),
           " (--divergence-factor); lower --lr or enable --clip");
    skipped_in_row_ = skipped ? skipped_in_row_ + 1 : 0;
    if (max_skipped_ > 0 && skipped_in_row_ >= max_skipped_)
      fail("[train] ", skipped_in_row_, " steps in a row (to step ", step,
           ") were skipped for inf/NaN gradients, the loss scale now ", scale,
           " (--divergence-steps); the run is not training: lower --lr, or check the data");
  }

 private:
  double factor_;
  int64_t max_skipped_;
  double first_ = NAN;
  int64_t skipped_in_row_ = 0;
};

/// A loss as JSON: the number as the logs print it (9 significant digits), null when it is not
/// finite (JSON has no NaN or infinity).
nlohmann::json loss_json(double v) {
  if (!std::isfinite(v)) return nullptr;
  return nlohmann::json::parse(format_loss(v));
}

void check_writable_dir(const std::string& dir, const char* flag) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || access(dir.c_str(), W_OK) != 0)
    fail("[train] ", flag, " ", dir, " is not a writable directory");
}

}  // namespace

std::shared_ptr<nn::Module> build_model(const TrainConfig& cfg) {
  Generator init_gen(cfg.seed), dropout_gen(cfg.seed + 1);
  return build_model(cfg, init_gen, dropout_gen);
}

std::pair<TrainConfig, std::shared_ptr<nn::Module>> load_trained_model(const std::string& dir) {
  if (!fs::is_directory(dir))
    fail("[train] checkpoint directory ", dir,
         " does not exist (expected the --save directory "
         "of 'hetrain train', holding ",
         checkpoint::kIndexFile, " and the files it names)");
  const checkpoint::Contents c = checkpoint::read(dir);
  for (const char* part : {"model", "train_state"})
    if (!c.parts.count(part))
      fail("[train] checkpoint ", dir, " has no '", part,
           "' part; it is not a training checkpoint");
  const std::string& sfile = c.files.at("train_state");
  const std::string& mfile = c.files.at("model");
  const std::map<std::string, std::string>& meta = c.parts.at("train_state").metadata;
  auto fmt = meta.find("format");
  auto conf = meta.find("config");
  if (fmt == meta.end() || fmt->second != "hetrain-train-state" || conf == meta.end())
    fail("[train] ", sfile,
         " is not a Hetrain training state (metadata 'format' or 'config' "
         "missing)");
  TrainConfig cfg;
  apply_toml_string(cfg, conf->second, sfile + " metadata 'config'");
  validate(cfg);
  std::shared_ptr<nn::Module> model = build_model(cfg);
  try {
    model->load_state_dict(c.parts.at("model").tensors);
  } catch (const Error& e) {
    fail("[train] ", mfile, " does not fit the model ", sfile, " describes: ", e.what());
  }
  model->eval();
  return {cfg, model};
}

TrainResult train(const TrainConfig& cfg, const StepHooks& hooks) {
  std::unique_ptr<distributed::Communicator> local = distributed::make_local_communicator();
  return train(cfg, hooks, *local);
}

TrainResult train(const TrainConfig& cfg, const StepHooks& hooks, distributed::Communicator& comm) {
  validate(cfg);
  const std::optional<Device> state_device = resolve_state_device(cfg);
  check_offload(cfg);
  const bool offload = offloads_optimizer(cfg);
  MemoryBudgetScope budget(cfg.memory_budget);
  const int world = comm.size();
  const bool leader = comm.rank() == 0;  // the one voice: prints, logs, checkpoints
  const int64_t micro_batches = world * cfg.grad_accum;
  if (cfg.batch_size % micro_batches != 0)
    fail("[train] batch-size ", cfg.batch_size, " is not divisible by ", world, " ranks x ",
         cfg.grad_accum, " micro-batches");
  // Fail on unwritable outputs before any work.
  // Only rank 0 writes the log and the checkpoints.
  JsonLog jlog(leader ? cfg.json_log : "");
  if (!cfg.save_dir.empty() && leader) check_writable_dir(cfg.save_dir, "--save");
  set_num_threads(cfg.threads);
  if (world > 1 && leader &&
      comm.local_size() * num_threads() > static_cast<int>(std::thread::hardware_concurrency()))
    std::fprintf(stderr,
                 "warning: %d ranks on this host x %d threads each exceed its %u CPUs; give "
                 "--threads or bind the ranks (mpirun --bind-to core)\n",
                 comm.local_size(), num_threads(), std::thread::hardware_concurrency());

  Data data = load_data(cfg);
  Generator init_gen(cfg.seed), dropout_gen(cfg.seed + 1);
  std::shared_ptr<nn::Module> model =
      hooks.make_model ? hooks.make_model(cfg) : build_model(cfg, init_gen, dropout_gen);
  default_generator().set_state(cfg.seed + 1, 0);  // dropout draws from the default generator
  broadcast_model(*model, comm);

  // The collectives on the flat buffers' memory: this run's communicator for host memory (the
  // CPU, sim devices), NCCL on the state device for a GPU. It outlives the optimizer.
  const bool reduces = micro_batches > 1 || cfg.zero > 0;
  std::unique_ptr<distributed::Communicator> device_comm =
      reduces ? distributed::make_device_communicator(flat_buffer_home(cfg), comm, cfg.comm_timeout)
              : nullptr;
  distributed::Communicator& flat_comm = device_comm ? *device_comm : comm;
  std::unique_ptr<optim::Optimizer> opt = make_optimizer(cfg, model->named_parameters());

  const amp::Precision precision = amp::precision_from_name(cfg.precision);
  std::optional<amp::GradScaler> scaler;
  if (uses_grad_scaler(cfg))
    scaler.emplace(amp::GradScalerOptions{.init_scale = cfg.loss_scale,
                                          .growth_interval = cfg.loss_scale_growth_interval,
                                          .min_scale = cfg.loss_scale_floor});
  amp::GradScaler* scaler_ptr = scaler ? &*scaler : nullptr;

  data::DataLoader loader(data.train, cfg.batch_size, true, cfg.seed);
  const int64_t per_rank = cfg.batch_size / world;
  loader.set_shard(comm.rank() * per_rank, per_rank, cfg.grad_accum);
  const int64_t total = cfg.steps > 0 ? cfg.steps : cfg.epochs * loader.batches_per_epoch();
  check_agree(comm, total, "the number of steps");
  std::optional<distributed::GradReducer> reducer;
  if (reduces) {
    distributed::BucketOptions bo = distributed::ShardedOptimizer::bucket_options(
        static_cast<int>(cfg.zero), cfg.bucket_mb, 1, cfg.param_persistence_threshold);
    bo.buffers = flat_buffer_home(cfg);  // the gradients live with the parameters
    reducer.emplace(model->parameters(), flat_comm, bo);
  }
  optim::LrSchedule sched{.kind = cfg.schedule,
                          .base_lr = cfg.lr,
                          .warmup_steps = cfg.warmup,
                          .total_steps = total,
                          .min_lr = cfg.min_lr};

  int64_t step = 0;
  if (!cfg.resume_dir.empty()) {
    // A directory a run saved into with --save-every: its latest complete checkpoint.
    const std::string from = checkpoint::latest(cfg.resume_dir);
    ResumeState st = load_checkpoint(from, *model, *opt, cfg, scaler_ptr, data.train->size());
    step = st.step;
    loader.seek(st.data_epoch, st.data_position);
    default_generator().set_state(st.dropout_seed, st.dropout_offset);
    if (step > total)
      fail("[train] checkpoint is at step ", step, ", past the ", total, " steps of this run");
    check_agree(comm, step, "the checkpoint's step");
    if (leader)
      std::fprintf(stderr, "resumed from %s at step %lld\n", from.c_str(),
                   static_cast<long long>(step));
  }
  distributed::ShardedOptimizer* sharded = nullptr;
  if (reducer) {
    // Flat buffers, this rank's shard of the optimizer state (taken from opt: a checkpoint's).
    auto so = std::make_unique<distributed::ShardedOptimizer>(
        model->named_parameters(), *reducer, comm, static_cast<int>(cfg.zero),
        [&](const optim::NamedParams& p) { return make_optimizer(cfg, p); }, opt.get(),
        state_homes(cfg));
    // The model states at the update go into the JSON log's rank_memory only.
    so->measure_model_states(!cfg.json_log.empty());
    sharded = so.get();
    opt = std::move(so);
  }
  if (leader) {
    std::string par;
    if (micro_batches > 1)
      par = ", " + std::to_string(world) + " rank(s) x " + std::to_string(cfg.grad_accum) +
            " micro-batch(es) of " + std::to_string(cfg.batch_size / micro_batches);
    std::string where;
    if (state_device && offload)
      where = ", parameters on " + state_device->str() + ", optimizer state" +
              (cfg.offload == "optimizer+params" ? " and parameter shards" : "") +
              " offloaded to cpu";
    else if (state_device)
      where = ", parameters and optimizer state on " + state_device->str();
    std::fprintf(stderr,
                 "training %s (%s, %lld parameters) on %s for %lld steps, batch %lld%s, %s%d "
                 "threads%s%s, precision %s%s%s\n",
                 cfg.preset.c_str(), cfg.model.c_str(),
                 static_cast<long long>(model->num_parameters()), data.train->describe().c_str(),
                 static_cast<long long>(total), static_cast<long long>(cfg.batch_size), par.c_str(),
                 cfg.threads == 0 ? "up to " : "", num_threads(), world > 1 ? " per rank" : "",
                 cfg.threads == 0 ? " (as many as other work leaves free)" : "",
                 cfg.precision.c_str(), scaler ? " with dynamic loss scaling" : "", where.c_str());
  }
  jlog.open();  // the inputs are good: the old log goes now

  // Under offload: on the state device from the first step (a sharded optimizer's already are).
  if (!sharded) place_parameters(*model, cfg);
  host_allocator().reset_peak();
  for (const runtime::DeviceModel& m : runtime::config().devices)
    if (m.device.kind != DeviceKind::cpu) allocator_for(m.device).reset_peak();
  RssGrowth rss_growth;
  Progress progress(total, cfg.progress && leader);
  const auto t0 = Clock::now();
  auto interval_start = t0;
  double interval_cpu = process_cpu_seconds();
  int64_t interval_steps = 0, samples_done = 0, first_step = step;
  double interval_loss = 0, last_loss = NAN;
  double comm_s = 0, exposed_s = 0, interval_comm = 0, interval_exposed = 0, interval_update = 0;
  int64_t interval_overlapped = 0, interval_streamed = 0;
  std::vector<double> step_seconds;
  Divergence divergence(cfg);
  RecomputeState recompute = recompute_state(cfg, leader);
  // --threads 0: the team follows the CPUs that other work leaves free (base/cpu_load.h); a
  // given count stays as it is (and so do the results that depend on it: the chunks of some
  // sums).
  std::optional<TeamSizer> team;
  if (cfg.threads == 0) team.emplace(num_threads(), available_cpus());
  int64_t team_changes = 0;
  model->train();
  // Under ZeRO every rank writes its shard; otherwise rank 0 writes the whole state (a stage-0
  // sharded optimizer's state_dict() is every rank's call).
  auto save = [&](const std::string& dir) {
    const ResumeState st{step,
                         loader.epoch(),
                         loader.position(),
                         micro_batches,
                         default_generator().seed(),
                         default_generator().offset(),
                         scaler_ptr,
                         data.train->size()};
    if (sharded && cfg.zero > 0)
      save_sharded(dir, *model, *sharded, cfg, comm, st, hooks.checkpoint);
    else if (leader || sharded)
      save_checkpoint(dir, *model, *opt, opt->state_dict(), cfg, leader, st);
  };
  // Kernel times are recorded (when on) for steps 3 to 22 only: enough to calibrate the
  // performance models, without the first steps' warm-up or the cost in every step.
  const bool recording = runtime::perf_recording();
  while (step < total) {
    if (hooks.begin) hooks.begin(step);
    if (recording) runtime::set_perf_recording(step - first_step >= 2 && step - first_step < 22);
    const auto step_start = Clock::now();
    const double lr = sched.at(step);
    opt->set_lr(lr);
    const int64_t epoch = loader.epoch();
    const int64_t skipped_before = scaler ? scaler->skipped_steps() : 0;
    const std::vector<data::Batch> micro = loader.next_micro();
    const StepOutcome outcome = train_step(*model, *opt, micro, cfg, data.language, scaler_ptr,
                                           step, reducer ? &*reducer : nullptr, comm, recompute);
    last_loss = outcome.loss;
    interval_comm += outcome.times.comm_s;
    interval_exposed += outcome.times.exposed_comm_s;
    interval_overlapped += outcome.times.overlapped_buckets;
    interval_streamed += outcome.streamed_buckets;
    interval_update += outcome.update_s;
    // With a scaler a non-finite loss is a skipped step; the scale's floor ends a run that
    // keeps overflowing.
    if (!std::isfinite(last_loss) && !scaler)
      fail("[train] loss became ", last_loss, " at step ", step + 1,
           "; lower --lr or enable --clip");
    divergence.check(step + 1, last_loss, scaler && scaler->skipped_steps() > skipped_before,
                     scaler ? scaler->get_scale() : 0.0);
    step_seconds.push_back(std::chrono::duration<double>(Clock::now() - step_start).count());
    if (hooks.end) hooks.end(step, last_loss);
    ++step;
    ++interval_steps;
    interval_loss += last_loss;
    samples_done += cfg.batch_size;
    const double elapsed = std::chrono::duration<double>(Clock::now() - t0).count();
    const double sps = static_cast<double>(samples_done) / std::max(elapsed, 1e-9);
    const double eta =
        elapsed / static_cast<double>(step - first_step) * static_cast<double>(total - step);
    const bool log_now = step % cfg.log_every == 0 || step == total;
    std::string extra;
    if (scaler) {
      std::ostringstream os;
      os << " scale " << scaler->get_scale() << " skipped " << scaler->skipped_steps();
      extra = os.str();
    }
    if (leader) progress.update(step, last_loss, sps, eta, log_now, epoch, lr, extra);
    if (team && team->due(monotonic_seconds()))
      if (const std::optional<int> n = team->observe(sample_cpu_load())) {
        set_num_threads(*n);
        ++team_changes;
        if (leader) {
          char line[200];
          std::snprintf(line, sizeof line,
                        "note: other work used %.1f of this process's %d CPUs; now %d thread%s "
                        "(--threads N keeps N)",
                        team->others(), available_cpus(), *n, *n == 1 ? "" : "s");
          progress.note(line);
        }
      }
    if (log_now) {
      const double dt = std::chrono::duration<double>(Clock::now() - interval_start).count();
      if (jlog) {
        nlohmann::json rec = {
            {"step", step},
            {"epoch", epoch},
            {"loss", interval_loss / static_cast<double>(interval_steps)},
            {"lr", lr},
            {"samples_per_s",
             static_cast<double>(interval_steps * cfg.batch_size) / std::max(dt, 1e-9)},
            {"cpu_s", process_cpu_seconds() - interval_cpu},
            {"world_size", world},
            {"threads", num_threads()},
            {"comm_s", interval_comm},
            {"exposed_comm_s", interval_exposed},
            {"buckets_overlapped", interval_overlapped}};
        rec["update_s"] = interval_update;
        if (offload) rec["buckets_streamed"] = interval_streamed;
        if (scaler) {
          rec["loss_scale"] = scaler->get_scale();
          rec["skipped_steps"] = scaler->skipped_steps();
        }
        rec["memory"] = memory_json(host_allocator().stats());
        jlog.write(rec);
      }
      interval_start = Clock::now();
      interval_cpu = process_cpu_seconds();
      interval_steps = 0;
      interval_loss = 0;
      comm_s += interval_comm;
      exposed_s += interval_exposed;
      interval_comm = interval_exposed = 0;
      interval_overlapped = interval_streamed = 0;
      interval_update = 0;
    }
    if (!cfg.save_dir.empty() && cfg.save_every > 0 && step % cfg.save_every == 0 && step < total)
      save(cfg.save_dir + "/step-" + std::to_string(step));
  }
  progress.finish();
  runtime::set_perf_recording(false);
  const double train_wall = std::chrono::duration<double>(Clock::now() - t0).count();
  const std::optional<int64_t> rss_grown = rss_growth.bytes();

  TrainResult r;
  r.steps = step;
  r.train_loss = last_loss;
  r.wall_s = train_wall;
  r.samples_per_s = static_cast<double>(samples_done) / std::max(train_wall, 1e-9);
  r.step_seconds = std::move(step_seconds);
  r.threads = num_threads();
  r.team_changes = team_changes;
  r.world_size = world;
  r.comm_s = comm_s;
  r.exposed_comm_s = exposed_s;
  r.precision = cfg.precision;
  r.grad_scaler = scaler.has_value();
  r.loss_scale = scaler ? scaler->get_scale() : 0.0;
  r.skipped_steps = scaler ? scaler->skipped_steps() : 0;
  auto stats = host_allocator().stats();
  for (int t = 0; t < kNumMemoryTags; ++t)
    r.peak_memory_bytes[std::string(memory_tag_name(static_cast<MemoryTag>(t)))] =
        stats.peak[static_cast<size_t>(t)];
  r.peak_memory_bytes["total"] = stats.peak_total;
  r.peak_rss_growth_bytes = rss_grown.value_or(-1);
  const nlohmann::json ranks_memory =
      rank_memory(comm, stats, sharded ? &sharded->model_state_bytes() : nullptr,
                  sharded && flat_buffer_home(cfg).kind != DeviceKind::cpu
                      ? &sharded->device_model_state_bytes()
                      : nullptr);
  // Stage 3: the whole parameters once more, for what reads them now (after the memory figures).
  if (sharded) sharded->unshard_parameters();
  if (world > 1) {
    r.ranks_identical = parameters_identical(*model, comm);
    if (!r.ranks_identical && leader)
      std::fprintf(stderr, "warning: the ranks' parameters differ at the end of training\n");
  }

  // Only rank 0 reports the test numbers; the others skip the evaluation.
  auto [tl, acc] = cfg.final_eval && leader
                       ? evaluate(*model, *data.test, cfg.batch_size, data.language,
                                  data.language ? cfg.eval_batches : 0, precision)
                       : std::pair<double, double>{NAN, NAN};
  if (data.language) {
    r.val_loss = tl;
    r.unigram_entropy = data.entropy;
  } else {
    r.test_loss = tl;
    r.test_accuracy = acc;
  }
  if (!cfg.save_dir.empty()) save(cfg.save_dir);
  if (hooks.finished) {
    model->eval();
    hooks.finished(*model);
  }
  if (jlog) {
    nlohmann::json fin = {{"final", true},
                          {"steps", r.steps},
                          {"train_loss", loss_json(r.train_loss)},
                          {"wall_s", r.wall_s},
                          {"samples_per_s", r.samples_per_s},
                          {"peak_memory_bytes", r.peak_memory_bytes},
                          {"step_time_s", steady_step_seconds(r)},
                          {"precision", r.precision},
                          {"skipped_steps", r.skipped_steps},
                          {"world_size", r.world_size},
                          {"threads", r.threads},
                          {"grad_accum", cfg.grad_accum},
                          {"comm_s", r.comm_s},
                          {"exposed_comm_s", r.exposed_comm_s},
                          {"ranks_identical", r.ranks_identical},
                          {"memory", memory_json(stats)}};
    fin["rank_memory"] = ranks_memory;
    fin["ddp_progress"] = distributed::progress_mode_name(distributed::progress_mode_from_env());
    if (sharded) {
      fin["zero"] = sharded->stage();
      fin["zero_padding_elements"] = sharded->padding();
      fin["zero_persistent_elements"] = sharded->persistent_elements();
    }
    if (r.peak_rss_growth_bytes >= 0) fin["peak_rss_growth_bytes"] = r.peak_rss_growth_bytes;
    // Device memory: the peak of each CUDA or sim device's allocator over the run (all tags),
    // and by tag (offload: no optimizer state there).
    for (const runtime::DeviceModel& m : runtime::config().devices)
      if (m.device.kind != DeviceKind::cpu) {
        const MemoryStats ds = allocator_for(m.device).stats();
        fin["device_peak_memory_bytes"][m.device.str()] = ds.peak_total;
        for (int t = 0; t < kNumMemoryTags; ++t)
          fin["device_memory_by_tag"][m.device.str()]
             [std::string(memory_tag_name(static_cast<MemoryTag>(t)))] =
                 ds.peak[static_cast<size_t>(t)];
      }
    if (offload) fin["offload"] = cfg.offload;
    if (scaler) fin["loss_scale"] = r.loss_scale;
    if (data.language) {
      fin["val_loss"] = r.val_loss;
      fin["unigram_entropy"] = r.unigram_entropy;
    } else {
      fin["test_loss"] = r.test_loss;
      fin["test_accuracy"] = r.test_accuracy;
    }
    jlog.write(fin);
  }
  return r;
}

void run_synthetic_steps(const TrainConfig& cfg, int64_t steps,
                         const std::function<void(int64_t)>& after_step,
                         const ModelFactory& make_model) {
  validate(cfg);
  if (steps < 1) fail("[train] synthetic steps must be >= 1, got ", steps);
  MemoryBudgetScope budget(cfg.memory_budget);
  Generator init_gen(cfg.seed), dropout_gen(cfg.seed + 1);
  std::shared_ptr<nn::Module> model =
      make_model ? make_model(cfg) : build_model(cfg, init_gen, dropout_gen);
  std::unique_ptr<optim::Optimizer> opt = make_optimizer(cfg, model->named_parameters());
  const bool language = cfg.model == "gpt";
  // The shapes a real batch has; the values do not change the work.
  const data::Batch batch = synthetic_batch(cfg);
  model->train();
  std::unique_ptr<distributed::Communicator> local = distributed::make_local_communicator();
  RecomputeState recompute = recompute_state(cfg, false);
  for (int64_t s = 0; s < steps; ++s) {
    train_step(*model, *opt, {batch}, cfg, language, nullptr, s, nullptr, *local, recompute);
    if (after_step) after_step(s);
  }
}

}  // namespace hetrain::training
