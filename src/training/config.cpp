// TrainConfig: presets, settings from flags and TOML, validation.
#include <toml++/toml.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <sstream>
#include <tuple>

#include "hetrain/base/byte_size.h"
#include "hetrain/base/error.h"
#include "hetrain/base/thread_pool.h"
#include "hetrain/graph/recompute.h"
#include "hetrain/runtime/scheduler.h"
#include "hetrain/training/trainer.h"

namespace hetrain::training {

std::vector<std::string> preset_names() { return {"fashion-mlp", "fashion-cnn", "gpt-mini"}; }

TrainConfig preset_config(const std::string& name, const std::string& command) {
  TrainConfig c;
  c.preset = name;
  if (name == "fashion-mlp") {
    c.model = "mlp";
    c.data = "/usr/share/datasets/fashion-mnist";
    c.hidden = {512, 256};
    c.epochs = 5;
    c.batch_size = 128;
    c.lr = 1e-3;
    c.weight_decay = 0.0;
    c.schedule = "cosine";
  } else if (name == "fashion-cnn") {
    c.model = "cnn";
    c.data = "/usr/share/datasets/fashion-mnist";
    c.widths = {16, 32, 64};
    c.blocks = 1;
    c.epochs = 5;
    c.batch_size = 128;
    c.lr = 2e-3;
    c.weight_decay = 1e-4;
    c.schedule = "cosine";
  } else if (name == "gpt-mini") {
    c.model = "gpt";
    c.data = "/usr/share/games/fortunes";
    c.layers = 4;
    c.heads = 4;
    c.width = 128;
    c.context = 64;
    c.steps = 1500;
    c.batch_size = 32;
    c.lr = 3e-3;
    c.min_lr = 3e-4;
    c.warmup = 100;
    c.weight_decay = 0.1;
    c.clip = 1.0;
    c.schedule = "cosine";
    c.eval_batches = 100;
  } else {
    std::string known;
    for (const auto& n : preset_names()) known += (known.empty() ? "" : ", ") + n;
    fail("[", command, "] unknown preset '", name, "'; known presets: ", known);
  }
  return c;
}

namespace {

std::string norm_key(std::string k) {
  std::replace(k.begin(), k.end(), '_', '-');
  return k;
}

int64_t to_int(const std::string& key, const std::string& v, const std::string& where) {
  try {
    size_t used = 0;
    long long x = std::stoll(v, &used);
    if (used == v.size()) return x;
  } catch (const std::exception&) {
  }
  fail(where, ": '", key, "' expects an integer, got '", v, "'");
}
double to_double(const std::string& key, const std::string& v, const std::string& where) {
  try {
    size_t used = 0;
    double x = std::stod(v, &used);
    if (used == v.size() && std::isfinite(x)) return x;
  } catch (const std::exception&) {
  }
  fail(where, ": '", key, "' expects a finite number, got '", v, "'");
}
std::vector<int64_t> to_list(const std::string& key, const std::string& v,
                             const std::string& where) {
  std::vector<int64_t> out;
  std::string s = v;
  s.erase(
      std::remove_if(s.begin(), s.end(), [](char c) { return c == '[' || c == ']' || c == ' '; }),
      s.end());
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    out.push_back(to_int(key, item, where));
  }
  return out;
}

/// A value of state-device or offload (where the model state lives), checked; errors start
/// with `where` ("[train] flag --offload", say), as those of to_int, to_double and to_list.
std::string check_state_setting(const std::string& key, const std::string& v,
                                const std::string& where) {
  if (key == "offload") {
    if (v != "none" && v != "optimizer" && v != "optimizer+params")
      fail(where, ": offload must be none, optimizer or optimizer+params, got '", v, "'");
    return v;
  }
  if (v == "auto") return v;
  try {
    (void)Device::parse_name(v);
  } catch (const Error&) {
    fail(where, ": state-device must be auto, cpu, cuda:N or sim:N, got '", v, "'");
  }
  return v;
}

}  // namespace

void apply_setting(TrainConfig& c, const std::string& key_in, const std::string& v,
                   const std::string& origin, const std::string& command) {
  const std::string key = norm_key(key_in), where = "[" + command + "] " + origin;
  auto i = [&] { return to_int(key, v, where); };
  auto d = [&] { return to_double(key, v, where); };
  if (key == "preset") {
    // A preset resets everything else to its defaults; flags given later override it.
    TrainConfig p = preset_config(v, command);
    std::tie(p.save_dir, p.resume_dir, p.json_log) = std::tie(c.save_dir, c.resume_dir, c.json_log);
    c = p;
  } else if (key == "model") {
    if (v != "mlp" && v != "cnn" && v != "gpt")
      fail(where, ": model must be mlp, cnn or gpt, got '", v, "'");
    c.model = v;
  } else if (key == "data")
    c.data = v;
  else if (key == "hidden")
    c.hidden = to_list(key, v, where);
  else if (key == "widths")
    c.widths = to_list(key, v, where);
  else if (key == "blocks")
    c.blocks = i();
  else if (key == "layers")
    c.layers = i();
  else if (key == "heads")
    c.heads = i();
  else if (key == "width")
    c.width = i();
  else if (key == "context")
    c.context = i();
  else if (key == "dropout")
    c.dropout = d();
  else if (key == "epochs" || key == "steps") {
    // Given explicitly, 0 is a mistake (it used to fall back silently to the preset's epochs).
    const int64_t n = i();
    if (n < 1) fail(where, ": '", key, "' must be at least 1, got ", n);
    (key == "epochs" ? c.epochs : c.steps) = n;
    if (key == "epochs") c.steps = 0;  // epochs count only when steps are not given
  } else if (key == "batch-size")
    c.batch_size = i();
  else if (key == "lr")
    c.lr = d();
  else if (key == "min-lr")
    c.min_lr = d();
  else if (key == "weight-decay")
    c.weight_decay = d();
  else if (key == "momentum")
    c.momentum = d();
  else if (key == "clip")
    c.clip = d();
  else if (key == "optimizer")
    c.optimizer = v;
  else if (key == "schedule")
    c.schedule = v;
  else if (key == "warmup")
    c.warmup = i();
  else if (key == "seed") {
    int64_t s = i();
    if (s < 0) fail(where, ": seed must be >= 0, got ", s);
    c.seed = static_cast<uint64_t>(s);
  } else if (key == "threads") {
    const int64_t n = i();
    if (n < 0 || n > max_threads())
      fail(where, ": threads must be between 0 (one per core) and ", max_threads(),
           " (4 per core, at least 64), got ", n);
    c.threads = static_cast<int>(n);
  } else if (key == "memory-budget")
    c.memory_budget =
        parse_byte_size(v, where + (origin.starts_with("flag") ? "" : ": 'memory-budget'"));
  else if (key == "recompute") {
    parse_recompute(v, where);  // checks the name
    c.recompute = v;
  } else if (key == "grad-accum")
    c.grad_accum = i();
  else if (key == "bucket-mb")
    c.bucket_mb = d();
  else if (key == "param-persistence-threshold")
    c.param_persistence_threshold = i();
  else if (key == "zero") {
    if (v != "0" && v != "1" && v != "2" && v != "3")
      fail(where, ": zero must be 0, 1, 2 or 3 (the ZeRO stage), got '", v, "'");
    c.zero = v[0] - '0';
  } else if (key == "state-device" || key == "offload") {
    (key == "offload" ? c.offload : c.state_device) = check_state_setting(key, v, where);
  } else if (key == "comm-timeout")
    c.comm_timeout = d();
  else if (key == "precision") {
    if (v != "fp32" && v != "bf16" && v != "fp16")
      fail(where, ": precision must be fp32, bf16 or fp16, got '", v, "'");
    c.precision = v;
  } else if (key == "grad-scaler") {
    if (v != "auto" && v != "on" && v != "off")
      fail(where, ": grad-scaler must be auto, on or off, got '", v, "'");
    c.grad_scaler = v;
  } else if (key == "loss-scale")
    c.loss_scale = d();
  else if (key == "loss-scale-growth-interval")
    c.loss_scale_growth_interval = i();
  else if (key == "loss-scale-floor")
    c.loss_scale_floor = d();
  else if (key == "divergence-factor")
    c.divergence_factor = d();
  else if (key == "divergence-steps")
    c.divergence_steps = i();
  else if (key == "save")
    c.save_dir = v;
  else if (key == "save-every")
    c.save_every = i();
  else if (key == "resume")
    c.resume_dir = v;
  else if (key == "json-log")
    c.json_log = v;
  else if (key == "log-every")
    c.log_every = i();
  else if (key == "eval-batches")
    c.eval_batches = i();
  else
    fail(where, ": unknown setting '", key_in, "'");
}

namespace {
/// "[command] config PATH: ", the start of every error about a config file's content.
std::string config_where(const std::string& command, const std::string& path) {
  return "[" + command + "] config " + path + ": ";
}

/// A TOML syntax error: what is wrong and where.
std::string parse_error_text(const toml::parse_error& e) {
  std::ostringstream os;
  os << e.description() << " at line " << e.source().begin.line << ", column "
     << e.source().begin.column;
  return os.str();
}

void apply_toml_table(TrainConfig& cfg, const toml::table& tbl, const std::string& path,
                      bool allow_preset, const std::string& command) {
  const std::string where = config_where(command, path);
  // The preset goes first so that the file's other keys override it.
  std::vector<std::pair<std::string, std::string>> items;
  std::function<void(const toml::table&)> walk = [&](const toml::table& t) {
    for (const auto& [k, node] : t) {
      std::string key(k.str());
      if (const auto* sub = node.as_table()) {
        walk(*sub);
        continue;
      }
      std::string value;
      // Lists only where a list is meant; no setting is a boolean.
      const bool list_key = norm_key(key) == "hidden" || norm_key(key) == "widths";
      if (node.is_array() && !list_key)
        fail(where, "'", key, "' must be a single value, not a list");
      if (node.is_boolean()) fail(where, "'", key, "' must not be a boolean (true/false)");
      if (auto s = node.value_exact<std::string>())
        value = *s;
      else if (node.is_integer())
        value = std::to_string(*node.value<int64_t>());
      else if (node.is_floating_point()) {
        std::ostringstream os;
        os.precision(17);
        os << *node.value<double>();
        value = os.str();
      } else if (const auto* arr = node.as_array()) {
        for (const auto& el : *arr) {
          if (!el.is_integer()) fail(where, "'", key, "' must be a list of integers");
          value += (value.empty() ? "" : ",") + std::to_string(*el.value<int64_t>());
        }
      } else {
        fail(where, "'", key, "' has an unsupported value type");
      }
      items.emplace_back(key, value);
    }
  };
  walk(tbl);
  std::stable_partition(items.begin(), items.end(),
                        [](const auto& kv) { return kv.first == "preset"; });
  for (const auto& [k, v] : items) {
    if (k == "preset" && !allow_preset) continue;
    apply_setting(cfg, k, v, "config " + path, command);
  }
}
}  // namespace

void apply_toml_file(TrainConfig& cfg, const std::string& path, bool allow_preset,
                     const std::string& command) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec))
    fail(config_where(command, path),
         std::filesystem::exists(path, ec) ? "not a regular file" : "no such file");
  toml::table tbl;
  try {
    tbl = toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    fail(config_where(command, path), parse_error_text(e));
  } catch (const std::exception& e) {
    fail("[", command, "] cannot read config ", path, ": ", e.what());
  }
  apply_toml_table(cfg, tbl, path, allow_preset, command);
}

void apply_toml_string(TrainConfig& cfg, const std::string& text, const std::string& origin,
                       bool allow_preset, const std::string& command) {
  toml::table tbl;
  try {
    tbl = toml::parse(text, origin);
  } catch (const toml::parse_error& e) {
    fail(config_where(command, origin), parse_error_text(e));
  }
  apply_toml_table(cfg, tbl, origin, allow_preset, command);
}

std::optional<Device> resolve_state_device(const TrainConfig& cfg) {
  const std::vector<runtime::DeviceModel>& devices = runtime::config().devices;
  if (cfg.state_device == "auto") {
    if (cfg.zero == 0)
      for (const runtime::DeviceModel& m : devices)
        if (m.device.kind == DeviceKind::cuda) return m.device;
    return std::nullopt;
  }
  const Device d = Device::parse_name(cfg.state_device);
  if (d.kind == DeviceKind::cpu) return Device::cpu();
  std::string names;
  for (const runtime::DeviceModel& m : devices) {
    if (m.device == d) return d;
    names += (names.empty() ? "" : ", ") + m.device.str();
  }
  fail("[train] state-device ", cfg.state_device, " is not among the configured devices (", names,
       "); add it to --devices");
}

void validate(const TrainConfig& c, const std::string& command) {
  const std::string tag = "[" + command + "] ";
  auto positive = [&tag](const char* name, double v) {
    if (!(v > 0)) fail(tag, name, " must be positive, got ", v);
  };
  if (c.model != "mlp" && c.model != "cnn" && c.model != "gpt")
    fail(tag, "model must be mlp, cnn or gpt, got '", c.model, "'");
  positive("batch-size", static_cast<double>(c.batch_size));
  if (c.steps <= 0 && c.epochs <= 0) fail(tag, "give --steps or --epochs (a positive number)");
  if (c.steps < 0 || c.epochs < 0) fail(tag, "steps and epochs must not be negative");
  positive("lr", c.lr);
  if (c.optimizer != "adamw" && c.optimizer != "sgd")
    fail(tag, "optimizer must be adamw or sgd, got '", c.optimizer, "'");
  if (c.schedule != "constant" && c.schedule != "cosine" && c.schedule != "step")
    fail(tag, "schedule must be constant, step or cosine, got '", c.schedule, "'");
  if (!(c.weight_decay >= 0)) fail(tag, "weight-decay must be >= 0, got ", c.weight_decay);
  if (!(c.clip >= 0)) fail(tag, "clip must be >= 0 (0 disables clipping), got ", c.clip);
  if (!(c.min_lr >= 0)) fail(tag, "min-lr must be >= 0, got ", c.min_lr);
  if (!(c.momentum >= 0 && c.momentum < 1))
    fail(tag, "momentum must be in [0, 1), got ", c.momentum);
  if (c.threads < 0 || c.threads > max_threads())
    fail(tag, "threads must be between 0 (one per core) and ", max_threads(), ", got ", c.threads);
  if (c.dropout < 0 || c.dropout >= 1) fail(tag, "dropout must be in [0, 1)");
  parse_recompute(c.recompute, tag + "recompute");
  if (c.memory_budget < 0) fail(tag, "memory-budget must be >= 0 bytes (0: no limit)");
  if (c.grad_accum < 1) fail(tag, "grad-accum must be >= 1, got ", c.grad_accum);
  if (c.batch_size % c.grad_accum != 0)
    fail(tag, "batch-size ", c.batch_size, " is not divisible by grad-accum ", c.grad_accum,
         " (micro-batches must be equal)");
  if (c.zero < 0 || c.zero > 3) fail(tag, "zero must be 0, 1, 2 or 3, got ", c.zero);
  if (c.param_persistence_threshold < 0)
    fail(tag, "param-persistence-threshold must be >= 0 elements, got ",
         c.param_persistence_threshold);
  if (c.param_persistence_threshold > 0 && c.zero != 3)
    fail(tag,
         "param-persistence-threshold keeps small parameters whole under --zero 3; "
         "this run has --zero ",
         c.zero);
  if (!(c.bucket_mb > 0) || !std::isfinite(c.bucket_mb))
    fail(tag, "bucket-mb must be a positive number of MiB, got ", c.bucket_mb);
  if (!(c.comm_timeout >= 0) || !std::isfinite(c.comm_timeout))
    fail(tag, "comm-timeout must be >= 0 seconds (0: no limit), got ", c.comm_timeout);
  if (c.precision != "fp32" && c.precision != "bf16" && c.precision != "fp16")
    fail(tag, "precision must be fp32, bf16 or fp16, got '", c.precision, "'");
  if (c.grad_scaler != "auto" && c.grad_scaler != "on" && c.grad_scaler != "off")
    fail(tag, "grad-scaler must be auto, on or off, got '", c.grad_scaler, "'");
  if (!(c.loss_scale > 0) || !std::isfinite(static_cast<float>(c.loss_scale)))
    fail(tag, "loss-scale must be a positive number below 3.4e38 (f32), got ", c.loss_scale);
  if (c.loss_scale_growth_interval < 1)
    fail(tag, "loss-scale-growth-interval must be >= 1, got ", c.loss_scale_growth_interval);
  if (!(c.loss_scale_floor >= 0) || !std::isfinite(c.loss_scale_floor))
    fail(tag, "loss-scale-floor must be >= 0, got ", c.loss_scale_floor);
  if (!(c.divergence_factor == 0 || c.divergence_factor > 1))
    fail(tag, "divergence-factor must be above 1 (or 0: never), got ", c.divergence_factor);
  if (c.divergence_steps < 0) fail(tag, "divergence-steps must be >= 0 (0: never)");
  if (c.save_every < 0 || c.warmup < 0 || c.eval_batches < 0)
    fail(tag, "save-every, warmup and eval-batches must be >= 0");
  positive("log-every", static_cast<double>(c.log_every));
  if (c.model == "mlp")
    for (auto h : c.hidden) positive("hidden sizes", static_cast<double>(h));
  if (c.model == "cnn") {
    if (c.widths.empty()) fail(tag, "widths must list at least one stage width");
    for (auto w : c.widths) positive("widths", static_cast<double>(w));
    positive("blocks", static_cast<double>(c.blocks));
  }
  if (c.model == "gpt") {
    positive("layers", static_cast<double>(c.layers));
    positive("heads", static_cast<double>(c.heads));
    positive("width", static_cast<double>(c.width));
    positive("context", static_cast<double>(c.context));
    if (c.width % c.heads != 0)
      fail(tag, "width ", c.width, " must be divisible by heads ", c.heads);
  }
}

bool uses_grad_scaler(const TrainConfig& c) {
  return c.grad_scaler == "on" || (c.grad_scaler == "auto" && c.precision == "fp16");
}

std::string config_to_toml(const TrainConfig& c) {
  std::ostringstream os;
  os.precision(17);
  auto list = [](const std::vector<int64_t>& v) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
    return s + "]";
  };
  os << "preset = \"" << c.preset << "\"\nmodel = \"" << c.model << "\"\ndata = \"" << c.data
     << "\"\nhidden = " << list(c.hidden) << "\nwidths = " << list(c.widths)
     << "\nblocks = " << c.blocks << "\nlayers = " << c.layers << "\nheads = " << c.heads
     << "\nwidth = " << c.width << "\ncontext = " << c.context << "\ndropout = "
     << c.dropout
     // Only the length that is set: read back, an explicit 0 is refused.
     << (c.steps > 0 ? "\nsteps = " + std::to_string(c.steps)
                     : "\nepochs = " + std::to_string(c.epochs))
     << "\nbatch_size = " << c.batch_size << "\nlr = " << c.lr << "\nmin_lr = " << c.min_lr
     << "\nweight_decay = " << c.weight_decay << "\nmomentum = " << c.momentum
     << "\nclip = " << c.clip << "\noptimizer = \"" << c.optimizer << "\"\nschedule = \""
     << c.schedule << "\"\nwarmup = " << c.warmup << "\nseed = " << c.seed << "\nprecision = \""
     << c.precision << "\"\ngrad_scaler = \"" << c.grad_scaler
     << "\"\nloss_scale = " << c.loss_scale
     << "\nloss_scale_growth_interval = " << c.loss_scale_growth_interval
     << "\nloss_scale_floor = " << c.loss_scale_floor << "\n";
  return os.str();
}

}  // namespace hetrain::training
