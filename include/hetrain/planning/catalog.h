// The hardware catalog: accelerators with peak rates, memory, links and prices, loaded from
// a data file (data/hardware.json) where every figure names its source and date.
//
//   auto cat = hetrain::planning::Catalog::load_default();
//   const Hardware& h = cat.get("a100-80gb-sxm");
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "hetrain/planning/comm_table.h"

namespace hetrain::planning {

enum class Precision { bf16, fp16, fp32 };
const char* to_string(Precision p);
Precision precision_from_string(const std::string& s);

/// Where a figure comes from.
struct Source {
  std::string doc, date;
};

/// The parts of the time model that calibration corrects separately: matmul-shaped GEMMs,
/// convolutions, the attention core, and memory-bound work (elementwise, norms, optimizer).
enum class TimePart { gemm = 0, conv = 1, attention = 2, memory = 3 };
const char* to_string(TimePart p);

/// A convolution's measured rate on the `local` device: forward, input gradient and weight
/// gradient of a kernel x kernel conv with that stride (padding kernel/2), in -> out
/// channels and an out_hw x out_hw output, run by the engine; GFLOP/s on three times the
/// forward FLOPs.
struct ConvRate {
  int64_t kernel = 3, stride = 1, in = 0, out = 0, out_hw = 0;
  double gflops = 0;
};

/// The engine's f32 GEMM rate measured on a grid of shapes (the `local` profile): every
/// combination of the m, n and k values, rates[(i * n.size() + j) * k.size() + l]: TFLOP/s
/// in the planner, GFLOP/s in a device profile (as the profile's JSON has them).
struct GemmGrid {
  std::vector<double> m, n, k, rates;
  bool empty() const { return rates.empty(); }
  /// Trilinear in log size and log rate inside the grid; below its smallest size a
  /// dimension's rate falls in proportion (fixed costs dominate), above its largest it stays.
  double at(double m, double n, double k) const;
};

/// How far catalog hardware (no measured curves) falls short of its peaks in training:
/// fitted on the train part of the published runs (data/published_runs.json, `hetrain plan
/// --validate`) and kept in the catalog's "efficiency_model". The defaults are the plain
/// roofline (what a device profile's measured rates already contain).
struct EfficiencyModel {
  /// A GEMM runs at gemm_efficiency x s / (s + gemm_half_size), s its smallest side: small
  /// hidden sizes and tensor-parallel slices reach less of the peak.
  double gemm_half_size = 0;
  /// Share of an unfused layer's elementwise passes that tuned code still makes (fusion).
  double elementwise_fraction = 1;
  /// A fused attention kernel's rate relative to a large GEMM's (FlashAttention style).
  double fused_attention = 1;
  /// Fixed cost per transformer layer per micro-batch, forward and backward (kernel
  /// launches and gaps): why small micro-batches lose throughput.
  double kernel_overhead_us = 0;
  /// Fraction of a link's one-direction peak that collectives reach.
  double link_efficiency = 0.8;
  /// End-to-end loss on top of the modelled step (data loading, synchronisation, logging),
  /// as a fraction of the step.
  double step_overhead = 0;
};

struct Hardware {
  std::string id, name, vendor;
  // Dense peak rates in TFLOP/s; 0 where the device has no such path.
  double tflops_f32 = 0, tflops_tf32 = 0, tflops_bf16 = 0, tflops_f16 = 0, tflops_fp8 = 0;
  double mem_gb = 0;      // device memory, 10^9 bytes
  double mem_bw_gbs = 0;  // device memory bandwidth, GB/s
  std::string link_kind;  // nvlink2|nvlink3|nvlink4|infinity-fabric|ici|nvlink-bridge|pcie|none
  double link_gbs = 0;    // scale-up bandwidth per device, both directions together, GB/s
  int gpus_per_node = 1;  // devices joined by that link
  int pcie_gen = 0;
  double tdp_w = 0;
  double price_per_hour = 0;   // USD per device-hour
  double host_mem_gb = 0;      // host memory per node (for offload)
  double host_mem_bw_gbs = 0;  // host memory bandwidth per node (CPU optimizer step)
  double network_gbs = 0;      // scale-out bandwidth per device, one direction, GB/s
  // Model assumptions (documented in docs/PLANNING.md; overridable per entry).
  double gemm_efficiency = 0.8;  // fraction of peak a large GEMM reaches
  double alpha_intra_us = 5, alpha_inter_us = 15;
  double reserved_gb = 1.0;    // runtime context and allocator slack per device
  double compute_scale = 1.0;  // calibration: measured/predicted compute time
  EfficiencyModel efficiency;  // catalog entries: the catalog's fitted model
  /// Calibration per part of the time model (indexed by TimePart): measured/modelled.
  std::array<double, 4> part_scale{1, 1, 1, 1};
  // Measured devices only (the `local` profile): GEMM rate against GEMM size, as
  // (cube root of m·n·k, f32 TFLOP/s) pairs in increasing size, replacing the constant
  // efficiency; and the bandwidth of operands that fit in the last-level cache.
  std::vector<std::pair<double, double>> gemm_curve;
  double cache_bw_gbs = 0, cache_bytes = 0;
  // Measured devices only: the engine's own kernels, forward and backward, at the profile's
  // thread count. Convolutions by shape (looked up by kernel and stride, then nearest in
  // output size and channels); the causal attention core as (cube root of s*s*d, TFLOP/s on
  // 4 s^2 d FLOPs per head forward); elementwise work as (bytes one op moves, GB/s) with the
  // per-node cost inside; batch norm + ReLU, forward and backward, as (f32 tensor bytes,
  // GB/s of that tensor). Empty: the GEMM curve and triad bandwidths stand in.
  GemmGrid gemm_grid;  // replaces gemm_curve for matmul-shaped GEMMs when present
  std::vector<ConvRate> conv_rates;
  std::vector<std::pair<double, double>> attention_curve, stream_curve, norm_curve;
  // A transformer layer's elementwise ops, forward and backward, as (bytes of the passes
  // transformer_elementwise_passes counts, GB/s).
  std::vector<std::pair<double, double>> layer_curve;
  // Measured devices only: collective timings per world size (`mpirun -np N hetrain bench
  // --comm`); the data-parallel communication of a plan on `local` comes from them.
  std::vector<CommTable> comm_tables;
  bool measured = false;  // from this machine's device profile
  std::map<std::string, Source> sources;

  /// Peak dense matmul rate for a training precision (fp32 uses the plain f32 rate, as
  /// PyTorch does by default).
  double peak_tflops(Precision p) const;
  /// Effective one-direction bandwidths in bytes/s used by the communication model.
  double intra_bw() const;
  double inter_bw() const;
  double pcie_bw() const;
};

class Catalog {
 public:
  /// Parses a catalog file; errors name the file and the entry/field.
  static Catalog load(const std::string& path);
  /// The file named by $HETRAIN_HARDWARE_CATALOG, else <source dir>/data/hardware.json;
  /// plus `local` from the device profile when one exists (see load_device_profile); a
  /// malformed profile is skipped and described in `warning`.
  static Catalog load_default(std::string* warning = nullptr);
  /// Default path of the catalog data file.
  static std::string default_path();
  /// $XDG_CACHE_HOME/hetrain/device_profile.json (default ~/.cache/hetrain/...).
  static std::string device_profile_path();
  /// Adds `local` from a device profile JSON. Returns false (and fills `warning`) for a
  /// malformed file; false with an empty warning when the file does not exist.
  bool load_device_profile(const std::string& path, std::string* warning);

  const Hardware& get(const std::string& id) const;
  bool contains(const std::string& id) const;
  const std::vector<Hardware>& all() const { return items_; }
  void add(Hardware h);
  std::string path;            // file it came from
  EfficiencyModel efficiency;  // the catalog's "efficiency_model", given to every entry

 private:
  std::vector<Hardware> items_;
};

}  // namespace hetrain::planning
