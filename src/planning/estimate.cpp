// Memory and time of one plan. Formulas and their sources are in docs/PLANNING.md.
#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

#include "hetrain/base/error.h"
#include "hetrain/planning/plan.h"
#include "planning/internal.h"

namespace hetrain::planning {

const char* to_string(TimePart p) {
  switch (p) {
    case TimePart::gemm:
      return "gemm";
    case TimePart::conv:
      return "conv";
    case TimePart::attention:
      return "attention";
    case TimePart::memory:
      return "memory";
  }
  return "?";
}

const char* to_string(Offload o) {
  switch (o) {
    case Offload::none:
      return "none";
    case Offload::optimizer:
      return "optimizer";
    case Offload::optimizer_params:
      return "optimizer+params";
  }
  return "?";
}

Offload offload_from_string(const std::string& s) {
  if (s == "none") return Offload::none;
  if (s == "optimizer") return Offload::optimizer;
  if (s == "optimizer+params") return Offload::optimizer_params;
  fail("[plan] --offload expects none|optimizer|optimizer+params, got '", s, "'");
}

double Strategy::recompute_share(int64_t layers) const {
  if (recompute != Recompute::full || recompute_layers <= 0) return 1;
  const double lps = std::ceil(static_cast<double>(layers) / pp);
  return std::min(recompute_layers / lps, 1.0);
}

std::string Strategy::describe() const {
  std::ostringstream os;
  os << "tp=" << tp << " pp=" << pp << " zero=" << zero << " offload=" << to_string(offload)
     << " recompute=" << to_string(recompute) << " micro-batch=" << micro_batch;
  if (recompute == Recompute::full && recompute_layers > 0)
    os << " recompute-layers=" << recompute_layers;
  if (virtual_stages > 1) os << " virtual-stages=" << virtual_stages;
  if (tp > 1 && !sequence_parallel) os << " no-sp";
  if (!overlap_dp) os << " no-dp-overlap";
  return os.str();
}

// ---- communication: alpha-beta ------------------------------------------------------------

double ring_allreduce_time(double n, int p, double bw, double alpha) {
  if (p <= 1 || n <= 0) return 0;
  return 2.0 * (p - 1) * alpha + 2.0 * (p - 1) / p * n / bw;
}

double tree_allreduce_time(double n, int p, double bw, double alpha) {
  if (p <= 1 || n <= 0) return 0;
  // Reduce up and broadcast down a (double) binary tree, pipelined: 2 log2(p) latency
  // terms and the whole buffer twice through the slowest link.
  return 2.0 * std::ceil(std::log2(p)) * alpha + 2.0 * n / bw;
}

double allreduce_time(double n, int p, double bw, double alpha) {
  return std::min(ring_allreduce_time(n, p, bw, alpha), tree_allreduce_time(n, p, bw, alpha));
}

double reduce_scatter_time(double n, int p, double bw, double alpha) {
  if (p <= 1 || n <= 0) return 0;
  return (p - 1) * alpha + static_cast<double>(p - 1) / p * n / bw;
}

// ---- compute: GEMM roofline with tile quantisation ----------------------------------------

double gemm_time(double m, double n, double k, double peak, double eff, double bw, double elem) {
  if (m <= 0 || n <= 0 || k <= 0) return 0;
  // cuBLAS-style 128x128 output tiles: a ragged edge costs a whole tile.
  constexpr double tile = 128;
  double padded = std::ceil(m / tile) * tile * std::ceil(n / tile) * tile;
  double flops = 2.0 * padded * k;
  double bytes = elem * (m * k + k * n + m * n);
  return std::max(flops / (peak * eff), bytes / (bw * 0.8));
}

double conv_rate_gflops(const std::vector<ConvRate>& rates, const ConvLayer& l) {
  bool same_stride = false, same_kernel = false;
  for (const auto& r : rates)
    if (r.kernel == l.kernel) same_kernel = true, same_stride |= r.stride == l.stride;
  if (!same_kernel) return 0;
  auto channels = [](double in, double out) { return std::log(std::sqrt(in * out)); };
  const double c = channels(static_cast<double>(l.in), static_cast<double>(l.out));
  const double s = std::log(static_cast<double>(std::max<int64_t>(l.out_w, 1)));
  double wsum = 0, lsum = 0;
  for (const auto& r : rates) {
    if (r.kernel != l.kernel || (same_stride && r.stride != l.stride)) continue;
    const double dc = channels(static_cast<double>(r.in), static_cast<double>(r.out)) - c;
    const double ds = std::log(static_cast<double>(r.out_hw)) - s;
    const double d2 = dc * dc + ds * ds;
    if (d2 < 1e-12) return r.gflops;
    wsum += 1 / d2, lsum += std::log(r.gflops) / d2;
  }
  return std::exp(lsum / wsum);
}

namespace {

// A measured curve of (size, rate) at x: log-log interpolation inside; below the first
// point the rate falls in proportion to size (fixed costs dominate), above the last it stays.
double curve_at(const std::vector<std::pair<double, double>>& c, double x) {
  if (x <= c.front().first) return c.front().second * x / c.front().first;
  if (x >= c.back().first) return c.back().second;
  size_t i = 1;
  while (c[i].first < x) ++i;
  double t = std::log(x / c[i - 1].first) / std::log(c[i].first / c[i - 1].first);
  return std::exp(std::log(c[i - 1].second) * (1 - t) + std::log(c[i].second) * t);
}

// What one device offers a job's precision. GEMMs: the catalog's constant efficiency with
// tile quantisation, or, for a measured device, the rate its profile measured at that GEMM
// size (interpolated in log-log, scaled from f32 to the job's dtype by the peak ratio).
// Memory-bound work: the device bandwidth, or the cache bandwidth for operands that fit in
// the last-level cache, where the profile measured it.
struct Rates {
  const Hardware& hw;
  double peak, eff, bw, elem, dtype_scale;

  Rates(const Hardware& h, Precision prec)
      : hw(h),
        peak(h.peak_tflops(prec) * 1e12),
        eff(h.gemm_efficiency),
        bw(h.mem_bw_gbs * 1e9),
        elem(prec == Precision::fp32 ? 4 : 2),
        dtype_scale(h.tflops_f32 > 0 ? h.peak_tflops(prec) / h.tflops_f32 : 1) {}

  double scale(TimePart p) const { return hw.part_scale[static_cast<size_t>(p)]; }

  double gemm(double m, double n, double k, TimePart part = TimePart::gemm) const {
    return scale(part) * gemm_unscaled(m, n, k, part);
  }
  double gemm_unscaled(double m, double n, double k, TimePart part = TimePart::gemm) const {
    if (hw.gemm_curve.empty()) {
      // Small sides reach less of the peak (the efficiency model's half size).
      const double side = std::min({m, n, k}), half = hw.efficiency.gemm_half_size;
      return gemm_time(m, n, k, peak, eff * side / (side + half), bw, elem);
    }
    if (m <= 0 || n <= 0 || k <= 0) return 0;
    // The attention core at the rate the engine's own attention kernel reached at that size.
    const double tflops = part == TimePart::attention && !hw.attention_curve.empty()
                              ? curve_at(hw.attention_curve, std::cbrt(m * n * k))
                          : !hw.gemm_grid.empty() ? hw.gemm_grid.at(m, n, k)
                                                  : curve_at(hw.gemm_curve, std::cbrt(m * n * k));
    double bytes = elem * (m * k + k * n + m * n);
    return std::max(2 * m * n * k / (tflops * 1e12 * dtype_scale), stream_unscaled(bytes, bytes));
  }
  /// A layer's GEMM, (m x k) times (k x n), and its two gradients, each at the rate of its own
  /// shape: the input gradient is (m x n) times (n x k), the weight gradient (k x m) times
  /// (m x n), whose inner size is the batch's tokens or images. (Before, the backward was
  /// charged twice the forward's time, as if both gradients had the forward's shape.)
  struct Linear {
    double fwd, input_grad, weight_grad;
    double bwd() const { return input_grad + weight_grad; }
  };
  Linear linear(double m, double n, double k) const {
    return {gemm(m, n, k), gemm(m, k, n), gemm(k, n, m)};
  }
  /// Forward time of a convolution over `px` output pixels: the measured rate of the
  /// nearest measured convolution where the device has them, else an implicit GEMM.
  double conv(const ConvLayer& l, double px) const {
    const double k = static_cast<double>(l.in * l.kernel * l.kernel);
    const double gflops = conv_rate_gflops(hw.conv_rates, l);
    if (gflops <= 0) return gemm(px, static_cast<double>(l.out), k, TimePart::conv);
    return scale(TimePart::conv) * 2 * px * static_cast<double>(l.out) * k /
           (gflops * 1e9 * dtype_scale);
  }
  /// Forward time of a batch norm and the ReLU after it over `elements` values held in
  /// `tensor` bytes: a third of the engine's measured forward + backward, else three passes.
  double norm(double elements, double tensor) const {
    if (hw.norm_curve.empty()) return stream(3 * tensor, 2 * tensor);
    const double f32 = 4 * elements;  // the norm runs in f32 whatever the precision
    return scale(TimePart::memory) * f32 / (curve_at(hw.norm_curve, f32) * 1e9) / 3;
  }
  /// Time of `bytes` of a transformer layer's elementwise passes, of `layer_bytes` in the
  /// whole layer forward and backward: at the rate the engine's layer reached at that size
  /// where measured, else as `stream` with operands of `working_set` bytes.
  double layer_elementwise(double bytes, double layer_bytes, double working_set) const {
    if (hw.layer_curve.empty()) return stream(bytes, working_set);
    return scale(TimePart::memory) * bytes / (curve_at(hw.layer_curve, layer_bytes) * 1e9);
  }
  /// Time to move `bytes` whose working set is `working_set` bytes.
  double stream(double bytes, double working_set) const {
    return scale(TimePart::memory) * stream_unscaled(bytes, working_set);
  }
  double stream_unscaled(double bytes, double working_set) const {
    // The engine's elementwise rate for ops of that size, per-node costs included.
    if (!hw.stream_curve.empty()) return bytes / (curve_at(hw.stream_curve, working_set) * 1e9);
    if (hw.cache_bw_gbs > 0 && working_set <= hw.cache_bytes)
      return bytes / (hw.cache_bw_gbs * 1e9);
    return bytes / (bw * 0.8);
  }
};

}  // namespace

// ---- model states: the ZeRO paper's accounting --------------------------------------------

ModelStates model_state_bytes(double P, int dp, int zero, Offload off, Precision prec) {
  double wb = prec == Precision::fp32 ? 4 : 2;  // weight and gradient bytes
  double K = prec == Precision::fp32 ? 8 : 12;  // optimizer bytes per parameter
  double N = std::max(dp, 1);
  ModelStates m;
  m.weights = zero >= 3 ? wb * P / N : wb * P;
  m.gradients = zero >= 2 ? wb * P / N : wb * P;
  m.optimizer = zero >= 1 ? K * P / N : K * P;
  if (off != Offload::none) {
    double shard = zero >= 1 ? P / N : P;
    m.host = (K + 4) * shard;  // optimizer states and fp32 gradients for the CPU step
    m.optimizer = 0;
    // Gradient shards stream to the host bucket by bucket (ZeRO-Offload with stage >= 2).
    if (zero >= 2) m.gradients = 0;
    if (off == Offload::optimizer_params) {
      m.host += wb * P / N;
      m.weights = 0;  // fetched per layer: counted under temporary
    }
  }
  return m;
}

namespace detail {

// A given rate (end to end or compute only) above the device's peak: an MFU over 100%.
bool rate_past_peak(const Job& job, double peak) {
  const std::optional<double>& rate = job.achieved_tflops ? job.achieved_tflops : job.kernel_tflops;
  return peak > 0 && rate && *rate > peak;
}

std::string strategy_problem(const Job& job, const Hardware& hw, int gpus, const Strategy& s) {
  const ModelSpec& m = job.model;
  // Cheap checks first: the search calls this for every candidate.
  int tpp = std::max(1, s.tp * s.pp);
  int dp0 = gpus / tpp;
  bool likely_ok =
      gpus >= 1 && s.tp >= 1 && s.pp >= 1 && gpus % tpp == 0 && s.zero >= 0 && s.zero <= 3 &&
      s.micro_batch >= 1 && !(s.pp > 1 && s.zero >= 2) && s.virtual_stages >= 1 &&
      (s.virtual_stages == 1 || s.pp > 1) &&
      (s.recompute_layers == 0 ||
       (s.recompute_layers > 0 && s.recompute == Recompute::full && m.is_transformer() &&
        s.recompute_layers < (m.tf.layers + s.pp - 1) / s.pp)) &&
      (s.offload == Offload::none || (s.zero >= 1 && hw.pcie_gen > 0)) &&
      (s.offload != Offload::optimizer_params || s.zero == 3) &&
      (hw.peak_tflops(job.precision) > 0 || job.achieved_tflops || job.kernel_tflops) &&
      !rate_past_peak(job, hw.peak_tflops(job.precision)) && dp0 > 0 &&
      job.global_batch % (static_cast<int64_t>(dp0) * s.micro_batch) == 0 &&
      (m.is_transformer() ? m.tf.heads % s.tp == 0 && m.tf.kv_heads % s.tp == 0 &&
                                static_cast<int64_t>(s.pp) * s.virtual_stages <= m.tf.layers
                          : s.tp == 1 && s.pp == 1);
  if (likely_ok) return "";
  std::ostringstream os;
  if (gpus < 1) return "--gpus must be at least 1";
  if (s.tp < 1 || s.pp < 1) return "--tp and --pp must be at least 1";
  if (gpus % (s.tp * s.pp) != 0) {
    os << "--gpus " << gpus << " is not divisible by tp x pp = " << s.tp << " x " << s.pp;
    return os.str();
  }
  if (s.zero < 0 || s.zero > 3) return "--zero expects 0, 1, 2 or 3";
  if (s.micro_batch < 1) return "--micro-batch must be at least 1";
  if (s.virtual_stages < 1) return "--virtual-stages must be at least 1";
  if (s.recompute_layers < 0) return "--recompute-layers must be at least 0 (0: every layer)";
  if (s.recompute_layers > 0 && s.recompute != Recompute::full)
    return "--recompute-layers recomputes some layers in full: needs --recompute full";
  if (s.recompute_layers > 0 && !m.is_transformer())
    return "--recompute-layers applies to transformers";
  if (s.recompute_layers > 0 && s.recompute_layers >= (m.tf.layers + s.pp - 1) / s.pp) {
    os << "--recompute-layers " << s.recompute_layers << " is not fewer than the "
       << (m.tf.layers + s.pp - 1) / s.pp << " layers per device (0 recomputes every layer)";
    return os.str();
  }
  if (s.virtual_stages > 1 && s.pp == 1)
    return "--virtual-stages > 1 interleaves pipeline stages: needs --pp > 1";
  if (!m.is_transformer() && (s.tp > 1 || s.pp > 1))
    return "conv nets are planned with data parallelism only (--tp 1 --pp 1)";
  if (m.is_transformer()) {
    if (m.tf.heads % s.tp != 0) {
      os << "--tp " << s.tp << " does not divide the " << m.tf.heads << " attention heads";
      return os.str();
    }
    if (m.tf.kv_heads % s.tp != 0) {
      os << "--tp " << s.tp << " does not divide the " << m.tf.kv_heads << " key/value heads";
      return os.str();
    }
    if (s.pp > m.tf.layers) {
      os << "--pp " << s.pp << " exceeds the " << m.tf.layers << " layers";
      return os.str();
    }
    if (static_cast<int64_t>(s.pp) * s.virtual_stages > m.tf.layers) {
      os << "--pp " << s.pp << " x --virtual-stages " << s.virtual_stages << " exceeds the "
         << m.tf.layers << " layers (each chunk needs one)";
      return os.str();
    }
  }
  if (s.pp > 1 && s.zero >= 2)
    return "ZeRO stages 2 and 3 do not combine with pipeline parallelism (--pp > 1); use "
           "--zero 0 or 1";
  if (s.offload == Offload::optimizer && s.zero < 1)
    return "--offload optimizer shards the optimizer on the host: needs --zero 1, 2 or 3";
  if (s.offload == Offload::optimizer_params && s.zero != 3)
    return "--offload optimizer+params needs --zero 3";
  if (s.offload != Offload::none && hw.pcie_gen == 0) {
    os << "--offload needs a host link; catalog entry '" << hw.id << "' has none (pcie_gen 0)";
    return os.str();
  }
  if (hw.peak_tflops(job.precision) <= 0 && !job.achieved_tflops && !job.kernel_tflops) {
    os << "'" << hw.id << "' has no " << to_string(job.precision) << " matmul rate in the catalog";
    return os.str();
  }
  if (const double peak = hw.peak_tflops(job.precision); peak > 0 && rate_past_peak(job, peak)) {
    os << (job.achieved_tflops ? "--achieved-tflops " : "--kernel-tflops ")
       << (job.achieved_tflops ? *job.achieved_tflops : *job.kernel_tflops) << " exceeds '" << hw.id
       << "''s " << to_string(job.precision) << " peak of " << peak
       << " TFLOP/s (an MFU over 100%)";
    return os.str();
  }
  int dp = gpus / (s.tp * s.pp);
  if (job.global_batch % (static_cast<int64_t>(dp) * s.micro_batch) != 0) {
    os << "--global-batch " << job.global_batch << " is not divisible by data-parallel size " << dp
       << " x --micro-batch " << s.micro_batch;
    return os.str();
  }
  return "";
}

}  // namespace detail

void check_strategy(const Job& job, const Hardware& hw, int gpus, const Strategy& s) {
  job.model.check();
  if (job.global_batch < 1) fail("[plan] --global-batch must be at least 1");
  if (job.tokens <= 0) fail("[plan] --tokens must be positive");
  std::string p = detail::strategy_problem(job, hw, gpus, s);
  if (!p.empty()) fail("[plan] ", p);
}

namespace {

using detail::StageCompute;

// Forward/backward time of one micro-batch on the slowest pipeline stage (the last: it
// also computes the logits) from GEMM shapes and memory-bound elementwise work.
StageCompute stage_compute(const Job& job, const Hardware& hw, const Strategy& s) {
  const ModelSpec& m = job.model;
  StageCompute c;
  const Rates r(hw, job.precision);
  const double elem = r.elem;
  double b = static_cast<double>(s.micro_batch);
  if (!m.is_transformer()) {
    // The first weight layer reads the data, whose gradient nobody needs: its backward is the
    // weight gradient alone (a fifth of an MLP's backward GEMM FLOPs on Fashion-MNIST).
    bool first = true;
    for (const auto& l : m.conv.layers) {
      double px = b * l.out_h * l.out_w, tensor = elem * px * l.out;
      if (l.kind == ConvLayer::Kind::conv) {
        // The measured rate covers the forward and both gradients, as if each took as long.
        double t = r.conv(l, px);
        c.fwd += t, c.bwd += (first ? 1 : 2) * t;
        first = false;
      } else if (l.kind == ConvLayer::Kind::linear) {
        const auto g = r.linear(b, static_cast<double>(l.out), static_cast<double>(l.in));
        c.fwd += g.fwd, c.bwd += first ? g.weight_grad : g.bwd();
        first = false;
      } else if (l.kind == ConvLayer::Kind::batchnorm) {
        // batch norm + ReLU: read and write the tensor, twice as much backward
        double t = r.norm(px * static_cast<double>(l.out), tensor);
        c.fwd += t, c.bwd += 2 * t;
      } else {  // activation: read and write; backward reads the gradient and the mask
        double t = r.stream(2 * tensor, 2 * tensor);
        c.fwd += t, c.bwd += 1.5 * t;
      }
    }
    if (s.recompute == Recompute::full) c.recompute = c.fwd;
    c.fwd *= hw.compute_scale, c.bwd *= hw.compute_scale, c.recompute *= hw.compute_scale;
    return c;
  }
  const auto& tf = m.tf;
  double t = s.tp, sq = static_cast<double>(tf.seq), h = static_cast<double>(tf.hidden);
  double tok = b * sq, d = h / tf.heads, kv = static_cast<double>(tf.kv_heads) * d;
  double f = static_cast<double>(tf.ffn_hidden);
  // The layer's four weight GEMMs: QKV, attention output, MLP in (and gate), MLP out.
  double mm = 0, mm_b = 0;
  for (const auto& g :
       {r.linear(tok, (h + 2 * kv) / t, h), r.linear(tok, h, h / t),
        r.linear(tok, (tf.mlp == MlpKind::swiglu ? 2 : 1) * f / t, h), r.linear(tok, h, f / t)})
    mm += g.fwd, mm_b += g.bwd();
  // Attention core: per head, scores (s x s, k = d) and scores @ V (s x d, k = s).
  double heads = b * tf.heads / t;
  // A fused kernel on catalog hardware: the core's FLOPs at the fused rate, its backward
  // recomputing the scores (2.5 x forward, as FlashAttention-2 counts it).
  const bool fused = job.fused_attention && hw.gemm_curve.empty();
  double core = fused ? r.scale(TimePart::attention) * heads * 4 * sq * sq * d /
                            (r.peak * r.eff * hw.efficiency.fused_attention)
                      : heads * (r.gemm(sq, sq, d, TimePart::attention) +
                                 r.gemm(sq, d, sq, TimePart::attention));
  const double core_bwd = (fused ? 2.5 : 2) * core;
  // Elementwise work, memory bound: the passes transformer_elementwise_passes counts, at the
  // rate the engine's own layer reached where the device profile measured it, else at the
  // stream rate. (Before this count the model charged twice the bytes a layer keeps for
  // backward at the stream rate of one op's operands, hot in cache: a third of what gpt-mini's
  // steps spent in these ops.)
  const ElementwisePasses passes = transformer_elementwise_passes(tf, s.tp, s.sequence_parallel);
  const double ew_bytes_f = elem * tok * passes.forward, ew_bytes_b = elem * tok * passes.backward;
  const double ew_layer = ew_bytes_f + ew_bytes_b, ew_operands = 3 * elem * tok * h / t;
  // Tuned code fuses most of these passes: the efficiency model keeps a fraction of them.
  const double ew_keep = hw.efficiency.elementwise_fraction;
  double ew_f = ew_keep * r.layer_elementwise(ew_bytes_f, ew_layer, ew_operands);
  double ew_b = ew_keep * r.layer_elementwise(ew_bytes_b, ew_layer, ew_operands);
  if (hw.attention_curve.empty() && !fused) {
    // No measured attention kernel: an unfused one, as Megatron-LM ran it, whose mask, softmax
    // and dropout pass over the (s x s) scores: about twice the 5 bytes per score it keeps
    // (Korthikanti et al. 2022) forward, twice that backward. A measured curve (hetrain bench)
    // already holds the fused kernel's own cost.
    const double scores = b * tf.heads / t * sq * sq;
    ew_f += r.stream(2 * 5 * scores, 5 * scores);
    ew_b += r.stream(4 * 5 * scores, 5 * scores);
  }
  // Fixed costs per layer and micro-batch (kernel launches, gaps): a third forward.
  const double fixed = hw.efficiency.kernel_overhead_us * 1e-6;
  double layer_fwd = mm + core + ew_f + fixed / 3;
  double lps = std::ceil(static_cast<double>(tf.layers) / s.pp);
  // The logits and the loss: softmax over f32 logits, read and written forward and backward.
  double logits = 0, logits_b = 0, loss = 0;
  if (tf.lm_head) {
    const auto g = r.linear(tok, tf.vocab / t, h);
    logits = g.fwd, logits_b = g.bwd();
    loss = r.stream(4 * tok * static_cast<double>(tf.vocab) / t * 2, 4 * tok * tf.vocab / t);
  }
  c.fwd = lps * layer_fwd + logits + loss;
  c.bwd = lps * (mm_b + core_bwd + ew_b + 2 * fixed / 3) + logits_b + loss;
  if (s.recompute == Recompute::full) c.recompute = lps * s.recompute_share(tf.layers) * layer_fwd;
  // A fused kernel recomputes its scores in its own backward already.
  if (s.recompute == Recompute::selective && !fused) c.recompute = lps * core;
  c.fwd *= hw.compute_scale, c.bwd *= hw.compute_scale, c.recompute *= hw.compute_scale;
  return c;
}

// Parameters held by one device under tensor and pipeline parallelism (the largest stage).
double params_per_device(const ModelSpec& m, const ParamLayout& l, const Strategy& s) {
  if (!m.is_transformer()) return static_cast<double>(l.total);
  double lps = std::ceil(static_cast<double>(m.tf.layers) / s.pp);
  double body = lps * l.per_layer;
  double first = body + l.embedding, last = body + l.head;
  // With pipeline stages, tied embeddings keep a copy of the word embedding on the last.
  if (s.pp > 1 && m.tf.tied_embeddings && m.tf.lm_head)
    last += static_cast<double>(m.tf.vocab) * m.tf.hidden;
  double stage = s.pp == 1 ? body + l.embedding + l.head : std::max(first, last);
  return stage / s.tp;
}

}  // namespace

Plan evaluate(const Job& job, const Hardware& hw, int gpus, const Strategy& s) {
  check_strategy(job, hw, gpus, s);
  Plan p = detail::evaluate_unchecked(job, hw, gpus, s);
  detail::describe_fit(p);
  return p;
}

namespace detail {

void describe_fit(Plan& p) {
  if (p.fits) return;
  const auto& mem = p.memory;
  std::ostringstream os;
  os.setf(std::ios::fixed);
  os.precision(1);
  if (mem.total > mem.capacity)
    os << "needs " << mem.total / 1e9 << " GB per device, has " << mem.capacity / 1e9 << " GB";
  else
    os << "offload needs " << mem.host_per_device / 1e9 << " GB host memory per device, has "
       << mem.host_capacity / 1e9 << " GB";
  p.fit_reason = os.str();
}

Plan evaluate_unchecked(const Job& job, const Hardware& hw, int gpus, const Strategy& s,
                        StageComputeCache* cache) {
  const ModelSpec& m = job.model;
  const ParamLayout layout = m.layout();
  Plan p;
  p.hardware = hw.id;
  p.gpus = gpus;
  p.strategy = s;
  if (s.tp == 1) p.strategy.sequence_parallel = false;
  const Strategy& st = p.strategy;
  p.dp = gpus / (s.tp * s.pp);
  p.micro_batches = job.global_batch / (static_cast<int64_t>(p.dp) * s.micro_batch);
  p.params = layout.total;
  double wb = job.precision == Precision::fp32 ? 4 : 2;
  double act_scale = job.precision == Precision::fp32 ? 2 : 1;

  // ---- memory ----
  double P = params_per_device(m, layout, st);
  ModelStates ms = model_state_bytes(P, p.dp, st.zero, st.offload, job.precision);
  MemoryBreakdown& mem = p.memory;
  mem.weights = ms.weights;
  mem.gradients = ms.gradients;
  mem.optimizer = ms.optimizer;
  mem.host_per_device = ms.host;
  mem.host_capacity = hw.host_mem_gb * 1e9;
  // Hetrain's own offload (training/offload.h) keeps its gradient buffers on the device and
  // moves the optimizer state, and under optimizer+params the parameter shards, to the host.
  const bool engine_offload = m.engine == Engine::hetrain && st.offload != Offload::none;
  if (engine_offload) {
    const ModelStates kept = model_state_bytes(P, p.dp, st.zero, Offload::none, job.precision);
    mem.gradients = kept.gradients;
    mem.host_per_device =
        kept.optimizer + (st.offload == Offload::optimizer_params ? kept.weights : 0);
  }
  mem.capacity = hw.mem_gb * 1e9;
  mem.reserved = hw.reserved_gb * 1e9;
  double m_in_flight = static_cast<double>(std::min<int64_t>(st.pp, p.micro_batches));
  if (m.is_transformer()) {
    const auto& tf = m.tf;
    double lps = std::ceil(static_cast<double>(tf.layers) / st.pp);
    // A fused attention kernel keeps no s x s scores: the memory of selective recompute.
    const Recompute kept = job.fused_attention && st.recompute == Recompute::none
                               ? Recompute::selective
                               : st.recompute;
    double layer = act_scale * transformer_layer_activation_bytes(tf, st.micro_batch, st.tp,
                                                                  st.sequence_parallel, kept);
    // Some layers recomputed: the others keep what they keep without recompute.
    const double share = st.recompute_share(tf.layers);
    if (share < 1) {
      const Recompute none = job.fused_attention ? Recompute::selective : Recompute::none;
      layer = share * layer + (1 - share) * act_scale *
                                  transformer_layer_activation_bytes(tf, st.micro_batch, st.tp,
                                                                     st.sequence_parallel, none);
    }
    double sbh = static_cast<double>(tf.seq) * st.micro_batch * tf.hidden;
    double sp_div = st.sequence_parallel ? st.tp : 1;
    // Embedding output dropout mask (first stage); fp32 logits for the loss (last stage).
    double first_extra = (tf.dropout ? sbh : 0) / sp_div;
    double last_extra =
        tf.lm_head ? 4.0 * tf.seq * st.micro_batch * static_cast<double>(tf.vocab) / st.tp : 0;
    // The interleaved schedule's warm-up keeps more micro-batches in flight on the first
    // stage: (1 + (p - 1) / (p v)) times the 1F1B's (Korthikanti et al. 2022, section 4.2.3).
    const double v = st.virtual_stages;
    const double interleave = v > 1 ? 1 + (st.pp - 1) / (st.pp * v) : 1;
    double first = lps * layer * m_in_flight * interleave + first_extra;
    double last = lps * layer + last_extra;
    mem.activations = st.pp == 1 ? lps * layer + first_extra + last_extra : std::max(first, last);
    if (st.recompute == Recompute::full)  // one layer's activations while it is recomputed
      mem.temporary +=
          act_scale * transformer_layer_activation_bytes(
                          tf, st.micro_batch, st.tp, st.sequence_parallel, Recompute::selective);
    if (st.zero == 3)  // the gathered weights of the current and the prefetched layer
      mem.temporary += 2 * wb * layout.per_layer / st.tp;
  } else {
    mem.activations = act_scale * convnet_activation_bytes(m.conv, st.micro_batch, st.recompute);
    if (st.zero == 3) mem.temporary += wb * P / 4;  // a conv stage's gathered weights
  }
  // Hetrain's own engine, one device, nothing recomputed: its measured layout (the peak over
  // the step, which its memory model predicts: test_planning's EngineMemory).
  const bool engine =
      m.engine == Engine::hetrain && st.recompute == Recompute::none && st.tp == 1 && st.pp == 1;
  // Its f32 layout: the step's peak over data parallelism, ZeRO and offload.
  const bool engine_peak = engine && job.precision == Precision::fp32;
  if (engine) {
    mem.activations = hetrain_activation_bytes(m, st.micro_batch, 2 * act_scale);
    if (engine_peak) {
      // The rest of the peak (the update's new values, the buckets' buffers, stage 3's gathered
      // parameters) is temporary: the peak less the model states and activations. (It replaces
      // the generic stage-3 working set above.)
      const double peak =
          hetrain_step_peak_bytes(P, p.dp, st.zero, mem.activations, engine_offload,
                                  engine_offload && st.offload == Offload::optimizer_params);
      mem.temporary =
          std::max(0.0, peak - (mem.weights + mem.gradients + mem.optimizer + mem.activations));
    } else {
      // Its optimizer evaluates the new parameters and state before the old ones go, once the
      // activations are freed: the step's peak where they outweigh the activations.
      mem.temporary += std::max(0.0, mem.weights + mem.optimizer - mem.activations);
    }
  }
  if (p.dp > 1 && !engine_peak) mem.temporary += 2 * 25e6;  // gradient communication buckets
  mem.total =
      mem.weights + mem.gradients + mem.optimizer + mem.activations + mem.temporary + mem.reserved;
  p.fits = mem.total <= mem.capacity && mem.host_per_device <= mem.host_capacity;

  // ---- FLOPs ----
  double fwd = m.forward_flops_per_sample();
  double rc = st.recompute == Recompute::full
                  ? (m.is_transformer() ? st.recompute_share(m.tf.layers) : 1) * fwd
              : st.recompute == Recompute::selective ? m.attention_core_flops_per_sample()
                                                     : 0;
  double B = static_cast<double>(job.global_batch);
  p.model_flops_per_step = 3 * fwd * B;
  p.flops_per_step = (3 * fwd + rc) * B;

  // ---- time ----
  TimeBreakdown& T = p.time;
  StageCompute c;
  if (job.kernel_tflops || job.achieved_tflops) {
    // Both start from the given rate as the compute rate; the end-to-end figure then
    // replaces the whole step below.
    double rate = (job.kernel_tflops ? *job.kernel_tflops : *job.achieved_tflops) * 1e12;
    double per_dev = static_cast<double>(st.micro_batch) / (st.tp * st.pp);
    c.fwd = per_dev * fwd / rate;
    c.bwd = 2 * c.fwd;
    c.recompute = per_dev * rc / rate;
  } else if (cache) {
    // Cached with every layer recomputed; recomputing some scales the recompute time.
    auto key = std::make_tuple(st.tp, st.pp, st.micro_batch, static_cast<int>(st.recompute),
                               st.sequence_parallel);
    auto it = cache->find(key);
    if (it == cache->end()) {
      Strategy all = st;
      all.recompute_layers = 0;
      it = cache->emplace(key, stage_compute(job, hw, all)).first;
    }
    c = it->second;
    if (m.is_transformer()) c.recompute *= st.recompute_share(m.tf.layers);
  } else {
    c = stage_compute(job, hw, st);
  }
  double mbs = static_cast<double>(p.micro_batches);
  double compute_mb = c.fwd + c.bwd + c.recompute;
  T.compute = mbs * compute_mb;
  T.recompute = mbs * c.recompute;

  int gpn = hw.gpus_per_node;
  double a_in = hw.alpha_intra_us * 1e-6, a_out = hw.alpha_inter_us * 1e-6;
  // A group that spans nodes: NCCL runs one ring per NIC, so the ranks the group has in a
  // node share that node's NICs with the other tensor-parallel groups: its bandwidth is
  // (devices per node / tp) x the per-device network bandwidth, at most the intra-node link.
  auto bw_for = [&](int span) {
    if (span <= gpn) return hw.intra_bw();
    double ranks_per_node = std::max(1, gpn / s.tp);
    return std::min(hw.intra_bw() > 0 ? hw.intra_bw() : hw.inter_bw() * ranks_per_node,
                    hw.inter_bw() * ranks_per_node);
  };
  auto alpha_for = [&](int span) { return span <= gpn ? a_in : a_out; };
  double tp_mb = 0, pp_mb = 0;
  if (m.is_transformer()) {
    const auto& tf = m.tf;
    double lps = std::ceil(static_cast<double>(tf.layers) / st.pp);
    double act = wb * tf.seq * st.micro_batch * static_cast<double>(tf.hidden);
    if (st.tp > 1) {
      // Two all-reduces (or reduce-scatter + all-gather pairs with sequence parallelism,
      // the same bytes) forward, two backward, two more when the forward is recomputed.
      double count = 4 + (st.recompute == Recompute::full ? 2 * st.recompute_share(tf.layers) : 0);
      tp_mb = lps * count * allreduce_time(act, st.tp, bw_for(st.tp), alpha_for(st.tp));
    }
    if (st.pp > 1) {
      double n = act / (st.sequence_parallel ? st.tp : 1);
      int span = st.tp * st.pp;
      double bw = span <= gpn ? hw.intra_bw() : hw.inter_bw();  // one path per send
      // Each of a device's chunks sends its activation forward and its gradient back.
      pp_mb = 2 * st.virtual_stages * (alpha_for(span) + n / bw);
    }
  }
  T.tp_comm = mbs * tp_mb;
  T.pp_comm = mbs * pp_mb;
  double t_mb = compute_mb + tp_mb + pp_mb;
  // Fill and drain: p - 1 micro-batch times, divided by the chunks per device when the
  // schedule is interleaved (Narayanan et al. 2021, section 2.2.2).
  const double fill = static_cast<double>(st.pp - 1) / st.virtual_stages;
  T.bubble = fill * t_mb;
  double pipeline = (mbs + fill) * t_mb;

  if (p.dp > 1) {
    int span = st.tp * p.dp;  // tensor-parallel ranks innermost, data-parallel next
    double bw = bw_for(span), al = alpha_for(span);
    double grads = wb * P, weights = wb * P;
    double tail = allreduce_time(std::min(25e6, grads), p.dp, bw, al);  // last bucket
    double bwd_mb = c.bwd + c.recompute;
    if (hw.measured) {
      // This machine's CPU ranks: the collectives measured on p.dp ranks, each bucket of f32
      // gradients reduced as the trainer does (ZeRO 1 and 2 move the same bytes); they run on
      // the cores backward uses, so none of it is hidden (comm_table.h). No table: no figure
      // ('hetrain plan' checks for one before evaluating).
      const CommTable* t = find_comm_table(hw.comm_tables, p.dp);
      const double inf = std::numeric_limits<double>::infinity();
      const DdpCommTime dc =
          t ? ddp_comm_time(*t, uniform_buckets(grads / wb * 4, 1, 25)) : DdpCommTime{inf, inf, 0};
      T.dp_comm = T.dp_exposed = dc.total_s;
    } else if (st.zero <= 1) {
      double ar = allreduce_time(grads, p.dp, bw, al);
      T.dp_comm = ar;
      T.dp_exposed = std::max(ar - bwd_mb, 0.0) + std::min(ar, tail);
    } else if (st.zero == 2) {
      double rs = reduce_scatter_time(grads, p.dp, bw, al);
      double ag = reduce_scatter_time(weights, p.dp, bw, al);
      T.dp_comm = mbs * rs + ag;
      T.dp_exposed = mbs * std::max(rs - bwd_mb, 0.0) + std::min(rs, tail) + ag;
    } else {
      double rs = reduce_scatter_time(grads, p.dp, bw, al);
      double ag = reduce_scatter_time(weights, p.dp, bw, al);
      T.dp_comm = mbs * (2 * ag + rs);
      T.dp_exposed =
          mbs * (std::max(ag - c.fwd, 0.0) + std::max(ag + rs - bwd_mb, 0.0)) + std::min(rs, tail);
    }
    if (!st.overlap_dp) T.dp_exposed = T.dp_comm;  // all of it after the backward
  }

  // Optimizer step: Adam is memory bound: read and write the K bytes of state, read the
  // gradient, write the weights (fp32: the weights are the master copy, so also read them).
  // The state is touched once a step, after the backward has streamed through everything
  // else: it comes from memory, not cache (the stream rate past the last-level cache).
  double K = job.precision == Precision::fp32 ? 8 : 12;
  double shard = st.zero >= 1 ? P / p.dp : P;
  double adam_bytes = shard * (2 * K + (job.precision == Precision::fp32 ? 3 : 2) * wb);
  if (st.offload == Offload::none) {
    T.optimizer =
        Rates(hw, job.precision).stream(adam_bytes, std::numeric_limits<double>::infinity());
  } else {
    T.optimizer = adam_bytes / (hw.host_mem_bw_gbs * 1e9);
    double pcie = hw.pcie_bw();
    double down = wb * shard / pcie, up = wb * shard / pcie;
    T.offload = std::max(down - (c.bwd + c.recompute), 0.0) + up;
    if (st.offload == Offload::optimizer_params) {
      double fetch = 2 * wb * (P / p.dp) / pcie;  // forward and backward, every micro-batch
      T.offload += mbs * std::max(fetch - compute_mb, 0.0);
    }
  }
  T.step = pipeline + T.dp_exposed + T.optimizer + T.offload;
  T.overhead = hw.efficiency.step_overhead * T.step;
  T.step += T.overhead;
  if (job.achieved_tflops) {
    // The published end-to-end figure: FLOPs of the step (recompute included) over wall
    // time, everything inside it (T = 8TP/(nX) in Narayanan et al. 2021, section 5.1).
    const double compute_share = T.compute > 0 ? T.recompute / T.compute : 0;
    T = TimeBreakdown{};
    T.step = T.compute = p.flops_per_step / (gpus * *job.achieved_tflops * 1e12);
    T.recompute = compute_share * T.compute;
  }

  // ---- rates, duration, cost ----
  double tokens_per_step = B * m.tokens_per_sample();
  p.steps = job.tokens / tokens_per_step;
  p.tokens_per_s = tokens_per_step / T.step;
  p.achieved_tflops_per_gpu = p.flops_per_step / T.step / gpus / 1e12;
  double peak = hw.peak_tflops(job.precision);
  p.mfu = peak > 0 ? p.model_flops_per_step / T.step / gpus / (peak * 1e12) : 0;
  double per_gpu_flops = p.flops_per_step / gpus;
  p.compute_tflops_per_gpu = T.compute > 0 ? per_gpu_flops / T.compute / 1e12 : 0;
  double seconds = p.steps * T.step;
  p.train_days = seconds / 86400;
  p.gpu_hours = seconds * gpus / 3600;
  double price = job.price_per_hour ? *job.price_per_hour : hw.price_per_hour;
  p.priced = price > 0;
  p.cost_usd = p.gpu_hours * price;
  return p;
}

}  // namespace detail

double parse_count(const std::string& text, const std::string& what) {
  std::string t = text;
  double mult = 1;
  if (!t.empty()) {
    switch (std::tolower(static_cast<unsigned char>(t.back()))) {
      case 'k':
        mult = 1e3;
        break;
      case 'm':
        mult = 1e6;
        break;
      case 'b':
      case 'g':
        mult = 1e9;
        break;
      case 't':
        mult = 1e12;
        break;
      default:
        break;
    }
    if (mult != 1) t.pop_back();
  }
  try {
    size_t used = 0;
    double v = std::stod(t, &used);
    if (used != t.size() || !std::isfinite(v * mult) || v < 0) throw std::invalid_argument(text);
    return v * mult;
  } catch (const std::exception&) {
    fail("[plan] ", what, " expects a number such as 300e9, 7B, 1.4T or 124M, got '", text, "'");
  }
}

}  // namespace hetrain::planning
