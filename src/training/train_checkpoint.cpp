// Training checkpoints (train_checkpoint.h): plain and sharded saves, loading with checks.
#include "training/train_checkpoint.h"

#include <algorithm>
#include <cstdio>
#include <set>
#include <sstream>

#include "hetrain/base/error.h"
#include "hetrain/training/checkpoint.h"

namespace hetrain::training {

namespace {

/// The training state's metadata: where the run is (step, data position, RNG, loss scale) and
/// how it was configured. The data position and the RNG are global, not per rank.
std::map<std::string, std::string> train_state_metadata(const optim::Optimizer& opt,
                                                        const TrainConfig& cfg,
                                                        const ResumeState& st) {
  std::map<std::string, std::string> m = {
      {"format", "hetrain-train-state"},
      {"version", "1"},
      {"step", std::to_string(st.step)},
      {"optimizer", opt.name()},
      {"optimizer_steps", std::to_string(opt.steps())},
      {"data_epoch", std::to_string(st.data_epoch)},
      {"data_position", std::to_string(st.data_position)},
      {"data_sample", std::to_string(st.data_position * cfg.batch_size)},
      {"micro_batches", std::to_string(st.micro_batches)},
      {"data_examples", std::to_string(st.data_examples)},
      {"dropout_seed", std::to_string(st.dropout_seed)},
      {"dropout_offset", std::to_string(st.dropout_offset)},
      {"config", config_to_toml(cfg)},
      {"precision", cfg.precision},
  };
  if (st.scaler) {
    const amp::GradScalerState s = st.scaler->state();
    m["loss_scale"] = amp::float_to_exact_string(s.scale);
    m["loss_scale_growth_tracker"] = std::to_string(s.growth_tracker);
    m["skipped_steps"] = std::to_string(s.skipped_steps);
  }
  return m;
}

std::map<std::string, std::string> weights_metadata(int64_t step) {
  return {{"format", "pt"}, {"step", std::to_string(step)}};
}

}  // namespace

void save_checkpoint(const std::string& dir, nn::Module& model, optim::Optimizer& opt,
                     const std::map<std::string, Tensor>& opt_state, const TrainConfig& cfg,
                     bool leader, const ResumeState& st) {
  if (!leader) return;  // the others only took part in gathering opt_state
  checkpoint::Part weights{"model", {}, weights_metadata(st.step)};
  for (auto& [n, t] : model.state_dict()) weights.tensors.emplace_back(n, t);
  checkpoint::Part state{"train_state", {}, train_state_metadata(opt, cfg, st)};
  for (auto& [n, t] : opt_state) state.tensors.emplace_back(n, t);
  checkpoint::write(dir, st.step, {weights, state});
}

void save_sharded(const std::string& dir, nn::Module& model,
                  const distributed::ShardedOptimizer& opt, const TrainConfig& cfg,
                  distributed::Communicator& comm, const ResumeState& st,
                  const std::function<void(int64_t, const std::string&)>& on_point) {
  const bool leader = comm.rank() == 0;
  distributed::CollectiveContext ctx = comm.context();
  ctx.what = "sharded checkpoint of step " + std::to_string(st.step);
  comm.set_context(ctx);
  int64_t generation = 0;
  if (leader) generation = static_cast<int64_t>(checkpoint::begin_sharded(dir));
  comm.broadcast(&generation, 1, Dtype::i64, 0);
  std::vector<checkpoint::Piece> pieces = opt.checkpoint_pieces();
  std::set<std::string> param_names;
  for (const auto& [n, p] : model.named_parameters()) param_names.insert(n);
  const std::map<std::string, Tensor> weights = model.state_dict();
  if (leader)
    for (const auto& [n, t] : weights)
      if (!param_names.count(n)) pieces.push_back({"model", n, 0, t});
  const checkpoint::ShardWritten w = checkpoint::write_shard(dir, static_cast<uint64_t>(generation),
                                                             comm.rank(), comm.size(), pieces);
  if (on_point) on_point(st.step, "shard");
  int64_t mine[2] = {static_cast<int64_t>(w.bytes), static_cast<int64_t>(w.crc32)};
  std::vector<int64_t> all(2 * static_cast<size_t>(comm.size()));
  comm.all_gather(mine, all.data(), 2, Dtype::i64);
  if (leader) {
    std::vector<checkpoint::ShardWritten> shards(static_cast<size_t>(comm.size()));
    for (size_t r = 0; r < shards.size(); ++r)
      shards[r] = {static_cast<uint64_t>(all[2 * r]), static_cast<uint32_t>(all[2 * r + 1])};
    checkpoint::ShardedPart model_part{"model", {}, weights_metadata(st.step)};
    for (const auto& [n, t] : weights) model_part.tensors[n] = {t.dtype(), t.shape()};
    checkpoint::ShardedPart state_part{"train_state", opt.state_layout(),
                                       train_state_metadata(opt, cfg, st)};
    checkpoint::commit_sharded(dir, st.step, static_cast<uint64_t>(generation), opt.stage(),
                               {model_part, state_part}, shards);
    if (on_point) on_point(st.step, "commit");
  }
  comm.barrier();  // the checkpoint is complete on every rank's return
}

namespace {

/// "key = value" lines of config_to_toml as a map.
std::map<std::string, std::string> settings_of(const std::string& toml) {
  std::map<std::string, std::string> m;
  std::istringstream in(toml);
  std::string line;
  while (std::getline(in, line)) {
    const size_t eq = line.find(" = ");
    if (eq != std::string::npos) m[line.substr(0, eq)] = line.substr(eq + 3);
  }
  return m;
}

/// Settings that decide which examples come next: a resume that changed one would skip or
/// repeat examples, so it is refused. Other changed settings are listed.
void compare_settings(const std::map<std::string, std::string>& meta, const TrainConfig& cfg,
                      int64_t data_examples, const std::string& file) {
  if (meta.count("data_examples")) {
    const int64_t saved = checkpoint::metadata_int(meta, "data_examples", file);
    if (saved != data_examples)
      fail("[train] checkpoint ", file, " was trained on ", saved,
           " training examples but this run's data has ", data_examples,
           "; the data order would differ (examples skipped or repeated); resume on the same data");
  }
  auto it = meta.find("config");
  if (it == meta.end()) return;  // written before the settings were saved
  const auto saved = settings_of(it->second), now = settings_of(config_to_toml(cfg));
  std::string changed;
  for (const auto& [key, value] : now) {
    auto old = saved.find(key);
    if (old == saved.end() || old->second == value) continue;
    std::string flag = key;
    std::replace(flag.begin(), flag.end(), '_', '-');
    if (key == "batch_size" || key == "seed" || key == "context")
      fail("[train] checkpoint ", file, " was trained with --", flag, " ", old->second,
           " but this run uses --", flag, " ", value,
           "; the data order would differ (examples skipped or repeated); resume with --", flag,
           " ", old->second);
    changed += (changed.empty() ? "" : ", ") + flag + " " + old->second + " -> " + value;
  }
  if (!changed.empty())
    std::fprintf(stderr,
                 "note: resuming with changed settings (the run differs from an uninterrupted one "
                 "from here on): %s\n",
                 changed.c_str());
}

}  // namespace

ResumeState load_checkpoint(const std::string& dir, nn::Module& model, optim::Optimizer& opt,
                            const TrainConfig& cfg, amp::GradScaler* scaler,
                            int64_t data_examples) {
  const checkpoint::Contents c = checkpoint::read(dir);
  for (const char* part : {"model", "train_state"})
    if (!c.parts.count(part))
      fail("[train] checkpoint ", dir, " has no '", part,
           "' part; it is not a training checkpoint");
  const safetensors::File& weights = c.parts.at("model");
  const safetensors::File& state = c.parts.at("train_state");
  const std::string& mfile = c.files.at("model");
  const std::string& sfile = c.files.at("train_state");
  std::map<std::string, std::string> meta = state.metadata;
  auto fmt = meta.find("format");
  if (fmt == meta.end() || fmt->second != "hetrain-train-state")
    fail("[train] ", sfile,
         " is not a Hetrain training state (metadata 'format' missing or wrong)");
  if (meta["optimizer"] != opt.name())
    fail("[train] checkpoint ", sfile, " was written with optimizer '", meta["optimizer"],
         "' but this run uses '", opt.name(), "'");
  ResumeState st;
  st.step = checkpoint::metadata_int(meta, "step", sfile);
  st.data_epoch = checkpoint::metadata_int(meta, "data_epoch", sfile);
  st.data_position = checkpoint::metadata_int(meta, "data_position", sfile);
  // The global sample index (independent of the rank count) where the checkpoint has one.
  if (meta.count("data_sample")) {
    const int64_t sample = checkpoint::metadata_int(meta, "data_sample", sfile);
    if (sample % cfg.batch_size != 0)
      fail("[train] checkpoint ", sfile, " is at sample ", sample,
           " of its epoch, not a multiple of --batch-size ", cfg.batch_size);
    st.data_position = sample / cfg.batch_size;
  }
  st.dropout_seed = checkpoint::metadata_uint(meta, "dropout_seed", sfile);
  st.dropout_offset = checkpoint::metadata_uint(meta, "dropout_offset", sfile);
  // Checkpoints from before mixed precision are fp32 runs.
  const auto prec = meta.find("precision");
  const std::string saved_precision = prec == meta.end() ? "fp32" : prec->second;
  if (saved_precision != cfg.precision)
    fail("[train] checkpoint ", sfile, " was trained with --precision ", saved_precision,
         " but this run uses --precision ", cfg.precision, "; resume with the same precision");
  const bool saved_scaler = meta.count("loss_scale") > 0;
  if (saved_scaler != (scaler != nullptr))
    fail("[train] checkpoint ", sfile, saved_scaler ? " holds" : " holds no",
         " loss-scaler state but this run trains ", scaler ? "with" : "without",
         " a grad scaler; resume with the same --grad-scaler");
  compare_settings(meta, cfg, data_examples, sfile);
  if (scaler) {
    amp::GradScalerState s;
    s.scale = amp::float_from_exact_string(meta["loss_scale"],
                                           "checkpoint " + sfile + " metadata 'loss_scale'");
    s.growth_tracker = checkpoint::metadata_int(meta, "loss_scale_growth_tracker", sfile);
    s.skipped_steps = checkpoint::metadata_int(meta, "skipped_steps", sfile);
    try {
      scaler->load_state(s);
    } catch (const Error& e) {
      fail("[train] checkpoint ", sfile, ": ", e.what());
    }
  }
  const int64_t wstep = checkpoint::metadata_int(weights.metadata, "step", mfile);
  if (wstep != st.step || c.step != st.step)
    fail("[train] checkpoint ", dir, " is inconsistent: weights are from step ", wstep,
         " but the training state is from step ", st.step);
  // A checkpoint holds each tensor in the model's own dtype; anything else was not written by
  // this model (or was edited), and converting it would not resume the run exactly.
  for (const auto& [name, t] : model.state_dict()) {
    auto w = weights.tensors.find(name);
    if (w != weights.tensors.end() && w->second.dtype() != t.dtype())
      fail("[train] checkpoint ", mfile, ": tensor '", name, "' is ", dtype_name(w->second.dtype()),
           " but the model's is ", dtype_name(t.dtype()));
  }
  try {
    model.load_state_dict(weights.tensors);
  } catch (const Error& e) {
    fail("[train] checkpoint ", mfile, " does not match this model: ", e.what());
  }
  try {
    opt.load_state_dict(state.tensors, checkpoint::metadata_int(meta, "optimizer_steps", sfile));
  } catch (const Error& e) {
    fail("[train] checkpoint ", sfile, " does not match this model's optimizer: ", e.what());
  }
  return st;
}

}  // namespace hetrain::training
