#include "hetrain/planning/catalog.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>

#include "hetrain/base/cpu_features.h"
#include "hetrain/base/error.h"
#include "hetrain/base/file_input.h"

namespace hetrain::planning {

using nlohmann::json;

const char* to_string(Precision p) {
  switch (p) {
    case Precision::bf16:
      return "bf16";
    case Precision::fp16:
      return "fp16";
    case Precision::fp32:
      return "fp32";
  }
  return "?";
}

Precision precision_from_string(const std::string& s) {
  if (s == "bf16") return Precision::bf16;
  if (s == "fp16") return Precision::fp16;
  if (s == "fp32") return Precision::fp32;
  fail("[plan] --precision expects bf16|fp16|fp32, got '", s, "'");
}

double Hardware::peak_tflops(Precision p) const {
  switch (p) {
    case Precision::bf16:
      return tflops_bf16;
    case Precision::fp16:
      return tflops_f16;
    case Precision::fp32:
      return tflops_f32;
  }
  return 0;
}

// Collective bandwidth reaches a fraction of a link's one-direction peak (NCCL bus bandwidth
// on NVLink/InfiniBand): efficiency.link_efficiency, 0.8 unless the catalog's fit says else.
double Hardware::intra_bw() const { return link_gbs / 2 * 1e9 * efficiency.link_efficiency; }
double Hardware::inter_bw() const { return network_gbs * 1e9 * efficiency.link_efficiency; }
double Hardware::pcie_bw() const {
  // x16, one direction: Gen3 15.75, Gen4 31.5, Gen5 63 GB/s.
  double gbs = pcie_gen >= 5 ? 63 : pcie_gen == 4 ? 31.5 : pcie_gen == 3 ? 15.75 : 0;
  return gbs * 1e9 * efficiency.link_efficiency;
}

namespace {

// Catalog and profile figures are rates, sizes, prices and counts: none is negative, and none
// comes near 1e15 (TFLOP/s, GB/s, USD per hour, watts; a profile's memory in bytes); a larger
// one is a typo that would push the plan's days or cost towards infinity.
constexpr double kMaxFigure = 1e15;

double number(const json& obj, const std::string& key, const std::string& where) {
  auto it = obj.find(key);
  if (it == obj.end() || !it->is_number())
    fail("[plan] ", where, ": field '", key, "' must be a number");
  double v = it->get<double>();
  if (!(v >= 0 && v <= kMaxFigure))
    fail("[plan] ", where, ": field '", key, "' must be in [0, ", kMaxFigure, "], got ", v);
  return v;
}

int integer(const json& obj, const std::string& key, const std::string& where, int lo, int hi) {
  const double v = number(obj, key, where);
  if (v != std::floor(v) || v < lo || v > hi)
    fail("[plan] ", where, ": field '", key, "' must be an integer in [", lo, ", ", hi, "], got ",
         v);
  return static_cast<int>(v);
}

std::string text(const json& obj, const std::string& key, const std::string& where) {
  auto it = obj.find(key);
  if (it == obj.end() || !it->is_string())
    fail("[plan] ", where, ": field '", key, "' must be a string");
  return it->get<std::string>();
}

// Figure groups that must each carry a source and a date.
const char* kSourced[] = {"peak_tflops",        "memory", "link", "pcie_gen", "tdp_w",
                          "price_usd_per_hour", "host"};

Hardware parse_entry(const json& e, const std::string& file, size_t index) {
  Hardware h;
  std::string where = file + ": hardware[" + std::to_string(index) + "]";
  h.id = text(e, "id", where);
  where = file + ": hardware '" + h.id + "'";
  h.name = text(e, "name", where);
  h.vendor = text(e, "vendor", where);
  if (!e.contains("peak_tflops") || !e["peak_tflops"].is_object())
    fail("[plan] ", where, ": field 'peak_tflops' must be an object");
  const json& pk = e["peak_tflops"];
  std::string wp = where + " peak_tflops";
  h.tflops_f32 = number(pk, "f32", wp);
  h.tflops_tf32 = number(pk, "tf32", wp);
  h.tflops_bf16 = number(pk, "bf16", wp);
  h.tflops_f16 = number(pk, "f16", wp);
  h.tflops_fp8 = number(pk, "fp8", wp);
  h.mem_gb = number(e, "mem_gb", where);
  h.mem_bw_gbs = number(e, "mem_bw_gbs", where);
  if (h.mem_gb <= 0 || h.mem_bw_gbs <= 0)
    fail("[plan] ", where, ": mem_gb and mem_bw_gbs must be positive");
  if (!e.contains("link") || !e["link"].is_object())
    fail("[plan] ", where, ": field 'link' must be an object {kind, gbs, gpus_per_node}");
  const json& ln = e["link"];
  h.link_kind = text(ln, "kind", where + " link");
  h.link_gbs = number(ln, "gbs", where + " link");
  h.gpus_per_node = integer(ln, "gpus_per_node", where + " link", 1, 1000000);
  // Link speeds divide transfer sizes: 0 would make every multi-device plan take forever.
  if (h.gpus_per_node > 1 && h.link_gbs <= 0)
    fail("[plan] ", where, ": link.gbs must be positive (", h.gpus_per_node,
         " devices per node share the link), got ", h.link_gbs);
  h.pcie_gen = integer(e, "pcie_gen", where, 0, 10);
  h.tdp_w = number(e, "tdp_w", where);
  h.price_per_hour = number(e, "price_usd_per_hour", where);
  h.host_mem_gb = number(e, "host_mem_gb_per_device", where);
  h.host_mem_bw_gbs = number(e, "host_mem_bw_gbs_per_device", where);
  if (h.pcie_gen > 0 && h.host_mem_bw_gbs <= 0)
    fail("[plan] ", where, ": host_mem_bw_gbs_per_device must be positive (offload reads host ",
         "memory over its PCIe link), got 0");
  h.network_gbs = number(e, "network_gbs_per_device", where);
  if (e.contains("gemm_efficiency")) h.gemm_efficiency = number(e, "gemm_efficiency", where);
  if (!(h.gemm_efficiency > 0 && h.gemm_efficiency <= 1))
    fail("[plan] ", where, ": gemm_efficiency must be in (0, 1], got ", h.gemm_efficiency);
  if (e.contains("alpha_intra_us")) h.alpha_intra_us = number(e, "alpha_intra_us", where);
  if (e.contains("alpha_inter_us")) h.alpha_inter_us = number(e, "alpha_inter_us", where);
  if (e.contains("reserved_gb")) h.reserved_gb = number(e, "reserved_gb", where);
  if (!e.contains("sources") || !e["sources"].is_object())
    fail("[plan] ", where, ": field 'sources' must be an object");
  for (const char* key : kSourced) {
    auto it = e["sources"].find(key);
    if (it == e["sources"].end() || !it->is_object())
      fail("[plan] ", where, ": sources.", key, " is missing (every figure needs a source)");
    Source s{text(*it, "doc", where + " sources." + key),
             text(*it, "date", where + " sources." + key)};
    if (s.doc.empty() || s.date.empty())
      fail("[plan] ", where, ": sources.", key, " needs a non-empty doc and date");
    h.sources[key] = s;
  }
  for (const auto& [key, v] : e["sources"].items()) {  // optional extras, e.g. gemm_efficiency
    if (h.sources.count(key)) continue;
    if (!v.is_object()) fail("[plan] ", where, ": sources.", key, " must be {doc, date}");
    h.sources[key] = Source{text(v, "doc", where + " sources." + key),
                            text(v, "date", where + " sources." + key)};
  }
  if (e.contains("gemm_efficiency") && !h.sources.count("gemm_efficiency"))
    fail("[plan] ", where, ": gemm_efficiency needs sources.gemm_efficiency");
  return h;
}

}  // namespace

static EfficiencyModel parse_efficiency(const json& e, const std::string& file) {
  const std::string where = file + ": efficiency_model";
  if (!e.is_object()) fail("[plan] ", where, ": expected an object");
  EfficiencyModel m;
  auto field = [&](const char* key, double& v, double lo, double hi) {
    if (!e.contains(key)) return;
    v = number(e, key, where);
    if (!(v >= lo && v <= hi))
      fail("[plan] ", where, ": '", key, "' must be in [", lo, ", ", hi, "], got ", v);
  };
  field("gemm_half_size", m.gemm_half_size, 0, 1e5);
  field("elementwise_fraction", m.elementwise_fraction, 0, 10);
  field("fused_attention", m.fused_attention, 0.01, 1);
  field("kernel_overhead_us", m.kernel_overhead_us, 0, 1e5);
  field("link_efficiency", m.link_efficiency, 0.05, 1);
  field("step_overhead", m.step_overhead, 0, 10);
  return m;
}

Catalog Catalog::load(const std::string& path) {
  json j = read_json_file(path, "[plan] hardware catalog");
  if (!j.contains("hardware") || !j["hardware"].is_array())
    fail("[plan] hardware catalog '", path, "': expected a 'hardware' array");
  Catalog c;
  c.path = path;
  if (j.contains("efficiency_model")) c.efficiency = parse_efficiency(j["efficiency_model"], path);
  size_t i = 0;
  for (const auto& e : j["hardware"]) {
    Hardware h = parse_entry(e, path, i++);
    h.efficiency = c.efficiency;
    c.add(std::move(h));
  }
  return c;
}

void Catalog::add(Hardware h) {
  if (contains(h.id)) fail("[plan] hardware catalog: duplicate id '", h.id, "'");
  items_.push_back(std::move(h));
}

std::string Catalog::default_path() {
  if (const char* p = std::getenv("HETRAIN_HARDWARE_CATALOG"); p && *p) return p;
  return std::string(HETRAIN_SOURCE_DIR) + "/data/hardware.json";
}

std::string Catalog::device_profile_path() {
  std::string base;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) {
    base = x;
  } else if (const char* home = std::getenv("HOME"); home && *home) {
    base = std::string(home) + "/.cache";
  } else {
    return "";
  }
  return base + "/hetrain/device_profile.json";
}

namespace {

// A profile's [x, rate] curve, sorted by x, rates times `scale`; absent: empty.
std::vector<std::pair<double, double>> profile_curve(const json& j, const char* key,
                                                     const char* pair, double scale) {
  std::vector<std::pair<double, double>> out;
  if (!j.contains(key)) return out;
  const json& c = j[key];
  if (!c.is_array()) fail("'", key, "' must be an array of [", pair, "] pairs");
  for (const auto& e : c) {
    if (!e.is_array() || e.size() != 2 || !e[0].is_number() || !e[1].is_number() ||
        e[0].get<double>() <= 0 || e[1].get<double>() <= 0)
      fail("'", key, "' entries must be [", pair, "] with both positive");
    out.emplace_back(e[0].get<double>(), e[1].get<double>() * scale);
  }
  std::sort(out.begin(), out.end());
  for (size_t i = 1; i < out.size(); ++i)
    if (out[i].first == out[i - 1].first) fail("'", key, "' has two entries at ", out[i].first);
  return out;
}

// {"m": [..], "n": [..], "k": [..], "gflops": [m-major, then n, then k]}: increasing
// positive sizes, one positive rate per combination.
GemmGrid profile_grid(const json& g) {
  if (!g.is_object()) fail("'gemm_f32_grid' must be an object with m, n, k and gflops");
  GemmGrid out;
  for (auto [key, v] :
       {std::pair{"m", &out.m}, {"n", &out.n}, {"k", &out.k}, {"gflops", &out.rates}}) {
    if (!g.contains(key) || !g[key].is_array() || g[key].empty())
      fail("'gemm_f32_grid' field '", key, "' must be a non-empty array of numbers");
    for (const auto& e : g[key]) {
      if (!e.is_number() || e.get<double>() <= 0)
        fail("'gemm_f32_grid' field '", key, "' must hold positive numbers");
      v->push_back(e.get<double>());
    }
    if (v != &out.rates && !std::is_sorted(v->begin(), v->end(), std::less_equal<double>()))
      fail("'gemm_f32_grid' field '", key, "' must be strictly increasing");
  }
  if (out.rates.size() != out.m.size() * out.n.size() * out.k.size())
    fail("'gemm_f32_grid' has ", out.rates.size(), " rates for ", out.m.size(), " x ", out.n.size(),
         " x ", out.k.size(), " shapes");
  for (double& r : out.rates) r *= 1e-3;
  return out;
}

}  // namespace

double GemmGrid::at(double mm, double nn, double kk) const {
  // Per dimension: the bracketing indices, the weight of the upper one, and the factor
  // below the smallest size.
  struct Axis {
    size_t lo = 0, hi = 0;
    double t = 0, below = 1;
  };
  auto axis = [](const std::vector<double>& v, double x) {
    Axis a;
    if (x <= v.front()) {
      a.below = x / v.front();
    } else if (x >= v.back()) {
      a.lo = a.hi = v.size() - 1;
    } else {
      a.hi = 1;
      while (v[a.hi] < x) ++a.hi;
      a.lo = a.hi - 1;
      a.t = std::log(x / v[a.lo]) / std::log(v[a.hi] / v[a.lo]);
    }
    return a;
  };
  const Axis am = axis(m, mm), an = axis(n, nn), ak = axis(k, kk);
  double log_rate = 0;
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j)
      for (int l = 0; l < 2; ++l) {
        const double w = (i ? am.t : 1 - am.t) * (j ? an.t : 1 - an.t) * (l ? ak.t : 1 - ak.t);
        if (w == 0) continue;
        const size_t idx =
            ((i ? am.hi : am.lo) * n.size() + (j ? an.hi : an.lo)) * k.size() + (l ? ak.hi : ak.lo);
        log_rate += w * std::log(rates[idx]);
      }
  return std::exp(log_rate) * am.below * an.below * ak.below;
}

bool Catalog::load_device_profile(const std::string& path, std::string* warning) {
  if (warning) warning->clear();
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return false;
  try {
    json j = read_json_file(path, "device profile");
    if (!json_version_is(j, 1)) fail("expected an object with \"version\": 1");
    // A profile `hetrain bench` wrote on another CPU or with another version describes
    // other hardware or another engine; a hand-written one (no such fields) is taken as is.
    if (j.contains("cpu_model") && j["cpu_model"] != cpu_features().model)
      fail("it is foreign: measured on '", j["cpu_model"].dump(), "', this CPU is '",
           cpu_features().model, "' (run 'hetrain bench' again)");
    if (j.contains("hetrain_version") && j["hetrain_version"] != HETRAIN_VERSION)
      fail("it is stale: measured by hetrain ", j["hetrain_version"].dump(), ", this is ",
           HETRAIN_VERSION, " (run 'hetrain bench' again)");
    if (!j.contains("gemm_tflops") || !j["gemm_tflops"].is_object())
      fail("expected 'gemm_tflops' {\"f32\": .., \"bf16\": .., \"f16\": ..}");
    Hardware h;
    h.id = "local";
    h.name = j.value("name", std::string("this machine (measured)"));
    h.vendor = "local";
    const json& g = j["gemm_tflops"];
    h.tflops_f32 = number(g, "f32", "gemm_tflops");
    h.tflops_bf16 = g.contains("bf16") ? number(g, "bf16", "gemm_tflops") : 0;
    h.tflops_f16 = g.contains("f16") ? number(g, "f16", "gemm_tflops") : 0;
    h.tflops_tf32 = h.tflops_f32;
    h.mem_bw_gbs = number(j, "mem_bw_gbs", "profile");
    h.mem_gb = number(j, "mem_bytes", "profile") / 1e9;
    if (h.mem_gb <= 0 || h.mem_bw_gbs <= 0 || h.tflops_f32 <= 0)
      fail("mem_bytes, mem_bw_gbs and gemm_tflops.f32 must be positive");
    h.link_kind = "none";
    h.gpus_per_node = 1;
    h.price_per_hour = j.value("price_usd_per_hour", 0.0);
    h.gemm_efficiency = 1.0;  // measured rates are already achieved rates
    h.gemm_curve = profile_curve(j, "gemm_f32_curve", "n, GFLOP/s", 1e-3);
    if (j.contains("gemm_f32_grid")) h.gemm_grid = profile_grid(j["gemm_f32_grid"]);
    h.attention_curve = profile_curve(j, "attention_f32_curve", "size, GFLOP/s", 1e-3);
    h.stream_curve = profile_curve(j, "stream_f32_curve", "bytes, GB/s", 1);
    h.norm_curve = profile_curve(j, "norm_f32_curve", "bytes, GB/s", 1);
    h.layer_curve = profile_curve(j, "layer_f32_curve", "bytes, GB/s", 1);
    if (j.contains("conv_f32_rates")) {
      const json& c = j["conv_f32_rates"];
      if (!c.is_array()) fail("'conv_f32_rates' must be an array of objects");
      for (const auto& e : c) {
        if (!e.is_object()) fail("'conv_f32_rates' entries must be objects");
        ConvRate r;
        for (auto [key, field] : {std::pair{"kernel", &r.kernel},
                                  {"stride", &r.stride},
                                  {"in", &r.in},
                                  {"out", &r.out},
                                  {"out_hw", &r.out_hw}}) {
          if (!e.contains(key) || !e[key].is_number_integer() || e[key].get<int64_t>() < 1)
            fail("'conv_f32_rates' entry field '", key, "' must be a positive integer");
          *field = e[key].get<int64_t>();
        }
        r.gflops = number(e, "gflops", "conv_f32_rates entry");
        if (r.gflops <= 0) fail("'conv_f32_rates' entry field 'gflops' must be positive");
        h.conv_rates.push_back(r);
      }
    }
    h.cache_bw_gbs = j.value("cache_bw_gbs", 0.0);
    h.cache_bytes = j.value("cache_bytes", 0.0);
    if (h.cache_bw_gbs < 0 || h.cache_bytes < 0)
      fail("cache_bw_gbs and cache_bytes must not be negative");
    h.comm_tables = comm_tables_from_json(j, "device profile");
    h.reserved_gb = 0;
    h.measured = true;
    std::string date = j.value("date", std::string("unknown"));
    for (const char* key : kSourced) h.sources[key] = Source{"measured: " + path, date};
    items_.erase(std::remove_if(items_.begin(), items_.end(),
                                [](const Hardware& x) { return x.id == "local"; }),
                 items_.end());
    items_.push_back(std::move(h));
    return true;
  } catch (const std::exception& e) {
    if (warning) *warning = "ignoring device profile '" + path + "': " + e.what();
    return false;
  }
}

Catalog Catalog::load_default(std::string* warning) {
  Catalog c = load(default_path());
  std::string profile = device_profile_path();
  if (!profile.empty()) c.load_device_profile(profile, warning);
  return c;
}

bool Catalog::contains(const std::string& id) const {
  for (const auto& h : items_)
    if (h.id == id) return true;
  return false;
}

const Hardware& Catalog::get(const std::string& id) const {
  for (const auto& h : items_)
    if (h.id == id) return h;
  std::string all;
  for (const auto& h : items_) all += (all.empty() ? "" : ", ") + h.id;
  if (id == "local")
    fail(
        "[plan] unknown hardware 'local': this machine joins the catalog once 'hetrain bench' "
        "has written its device profile (",
        device_profile_path(), "); known: ", all);
  fail("[plan] unknown hardware '", id, "'; known: ", all, " (see 'hetrain plan --list-hardware')");
}

}  // namespace hetrain::planning
