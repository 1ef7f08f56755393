// The planner: memory per device and time per step for a model, hardware, device count and
// parallel/memory strategy; and a search over those under a budget and a deadline.
//
//   Job job{preset("llama-7b"), 1e12, 1024, Precision::bf16};
//   Strategy s; s.zero = 3; s.micro_batch = 2;
//   Plan p = evaluate(job, catalog.get("a100-80gb-sxm"), 64, s);
//   p.memory.total, p.time.step, p.cost_usd ...
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "hetrain/planning/catalog.h"
#include "hetrain/planning/model_spec.h"

namespace hetrain::planning {

enum class Offload { none, optimizer, optimizer_params };
const char* to_string(Offload o);
Offload offload_from_string(const std::string& s);

struct Strategy {
  int tp = 1, pp = 1, zero = 0;
  Offload offload = Offload::none;
  Recompute recompute = Recompute::none;
  int64_t micro_batch = 1;
  bool sequence_parallel = true;  // Megatron-style, only meaningful with tp > 1
  /// Data-parallel gradient traffic overlapped with the backward pass (bucketed all-reduce,
  /// PyTorch DDP, Megatron-LM since 2020). false: the gradients are all-reduced after the
  /// backward, all of it exposed (Megatron-LM 2019's local DDP: one flattened all-reduce
  /// after backward).
  bool overlap_dp = true;
  /// Interleaved 1F1B pipeline schedule (Narayanan et al. 2021, section 2.2.2): each device
  /// holds this many non-adjacent chunks of its layers; the bubble is divided by it, the
  /// point-to-point traffic multiplied. 1: the plain 1F1B schedule. Needs pp > 1.
  int virtual_stages = 1;
  /// With full recompute: how many of a device's layers are recomputed, the others keeping
  /// their activations (Megatron-LM's --recompute-method block --recompute-num-layers).
  /// 0: every layer. Needs recompute full and fewer than the device's layers.
  int recompute_layers = 0;
  /// Share of a device's layers whose forward is recomputed under full recompute (1 for all).
  double recompute_share(int64_t layers) const;
  std::string describe() const;
};

struct Job {
  ModelSpec model;
  double tokens = 0;         // training tokens (samples x tokens per sample)
  int64_t global_batch = 0;  // samples per optimizer step
  Precision precision = Precision::bf16;
  /// End-to-end rate per device as papers publish it (Megatron-LM, BLOOM, OPT): hardware
  /// FLOPs of a step, recompute included, over wall time. The step is flops / (devices x
  /// rate); communication, bubble and optimizer are inside the figure, not added.
  std::optional<double> achieved_tflops;
  /// Kernel rate per device: replaces the compute model only; communication, the pipeline
  /// bubble and the optimizer step come on top.
  std::optional<double> kernel_tflops;
  std::optional<double> price_per_hour;  // replaces the catalog price
  /// A fused attention kernel (FlashAttention, cuDNN, xformers): the s x s scores are neither
  /// stored for backward nor passed over by mask/softmax/dropout, and the core runs at the
  /// efficiency model's fused rate (its backward recomputes the scores: 2.5 x forward).
  /// false: Megatron-LM 2021's unfused core (Korthikanti et al.'s 5as^2b bytes per layer).
  bool fused_attention = true;
};

/// Bytes per device. `total` includes everything below.
struct MemoryBreakdown {
  double weights = 0, gradients = 0, optimizer = 0, activations = 0, temporary = 0, reserved = 0,
         total = 0;
  double capacity = 0;         // device memory
  double host_per_device = 0;  // host memory the offload needs, per device
  double host_capacity = 0;
};

/// Seconds per optimizer step.
struct TimeBreakdown {
  double compute = 0;    // forward + backward + recompute, all micro-batches, one stage
  double recompute = 0;  // part of compute
  double tp_comm = 0, pp_comm = 0;
  double dp_comm = 0;     // data-parallel/ZeRO traffic time if nothing overlapped
  double dp_exposed = 0;  // what is left after overlap with backward (and forward, ZeRO-3)
  double bubble = 0;      // pipeline fill and drain
  double optimizer = 0;   // optimizer step (on the GPU, or on the CPU when offloaded)
  double offload = 0;     // exposed host<->device transfers
  double overhead = 0;    // end-to-end loss of the efficiency model (step_overhead), in step
  double step = 0;
};

struct Plan {
  std::string hardware;
  int gpus = 0;
  Strategy strategy;
  int dp = 1;
  int64_t micro_batches = 1;  // per data-parallel rank per step
  int64_t params = 0;
  double flops_per_step = 0;        // hardware FLOPs, recompute included
  double model_flops_per_step = 0;  // 3 x forward (what MFU counts)
  MemoryBreakdown memory;
  TimeBreakdown time;
  bool fits = false;
  std::string fit_reason;  // why it does not fit
  double steps = 0, tokens_per_s = 0, achieved_tflops_per_gpu = 0, mfu = 0;
  double compute_tflops_per_gpu = 0;  // rate of the compute part alone
  double train_days = 0, gpu_hours = 0, cost_usd = 0;
  bool priced = true;
};

/// Checks the strategy against the model and device count; throws Error saying why.
void check_strategy(const Job& job, const Hardware& hw, int gpus, const Strategy& s);
/// Memory and time of one configuration. Throws Error for inconsistent input.
Plan evaluate(const Job& job, const Hardware& hw, int gpus, const Strategy& s);

// Building blocks, exposed for tests. Times in seconds, sizes in bytes, bandwidth in bytes/s.
double ring_allreduce_time(double bytes, int p, double bw, double alpha);
double tree_allreduce_time(double bytes, int p, double bw, double alpha);
double allreduce_time(double bytes, int p, double bw, double alpha);       // min of both
double reduce_scatter_time(double bytes, int p, double bw, double alpha);  // = all-gather
/// Time of an (m x k) @ (k x n) GEMM: roofline with 128x128 tile quantisation.
double gemm_time(double m, double n, double k, double peak_flops, double efficiency, double mem_bw,
                 double bytes_per_elem);
/// A measured device's rate for a convolution layer (GFLOP/s, forward and both gradients):
/// among its measured convolutions of the same kernel (and the same stride where it has
/// them), the geometric mean weighted by inverse squared distance in log output size and log
/// channels (the one at distance 0 exactly). 0 when none has that kernel size.
double conv_rate_gflops(const std::vector<ConvRate>& rates, const ConvLayer& l);

/// Model-state bytes per device (weights, gradients, optimizer incl. master weights) for
/// `params` parameters on this device: the ZeRO paper's accounting, K = 12 for mixed
/// precision Adam (fp32 master, momentum, variance), 16-bit weights and gradients;
/// fp32 training keeps 4-byte weights and gradients and K = 8.
struct ModelStates {
  double weights = 0, gradients = 0, optimizer = 0, host = 0;
};
ModelStates model_state_bytes(double params, int dp, int zero, Offload offload, Precision p);

struct SearchOptions {
  std::vector<std::string> hardware;  // candidates (empty: the whole catalog)
  std::vector<int> gpus;              // candidates (empty: 1, 2, 4, 8, 16, 24, 32, 48, ...)
  int max_gpus = 4096;
  std::optional<int> tp, pp, zero, virtual_stages, recompute_layers;
  std::optional<Offload> offload;
  std::optional<Recompute> recompute;
  std::optional<int64_t> micro_batch;
  std::optional<double> budget_usd, deadline_days;
  size_t top = 10;
  /// Properties of the software every candidate shares (Strategy's fields of the same name).
  bool sequence_parallel = true, overlap_dp = true;
};

struct Rejection {
  std::string hardware, reason;
};

struct SearchResult {
  std::vector<Plan> plans;               // best plan per hardware, ranked by cost, then time
  std::vector<Rejection> rejected;       // hardware with no acceptable plan, and why
  std::vector<std::string> explanation;  // the decision path, one line per step
  std::vector<Plan> alternatives;        // the next best plans on the winning hardware
  size_t evaluated = 0;
};

SearchResult search(const Job& job, const Catalog& catalog, const SearchOptions& opt);

/// The plan that fits on `gpus` x `hw` nearest to strategy `s`: fewest strategy dimensions
/// changed (tp, pp, virtual stages, ZeRO stage, recomputed layers, offload, recompute,
/// micro-batch), then the shortest training time. Empty when nothing fits on that many devices.
std::optional<Plan> nearest_fitting(const Job& job, const Hardware& hw, int gpus,
                                    const Strategy& s);
/// "zero 0 -> 1, recompute none -> selective": what `to` changes in `from`.
std::string strategy_changes(const Strategy& from, const Strategy& to);

/// Parses counts such as "300e9", "7B", "1.4T", "124M", "8k"; `what` names the flag.
double parse_count(const std::string& text, const std::string& what);

}  // namespace hetrain::planning
