// Performance models: history per footprint, a * size^b + c regression, confidence, and the
// per-machine file.
#include "hetrain/runtime/perf_model.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <sstream>

#include "hetrain/base/cpu_features.h"
#include "hetrain/base/error.h"
#include "hetrain/base/file_input.h"
#include "hetrain/base/file_output.h"
#include "hetrain/base/thread_pool.h"
#if HETRAIN_HAVE_CUDA
#include "backends/cuda/api.h"
#endif

namespace hetrain::runtime {

namespace fs = std::filesystem;

std::string device_class(const DeviceModel& d) {
  if (!d.hardware.empty()) return "hw:" + d.hardware;
  if (d.device.kind == DeviceKind::cpu) return "cpu:" + std::to_string(num_threads()) + "t";
#if HETRAIN_HAVE_CUDA
  // Kernel times carry over between GPUs of one model only.
  if (d.device.kind == DeviceKind::cuda) return "cuda:" + cuda::device_model(d.device.index);
#endif
  std::string s = d.device.kind == DeviceKind::sim ? "sim" : "cuda";
  if (d.device.kind == DeviceKind::sim) {
    std::ostringstream os;
    os << "@" << d.slowdown;
    s += os.str();
  }
  return s;
}

namespace {
// Confidence thresholds: a history entry needs 3 samples and a mean known to 10% (standard
// error / mean <= 0.1: few samples must agree closely, many may scatter); a regression needs 3
// trusted sizes and a relative RMS error of at most 0.25, and answers only within 4x of the
// sizes it was fitted on.
constexpr int64_t kMinSamples = 3;
constexpr double kMaxRelError = 0.1;
constexpr double kMaxFitError = 0.25;
constexpr double kExtrapolation = 4.0;

std::string key_of(const std::string& prim, const std::string& cls, Dtype dt) {
  return prim + "|" + cls + "|" + std::string(dtype_name(dt));
}
}  // namespace

bool PerfModels::stat_trusted(const Stat& s) {
  if (s.n < kMinSamples || s.mean <= 0) return false;
  const double sd = std::sqrt(std::max(0.0, s.m2 / static_cast<double>(s.n - 1)));
  return sd / s.mean / std::sqrt(static_cast<double>(s.n)) <= kMaxRelError;
}

void PerfModels::record(const std::string& prim, const std::string& cls, Dtype dtype,
                        uint64_t footprint, double size, double seconds) {
  std::lock_guard<std::mutex> lk(mu_);
  Entry& e = models_[key_of(prim, cls, dtype)];
  Stat& s = e.history[footprint];
  s.size = size;
  if (s.n >= kMinSamples && seconds > 4 * s.mean) {
    ++s.outliers;
    return;
  }
  const bool was = stat_trusted(s);
  ++s.n;
  const double d = seconds - s.mean;
  s.mean += d / static_cast<double>(s.n);
  s.m2 += d * (seconds - s.mean);
  e.fit_dirty = true;
  if (!was && stat_trusted(s)) ++generation_;
}

void PerfModels::refit(const Entry& e) {
  e.fit_dirty = false;
  Fit& f = e.fit;
  f = Fit{};
  // One point per size (trusted history only), mean time per size.
  std::vector<std::pair<double, double>> pts;
  for (const auto& [fp, s] : e.history)
    if (stat_trusted(s) && s.size > 0) pts.emplace_back(s.size, s.mean);
  std::sort(pts.begin(), pts.end());
  pts.erase(
      std::unique(pts.begin(), pts.end(), [](auto& a, auto& b) { return a.first == b.first; }),
      pts.end());
  if (pts.size() < 3) return;
  double tmin = pts[0].second;
  for (auto& p : pts) tmin = std::min(tmin, p.second);
  // c from a few candidates below the smallest time; a and b by least squares in log-log.
  for (double frac : {0.0, 0.25, 0.5, 0.75, 0.9}) {
    const double c = frac * tmin;
    double sx = 0, sy = 0, sxx = 0, sxy = 0;
    const double n = static_cast<double>(pts.size());
    for (auto& [x, t] : pts) {
      const double lx = std::log(x), ly = std::log(t - c);
      sx += lx;
      sy += ly;
      sxx += lx * lx;
      sxy += lx * ly;
    }
    const double den = n * sxx - sx * sx;
    if (std::abs(den) < 1e-12) continue;
    const double b = (n * sxy - sx * sy) / den;
    const double a = std::exp((sy - b * sx) / n);
    double err = 0;
    for (auto& [x, t] : pts) {
      const double r = (a * std::pow(x, b) + c - t) / t;
      err += r * r;
    }
    err = std::sqrt(err / n);
    if (err < f.rel_rms) f = Fit{a, b, c, err, pts.front().first, pts.back().first, false};
  }
  f.ok = f.rel_rms <= kMaxFitError;
}

PerfEstimate PerfModels::estimate(const std::string& prim, const std::string& cls, Dtype dtype,
                                  uint64_t footprint, double size) const {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = models_.find(key_of(prim, cls, dtype));
  if (it == models_.end()) return {};
  const Entry& e = it->second;
  if (auto h = e.history.find(footprint); h != e.history.end() && stat_trusted(h->second))
    return {h->second.mean, true, "history"};
  if (e.fit_dirty) refit(e);
  const Fit& f = e.fit;
  if (f.ok && size >= f.min_size / kExtrapolation && size <= f.max_size * kExtrapolation)
    return {f.a * std::pow(size, f.b) + f.c, true, "regression"};
  return {};
}

uint64_t PerfModels::generation() const {
  std::lock_guard<std::mutex> lk(mu_);
  return generation_;
}
bool PerfModels::empty() const {
  std::lock_guard<std::mutex> lk(mu_);
  return models_.empty();
}
void PerfModels::clear() {
  std::lock_guard<std::mutex> lk(mu_);
  models_.clear();
  ++generation_;
}

nlohmann::json PerfModels::to_json() const {
  std::lock_guard<std::mutex> lk(mu_);
  nlohmann::json models = nlohmann::json::array();
  std::vector<std::string> keys;
  for (const auto& [k, e] : models_) keys.push_back(k);
  std::sort(keys.begin(), keys.end());
  for (const std::string& k : keys) {
    const Entry& e = models_.at(k);
    const size_t a = k.find('|'), b = k.rfind('|');
    nlohmann::json hist = nlohmann::json::array();
    std::vector<std::pair<uint64_t, Stat>> rows(e.history.begin(), e.history.end());
    std::sort(rows.begin(), rows.end(),
              [](auto& x, auto& y) { return x.second.size < y.second.size; });
    for (const auto& [fp, s] : rows)
      hist.push_back({{"footprint", std::to_string(fp)},
                      {"size", s.size},
                      {"n", s.n},
                      {"mean_s", s.mean},
                      {"m2", s.m2},
                      {"outliers", s.outliers},
                      {"trusted", stat_trusted(s)}});
    if (e.fit_dirty) refit(e);
    nlohmann::json fit = {{"a", e.fit.a},
                          {"b", e.fit.b},
                          {"c", e.fit.c},
                          {"rel_rms", e.fit.rel_rms},
                          {"trusted", e.fit.ok}};
    models.push_back({{"prim", k.substr(0, a)},
                      {"device", k.substr(a + 1, b - a - 1)},
                      {"dtype", k.substr(b + 1)},
                      {"history", hist},
                      {"regression", fit}});
  }
  return {{"format", "hetrain-perfmodel"},
          {"version", 1},
          {"machine", machine_id()},
          {"models", models}};
}

void PerfModels::from_json(const nlohmann::json& j) {
  auto need = [](const nlohmann::json& o, const char* field,
                 const std::string& where) -> const nlohmann::json& {
    if (!o.is_object() || !o.contains(field))
      fail("[perfmodel] ", where, " lacks field '", field, "'");
    return o.at(field);
  };
  if (need(j, "format", "file") != "hetrain-perfmodel")
    fail("[perfmodel] field 'format' is not hetrain-perfmodel");
  if (need(j, "version", "file") != 1)
    fail("[perfmodel] unsupported 'version' ", j.at("version").dump());
  std::unordered_map<std::string, Entry> fresh;
  const auto& models = need(j, "models", "file");
  if (!models.is_array()) fail("[perfmodel] field 'models' is not an array");
  try {
    for (size_t i = 0; i < models.size(); ++i) {
      const auto& m = models[i];
      const std::string where = "models[" + std::to_string(i) + "]";
      const std::string dt = need(m, "dtype", where).get<std::string>();
      Entry& e = fresh[need(m, "prim", where).get<std::string>() + "|" +
                       need(m, "device", where).get<std::string>() + "|" +
                       std::string(dtype_name(dtype_from_name(dt)))];
      const auto& hist = need(m, "history", where);
      for (size_t k = 0; k < hist.size(); ++k) {
        const auto& h = hist[k];
        const std::string hw = where + ".history[" + std::to_string(k) + "]";
        Stat s;
        s.size = need(h, "size", hw).get<double>();
        s.n = need(h, "n", hw).get<int64_t>();
        s.mean = need(h, "mean_s", hw).get<double>();
        s.m2 = need(h, "m2", hw).get<double>();
        if (s.n < 0 || !(s.mean >= 0) || !(s.m2 >= 0) || !(s.size >= 0))
          fail("[perfmodel] ", hw, " has a negative or invalid value");
        e.history[std::stoull(need(h, "footprint", hw).get<std::string>())] = s;
      }
    }
  } catch (const nlohmann::json::exception& e) {
    fail("[perfmodel] malformed entry: ", e.what());
  } catch (const std::logic_error& e) {
    if (dynamic_cast<const Error*>(&e)) throw;
    fail("[perfmodel] malformed entry: ", e.what());
  }
  std::lock_guard<std::mutex> lk(mu_);
  models_ = std::move(fresh);
  ++generation_;
}

std::string PerfModels::load(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return "";
  // Not a regular file (a directory): an error naming it, never set aside (renamed) below.
  const std::string text = read_input_file(path, "[perfmodel] performance models");
  std::string why;
  try {
    nlohmann::json j = nlohmann::json::parse(text);
    const std::string machine = j.is_object() && j.contains("machine") && j["machine"].is_string()
                                    ? j["machine"].get<std::string>()
                                    : "";
    if (machine != machine_id()) {
      why = "it was written on another machine ('" + machine + "', this is '" + machine_id() + "')";
    } else {
      from_json(j);
      return "";
    }
  } catch (const nlohmann::json::exception& e) {
    why = std::string("it is not valid JSON (") + e.what() + ")";
  } catch (const Error& e) {
    why = e.what();
  }
  fs::rename(path, path + ".bad", ec);
  clear();
  return "performance models " + path + " set aside as " + path + ".bad and recalibrated: " + why;
}

void PerfModels::save(const std::string& path) const {
  const std::string text = to_json().dump(1);
  std::error_code ec;
  fs::create_directories(fs::path(path).parent_path(), ec);
  try {
    write_output_file(path, text + "\n", "performance models");
  } catch (const Error& e) {
    fail("[perfmodel] ", e.what());
  }
}

PerfModels& perf_models() {
  static PerfModels* m = new PerfModels();
  return *m;
}

namespace {
std::atomic<bool> g_recording{false};
}
void set_perf_recording(bool on) { g_recording = on; }
bool perf_recording() { return g_recording.load(std::memory_order_relaxed); }

std::string perf_model_path() {
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x)
    return std::string(x) + "/hetrain/perfmodel.json";
  if (const char* home = std::getenv("HOME"); home && *home)
    return std::string(home) + "/.cache/hetrain/perfmodel.json";
  return "";
}

std::string machine_id() {
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0) host[0] = '\0';
  return std::string(host) + " / " + cpu_features().model;
}

uint64_t shape_footprint(const std::vector<std::vector<int64_t>>& shapes) {
  uint64_t h = 1469598103934665603ULL;
  for (const auto& s : shapes) {
    h = (h ^ (s.size() + 0x100)) * 1099511628211ULL;
    for (int64_t d : s) h = (h ^ static_cast<uint64_t>(d)) * 1099511628211ULL;
  }
  return h;
}

CalibratedModel::CalibratedModel(std::vector<DeviceModel> devices, const PerfModels& models)
    : roofline_(devices), models_(models) {
  for (const DeviceModel& d : devices) classes_.push_back(device_class(d));
}

PerfEstimate CalibratedModel::estimate(const TaskNode& node, int d) const {
  return models_.estimate(node.name, classes_[static_cast<size_t>(d)], node.dtype, node.footprint,
                          node.size);
}

double CalibratedModel::node_seconds(const TaskNode& node, int d) const {
  if (node.view) return roofline_.node_seconds(node, d);
  const PerfEstimate e = estimate(node, d);
  if (!e.trusted) return roofline_.node_seconds(node, d);
  return e.seconds + roofline_.devices()[static_cast<size_t>(d)].node_overhead_s;
}

}  // namespace hetrain::runtime
