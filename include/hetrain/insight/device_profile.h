// This machine's ceilings, measured: the FMA peak from a register-only loop, GEMM rates per
// dtype through hetrain::matmul, and memory bandwidth from a STREAM triad. The result is the
// device profile that `hetrain plan` reads as the `local` hardware (docs/PLANNING.md).
//
//   auto p = hetrain::insight::measure_device({.quick = true});
//   hetrain::insight::write_device_profile(p, hetrain::insight::device_profile_path());
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "hetrain/base/dtype.h"
#include "hetrain/planning/catalog.h"

namespace hetrain::insight {

struct BenchOptions {
  bool quick = false;  // about 2 s: fewer repetitions, GEMM at 1024 only
};

/// One measured rate, as printed in the bench table.
struct BenchRow {
  std::string what;    // e.g. "gemm f32 n=2048"
  double value = 0;    // in `unit`
  std::string unit;    // GFLOP/s or GB/s
  double seconds = 0;  // best time of one repetition
  std::string path;    // how it ran, e.g. "OpenBLAS Zen sgemm", "bf16 -> f32 + sgemm"
};

struct DeviceProfile {
  std::string name, date, isa;
  std::string cpu_model;        // /proc/cpuinfo model name: a profile from another CPU is foreign
  std::string hetrain_version;  // HETRAIN_VERSION that measured it: another one is stale
  int threads = 1;
  double llc_bytes = 0;        // last-level cache the triad buffers were sized against
  double fma_peak_gflops = 0;  // all threads, register-only FMA loop, per CPU second
  // The bf16 unit's peak on the same basis (0 where the CPU has none) and its loop's ISA.
  double bf16_peak_gflops = 0;
  std::string bf16_isa;
  // The oneDNN implementation bf16 GEMMs ran with ("brg:avx512_core_amx_bf16", ...), or ""
  // where they were converted to f32.
  std::string gemm_bf16_impl;
  double gemm_f32_tflops = 0, gemm_bf16_tflops = 0, gemm_f16_tflops = 0;  // best size
  double mem_bw_gbs = 0;  // triad, 2 reads + 1 write counted, per wall-clock second
  // The same triad per CPU second of this process times its threads: the bandwidth were the
  // cores ours, on the same basis as the FMA peak (0 when not measured).
  double mem_bw_cpu_gbs = 0;
  double gemm_f32_cpu_gflops = 0;  // best f32 GEMM per CPU second times threads
  double mem_bytes = 0;            // physical memory
  /// f32 GEMM rate (GFLOP/s) at square sizes n, small to large: the planner's GEMM model.
  std::vector<std::pair<int64_t, double>> gemm_f32_curve;
  double cache_bw_gbs = 0;  // triad over buffers filling a sixth of the threads' L2 caches
  double cache_bytes = 0;   // L2 size times threads
  // The engine's own kernels, forward and backward, on this thread count: what the planner
  // charges for convolutions, the attention core and elementwise work on `local`.
  planning::GemmGrid gemm_f32_grid;                // f32 GEMM rates (GFLOP/s) on a grid of shapes
  std::vector<planning::ConvRate> conv_f32_rates;  // GFLOP/s on 3x forward FLOPs
  std::vector<std::pair<double, double>> attention_f32_curve;  // cbrt(s*s*d) -> GFLOP/s
  std::vector<std::pair<double, double>> stream_f32_curve;     // bytes per op -> GB/s
  std::vector<std::pair<double, double>> norm_f32_curve;  // batch norm + ReLU: tensor bytes -> GB/s
  // A GPT layer's elementwise ops: bytes of their passes (planning::transformer_elementwise_
  // passes) -> GB/s.
  std::vector<std::pair<double, double>> layer_f32_curve;
  // The f32 GEMM libraries timed on linear layers' three products (forward, both gradients)
  // at training sizes: seconds for the set (0: not measured), the geometric mean over the
  // layers of OpenBLAS's time over oneDNN's, and the faster, which this machine's runs then
  // take (cpu::set_sgemm_path): "onednn", "openblas" or "" (not measured).
  double sgemm_onednn_s = 0, sgemm_openblas_s = 0, sgemm_openblas_over_onednn = 0;
  std::string sgemm_choice;
  // The same for the f32 convolution kernels on 3x3 layers (cpu::conv_path): the seconds with
  // the engine's own kernels first and with oneDNN's, the geometric mean of own over oneDNN, and
  // the faster: "own", "onednn" or "" (not measured).
  double conv_own_s = 0, conv_onednn_s = 0, conv_own_over_onednn = 0;
  std::string conv_choice;
  // The same for bf16 layers (cpu::bf16_gemm_path): on oneDNN's bf16 kernels or converted to
  // f32; the choice "onednn", "sgemm" (converted) or "" (not measured: no bf16 kernels here).
  double bf16_onednn_s = 0, bf16_f32_s = 0, bf16_f32_over_onednn = 0;
  std::string bf16_choice;
  std::vector<BenchRow> rows;

  /// The planner's device-profile format (version 1) plus the detail rows.
  nlohmann::json to_json() const;
  /// The inverse of to_json(); throws Error naming the missing or bad field.
  static DeviceProfile from_json(const nlohmann::json& j);
  /// Roofline ceilings, both per CPU second so that other processes sharing the cores do not
  /// move the ridge: compute (the FMA peak) and memory (the triad), and the ridge point in
  /// FLOP/byte where they meet.
  double peak_gflops() const { return fma_peak_gflops; }
  /// The compute ceiling of the path a GEMM of `dt` ran on here: the bf16 unit's peak where
  /// bf16 GEMMs ran on it (gemm_bf16_impl names AMX or AVX512-BF16 code), else the f32 FMA
  /// peak. 0 when that unit's peak was not measured (oneDNN on AMX while the AMX loop could
  /// not run).
  double gemm_ceiling_gflops(Dtype dt) const;
  double roof_bw_gbs() const { return mem_bw_cpu_gbs > 0 ? mem_bw_cpu_gbs : mem_bw_gbs; }
  double ridge_flop_per_byte() const {
    return roof_bw_gbs() > 0 ? fma_peak_gflops / roof_bw_gbs() : 0;
  }
};

/// A register-only loop that runs one compute unit at its peak: fn(iters) does
/// iters * flops_per_iter flops and returns a value to sink, equal to result(iters) up to f32
/// rounding (tests check that the loop did its work).
struct PeakKernel {
  float (*fn)(int64_t iters);
  double flops_per_iter;
  const char* isa;  // "avx512f", "avx2+fma", "sse", "amx-bf16", "avx512-bf16"
  bool bf16;        // bf16 products accumulated in f32, else f32 FMA
  double (*result)(int64_t iters);
};
/// Every such loop this CPU can run: the f32 ones widest first, then the bf16 ones, fastest
/// unit first (AMX tiles where the CPU has them and Linux grants the tile state, AVX512-BF16
/// dot products).
std::vector<PeakKernel> peak_kernels();
/// The widest f32 FMA loop (AVX-512, else AVX2+FMA, else SSE multiply+add).
PeakKernel fma_kernel();
/// The fastest bf16 loop, or nullopt on CPUs without bf16 instructions.
std::optional<PeakKernel> bf16_kernel();

/// Runs the measurements on the process-wide thread pool (all its threads). The faster f32
/// GEMM library and convolution kernels are also the ones this process takes from then on
/// (cpu::set_sgemm_path, cpu::conv_choice), as later runs reading the profile will
/// (apply_path_choices).
DeviceProfile measure_device(const BenchOptions& opts = {});

/// What apply_path_choices did for each choice, for `hetrain version`: e.g. "onednn (OpenBLAS's
/// time over oneDNN's on linear layers: 1.08, geometric mean)", or why the built-in rule stays.
struct PathChoiceNotes {
  std::string gemm, conv, bf16;
};
/// Takes the f32 GEMM library, the f32 convolution kernels and the bf16 path that the stored
/// profile at `path` found faster on this machine, where a usable profile (load_device_profile, any
/// thread count) has them.
PathChoiceNotes apply_path_choices(const std::string& path);

/// Reads a stored profile and checks that it is usable here: parses, format version 1, made
/// by this Hetrain version on this CPU model with `threads` threads (0: any). Returns false
/// and says why in *why when it is missing, corrupt, stale or foreign.
bool load_device_profile(const std::string& path, int threads, DeviceProfile* out,
                         std::string* why);

/// The stored profile when it is usable (see load_device_profile), else a fresh measurement
/// (quick), with a warning on stderr saying why. A fresh profile replaces a corrupt, stale
/// or foreign file; one measured for a different thread count than the stored profile's
/// is used for this run only, so the planner keeps the full-machine profile.
DeviceProfile stored_or_measured_profile(const std::string& path);

/// $XDG_CACHE_HOME/hetrain/device_profile.json (default ~/.cache/hetrain/...); "" when
/// neither variable is set.
std::string device_profile_path();

/// Throws hetrain::Error when `path` cannot be written (its directory is created first; then
/// check_output_file, base/file_output.h): nothing else is created or changed. For checking
/// outputs before any work is done.
void check_writable(const std::string& path, const std::string& what);

/// Writes `j` to `path` with write_output_file (atomic replacement of a regular file, written
/// through to a device), creating the directory.
void write_json_atomic(const std::string& path, const nlohmann::json& j);

}  // namespace hetrain::insight
