#include "hetrain/insight/device_profile.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <thread>

#include "backends/cpu/conv_dnnl.h"
#include "backends/cpu/gemm.h"
#include "hetrain/base/cpu_features.h"
#include "hetrain/base/cpu_time.h"
#include "hetrain/base/error.h"
#include "hetrain/base/file_output.h"
#include "hetrain/base/thread_pool.h"
#include "hetrain/graph/autodiff.h"
#include "hetrain/graph/ops.h"
#include "hetrain/planning/model_spec.h"
#include "hetrain/runtime/eval.h"

namespace hetrain::insight {

namespace fs = std::filesystem;
using nlohmann::json;

json DeviceProfile::to_json() const {
  json curve = json::array();
  for (const auto& [n, gflops] : gemm_f32_curve) curve.push_back({n, gflops});
  json convs = json::array();
  for (const auto& r : conv_f32_rates)
    convs.push_back({{"kernel", r.kernel},
                     {"stride", r.stride},
                     {"in", r.in},
                     {"out", r.out},
                     {"out_hw", r.out_hw},
                     {"gflops", r.gflops}});
  json detail = json::array();
  for (const auto& r : rows)
    detail.push_back({{"what", r.what},
                      {"value", r.value},
                      {"unit", r.unit},
                      {"seconds", r.seconds},
                      {"path", r.path}});
  return {{"version", 1},
          {"name", name},
          {"date", date},
          {"gemm_tflops",
           {{"f32", gemm_f32_tflops}, {"bf16", gemm_bf16_tflops}, {"f16", gemm_f16_tflops}}},
          {"mem_bw_gbs", mem_bw_gbs},
          {"mem_bw_cpu_gbs", mem_bw_cpu_gbs},
          {"gemm_f32_cpu_gflops", gemm_f32_cpu_gflops},
          {"gemm_f32_curve", curve},
          {"gemm_f32_grid",
           {{"m", gemm_f32_grid.m},
            {"n", gemm_f32_grid.n},
            {"k", gemm_f32_grid.k},
            {"gflops", gemm_f32_grid.rates}}},
          {"conv_f32_rates", convs},
          {"attention_f32_curve", attention_f32_curve},
          {"stream_f32_curve", stream_f32_curve},
          {"norm_f32_curve", norm_f32_curve},
          {"layer_f32_curve", layer_f32_curve},
          {"cache_bw_gbs", cache_bw_gbs},
          {"cache_bytes", cache_bytes},
          {"mem_bytes", mem_bytes},
          {"price_usd_per_hour", 0},
          {"fma_peak_tflops", fma_peak_gflops * 1e-3},
          {"bf16_peak_tflops", bf16_peak_gflops * 1e-3},
          {"bf16_isa", bf16_isa},
          {"gemm_bf16_impl", gemm_bf16_impl},
          {"sgemm",
           {{"onednn_s", sgemm_onednn_s},
            {"openblas_s", sgemm_openblas_s},
            {"openblas_over_onednn", sgemm_openblas_over_onednn},
            {"choice", sgemm_choice}}},
          {"conv",
           {{"own_s", conv_own_s},
            {"onednn_s", conv_onednn_s},
            {"own_over_onednn", conv_own_over_onednn},
            {"choice", conv_choice}}},
          {"bf16_gemm",
           {{"onednn_s", bf16_onednn_s},
            {"f32_s", bf16_f32_s},
            {"f32_over_onednn", bf16_f32_over_onednn},
            {"choice", bf16_choice}}},
          {"isa", isa},
          {"threads", threads},
          {"cpu_model", cpu_model},
          {"hetrain_version", hetrain_version},
          {"llc_bytes", llc_bytes},
          {"measurements", detail},
          {"source", "hetrain bench"}};
}

double DeviceProfile::gemm_ceiling_gflops(Dtype dt) const {
  if (dt != Dtype::bf16 || gemm_bf16_impl.empty()) return fma_peak_gflops;
  // oneDNN names the ISA after the colon: "brg:avx512_core_amx_bf16", "jit:avx512_core_bf16";
  // plain "avx512_core" converts bf16 to f32 inside and runs on the FMA units.
  const std::string isa = gemm_bf16_impl.substr(gemm_bf16_impl.find(':') + 1);
  if (isa.find("amx") != std::string::npos) return bf16_isa == "amx-bf16" ? bf16_peak_gflops : 0;
  if (isa.find("bf16") != std::string::npos) return bf16_peak_gflops;
  return fma_peak_gflops;
}

namespace {
double positive(const json& j, const char* key) {
  if (!j.contains(key) || !j[key].is_number()) fail("field '", key, "' is missing or not a number");
  const double v = j[key].get<double>();
  if (!(v > 0)) fail("field '", key, "' must be positive, got ", v);
  return v;
}
}  // namespace

DeviceProfile DeviceProfile::from_json(const json& j) {
  if (!j.is_object()) fail("expected a JSON object");
  if (j.value("version", 0) != 1) fail("field 'version' must be 1");
  DeviceProfile p;
  p.name = j.value("name", std::string());
  p.date = j.value("date", std::string());
  p.isa = j.value("isa", std::string());
  p.cpu_model = j.value("cpu_model", std::string());
  p.hetrain_version = j.value("hetrain_version", std::string());
  p.threads = j.value("threads", 0);
  p.llc_bytes = j.value("llc_bytes", 0.0);
  if (!j.contains("gemm_tflops") || !j["gemm_tflops"].is_object())
    fail("field 'gemm_tflops' is missing or not an object");
  p.gemm_f32_tflops = positive(j["gemm_tflops"], "f32");
  p.gemm_bf16_tflops = j["gemm_tflops"].value("bf16", 0.0);
  p.gemm_f16_tflops = j["gemm_tflops"].value("f16", 0.0);
  p.fma_peak_gflops = positive(j, "fma_peak_tflops") * 1e3;
  p.bf16_peak_gflops = j.value("bf16_peak_tflops", 0.0) * 1e3;
  p.bf16_isa = j.value("bf16_isa", std::string());
  p.gemm_bf16_impl = j.value("gemm_bf16_impl", std::string());
  if (j.contains("sgemm")) {
    const json& g = j["sgemm"];
    if (!g.is_object()) fail("field 'sgemm' must be an object");
    p.sgemm_onednn_s = g.value("onednn_s", 0.0);
    p.sgemm_openblas_s = g.value("openblas_s", 0.0);
    p.sgemm_openblas_over_onednn = g.value("openblas_over_onednn", 0.0);
    p.sgemm_choice = g.value("choice", std::string());
    if (!p.sgemm_choice.empty() && p.sgemm_choice != "onednn" && p.sgemm_choice != "openblas")
      fail("field 'sgemm.choice' must be \"onednn\" or \"openblas\", got \"", p.sgemm_choice, "\"");
  }
  if (j.contains("conv")) {
    const json& g = j["conv"];
    if (!g.is_object()) fail("field 'conv' must be an object");
    p.conv_own_s = g.value("own_s", 0.0);
    p.conv_onednn_s = g.value("onednn_s", 0.0);
    p.conv_own_over_onednn = g.value("own_over_onednn", 0.0);
    p.conv_choice = g.value("choice", std::string());
    if (!p.conv_choice.empty() && cpu::conv_choice().parse(p.conv_choice.c_str()) < 0)
      fail("field 'conv.choice' must be \"own\" or \"onednn\", got \"", p.conv_choice, "\"");
  }
  if (j.contains("bf16_gemm")) {
    const json& g = j["bf16_gemm"];
    if (!g.is_object()) fail("field 'bf16_gemm' must be an object");
    p.bf16_onednn_s = g.value("onednn_s", 0.0);
    p.bf16_f32_s = g.value("f32_s", 0.0);
    p.bf16_f32_over_onednn = g.value("f32_over_onednn", 0.0);
    p.bf16_choice = g.value("choice", std::string());
    if (!p.bf16_choice.empty() && cpu::bf16_gemm_choice().parse(p.bf16_choice.c_str()) < 0)
      fail("field 'bf16_gemm.choice' must be \"onednn\" or \"sgemm\", got \"", p.bf16_choice, "\"");
  }
  p.mem_bw_gbs = positive(j, "mem_bw_gbs");
  p.mem_bytes = positive(j, "mem_bytes");
  p.mem_bw_cpu_gbs = j.value("mem_bw_cpu_gbs", 0.0);
  p.gemm_f32_cpu_gflops = j.value("gemm_f32_cpu_gflops", 0.0);
  p.cache_bw_gbs = j.value("cache_bw_gbs", 0.0);
  p.cache_bytes = j.value("cache_bytes", 0.0);
  // The [x, rate] curves; malformed points are skipped (the planner's reader is the strict one).
  auto pairs = [&]<class X>(const char* key, std::vector<std::pair<X, double>>& out) {
    if (j.contains(key) && j[key].is_array())
      for (const auto& pt : j[key])
        if (pt.is_array() && pt.size() == 2 && pt[0].is_number() && pt[1].is_number())
          out.emplace_back(pt[0].get<X>(), pt[1].get<double>());
  };
  pairs("gemm_f32_curve", p.gemm_f32_curve);
  if (j.contains("gemm_f32_grid") && j["gemm_f32_grid"].is_object()) {
    const json& g = j["gemm_f32_grid"];
    p.gemm_f32_grid = {g.value("m", std::vector<double>{}), g.value("n", std::vector<double>{}),
                       g.value("k", std::vector<double>{}),
                       g.value("gflops", std::vector<double>{})};
  }
  pairs("attention_f32_curve", p.attention_f32_curve);
  pairs("stream_f32_curve", p.stream_f32_curve);
  pairs("norm_f32_curve", p.norm_f32_curve);
  pairs("layer_f32_curve", p.layer_f32_curve);
  if (j.contains("conv_f32_rates") && j["conv_f32_rates"].is_array())
    for (const auto& r : j["conv_f32_rates"])
      if (r.is_object())
        p.conv_f32_rates.push_back({r.value("kernel", int64_t{0}), r.value("stride", int64_t{0}),
                                    r.value("in", int64_t{0}), r.value("out", int64_t{0}),
                                    r.value("out_hw", int64_t{0}), r.value("gflops", 0.0)});
  if (j.contains("measurements") && j["measurements"].is_array())
    for (const auto& r : j["measurements"])
      p.rows.push_back({r.value("what", std::string()), r.value("value", 0.0),
                        r.value("unit", std::string()), r.value("seconds", 0.0),
                        r.value("path", std::string())});
  return p;
}

bool load_device_profile(const std::string& path, int threads, DeviceProfile* out,
                         std::string* why) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    *why = "no device profile at '" + path + "'";
    return false;
  }
  DeviceProfile p;
  try {
    p = DeviceProfile::from_json(json::parse(in));
  } catch (const std::exception& e) {
    *why = "device profile '" + path + "' is corrupt (" + e.what() + ")";
    return false;
  }
  if (p.hetrain_version != HETRAIN_VERSION) {
    *why = "device profile '" + path + "' is stale: measured by hetrain " +
           (p.hetrain_version.empty() ? std::string("(unknown version)") : p.hetrain_version) +
           ", this is " + HETRAIN_VERSION;
    return false;
  }
  if (p.cpu_model != cpu_features().model) {
    *why = "device profile '" + path + "' is foreign: measured on '" + p.cpu_model +
           "', this CPU is '" + cpu_features().model + "'";
    return false;
  }
  if (threads > 0 && p.threads != threads) {
    *why = "device profile '" + path + "' was measured with " + std::to_string(p.threads) +
           " threads, this run uses " + std::to_string(threads);
    return false;
  }
  *out = std::move(p);
  return true;
}

DeviceProfile stored_or_measured_profile(const std::string& path) {
  DeviceProfile p;
  std::string why;
  if (!path.empty() && load_device_profile(path, num_threads(), &p, &why)) return p;
  if (path.empty()) why = "no cache directory for the device profile (set XDG_CACHE_HOME or HOME)";
  std::cerr << "warning: " << why << "; measuring this machine (hetrain bench --quick)\n";
  p = measure_device({.quick = true});
  // Only a full-machine measurement replaces the stored profile: the planner reads it.
  const bool whole_machine =
      p.threads == static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (!path.empty() && whole_machine) {
    try {
      write_json_atomic(path, p.to_json());
      std::cerr << "device profile: " << path << "\n";
    } catch (const Error& e) {
      std::cerr << "warning: " << e.what() << "; the profile was not stored\n";
    }
  }
  return p;
}

PathChoiceNotes apply_path_choices(const std::string& path) {
  DeviceProfile p;
  std::string why;
  if (path.empty()) why = "no device profile (no cache directory)";
  if (!why.empty() || !load_device_profile(path, 0, &p, &why)) return {why, why, why};
  // Each stored choice is taken and described, or the reason it is missing is given.
  const auto take = [&](cpu::PathChoice& choice, const std::string& stored, const char* timings,
                        const char* ratio_of, double ratio) {
    if (stored.empty()) return "device profile '" + path + "' has no " + timings + " timings";
    choice.set_measured(choice.parse(stored.c_str()));
    char buf[160];
    std::snprintf(buf, sizeof buf, "%s (%s: %.2f, geometric mean)", stored.c_str(), ratio_of,
                  ratio);
    return std::string(buf);
  };
  PathChoiceNotes notes;
  notes.gemm = take(cpu::sgemm_choice(), p.sgemm_choice, "sgemm",
                    "OpenBLAS's time over oneDNN's on linear layers and attention",
                    p.sgemm_openblas_over_onednn);
  notes.conv = take(cpu::conv_choice(), p.conv_choice, "convolution",
                    "the own kernels' time over oneDNN's on 3x3 layers", p.conv_own_over_onednn);
  notes.bf16 = take(cpu::bf16_gemm_choice(), p.bf16_choice, "bf16",
                    "the time converted to f32 over oneDNN's bf16 kernels on bf16 layers",
                    p.bf16_f32_over_onednn);
  return notes;
}

std::string device_profile_path() {
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x)
    return std::string(x) + "/hetrain/device_profile.json";
  if (const char* home = std::getenv("HOME"); home && *home)
    return std::string(home) + "/.cache/hetrain/device_profile.json";
  return "";
}

void check_writable(const std::string& path, const std::string& what) {
  if (path.empty()) fail("no path for ", what, " (set XDG_CACHE_HOME or HOME)");
  fs::path p(path);
  std::error_code ec;
  if (p.has_parent_path()) fs::create_directories(p.parent_path(), ec);
  check_output_file(path, what);
}

void write_json_atomic(const std::string& path, const json& j) {
  fs::path p(path);
  std::error_code ec;
  if (p.has_parent_path()) fs::create_directories(p.parent_path(), ec);
  write_output_file(path, j.dump(2) + "\n", "file");
}

}  // namespace hetrain::insight
