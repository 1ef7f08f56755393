// Measuring a device profile: peaks, GEMM rates, bandwidth, the engine's kernels on this machine,
// and which f32 GEMM library and convolution kernels run faster here (the choices runs take).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
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
#include "hetrain/insight/device_profile.h"
#include "hetrain/planning/model_spec.h"
#include "hetrain/runtime/eval.h"

namespace hetrain::insight {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

/// Best (shortest) wall time of `reps` runs of fn: the machine may be shared, and the best
/// run is the one least disturbed by other processes.
template <class F>
double best_time(int reps, F&& fn) {
  double best = 1e300;
  for (int r = 0; r < reps; ++r) {
    const double t0 = now_s();
    fn();
    best = std::min(best, now_s() - t0);
  }
  return best;
}

}  // namespace

namespace {

/// The summed per-thread rate (GFLOP/s) of k on p.threads threads, best of a few runs.
double measure_peak(DeviceProfile& p, const PeakKernel& k, bool quick) {
  float (*fn)(int64_t) = k.fn;
  const double flops_per_iter = k.flops_per_iter;
  // A fixed amount of work, more for the bf16 units, which are several times faster.
  const double flops = (quick ? 2e9 : 8e9) * (k.bf16 ? 8 : 1);
  const int64_t iters = std::max<int64_t>(1000, static_cast<int64_t>(flops / flops_per_iter));
  const int threads = p.threads;
  // Rate per CPU second of each thread, summed: a ceiling of the hardware that other
  // processes sharing the cores cannot lower (they can only lower the wall-clock rate).
  std::vector<float> sink(static_cast<size_t>(threads));
  std::vector<double> cpu_s(static_cast<size_t>(threads));
  double best_rate = 0, best_wall = 0;
  // Best of five: on a VM, other guests on the cores' SMT siblings slow the FMA units without
  // taking CPU time from these threads, and a peak read in such a moment (309 GFLOP/s against the
  // usual 333 on a 2-vCPU Xeon) fell below what a GEMM measured next reached. A repetition costs
  // about 12 ms (quick) or 48 ms.
  for (int rep = 0; rep < 5; ++rep) {
    const double t0 = now_s();
    std::vector<std::thread> pool;
    for (int i = 0; i < threads; ++i)
      pool.emplace_back([&, i] {
        const double c0 = thread_cpu_seconds();
        sink[static_cast<size_t>(i)] = fn(iters);
        cpu_s[static_cast<size_t>(i)] = thread_cpu_seconds() - c0;
      });
    for (auto& th : pool) th.join();
    double rate = 0;
    for (double c : cpu_s) rate += flops_per_iter * static_cast<double>(iters) / c;
    if (rate > best_rate) best_rate = rate, best_wall = now_s() - t0;
  }
  volatile float keep = sink[0];
  (void)keep;
  p.rows.push_back({std::string(k.bf16 ? "bf16 peak (" : "fma peak (") + k.isa + ", " +
                        std::to_string(threads) + " threads)",
                    best_rate * 1e-9, "GFLOP/s", best_wall,
                    "register-only loop, per thread CPU second"});
  return best_rate * 1e-9;
}

/// The FMA loop at the widest width this process's f32 kernels run at: the own vector kernels'
/// (HETRAIN_CPU_ISA may lower it) or the GEMM libraries' (DNNL_MAX_CPU_ISA, OPENBLAS_CORETYPE),
/// so that a run held to AVX2 is bounded by the AVX2 peak.
PeakKernel f32_peak_kernel() {
  const cpu::Isa widest = std::max(cpu::vector_isa(), cpu::gemm_libraries_isa());
  for (const PeakKernel& k : peak_kernels()) {
    if (k.bf16) continue;
    const std::string isa = k.isa;
    const cpu::Isa width = isa == "avx512f"    ? cpu::Isa::avx512
                           : isa == "avx2+fma" ? cpu::Isa::avx2
                                               : cpu::Isa::baseline;
    if (width <= widest) return k;
  }
  return fma_kernel();
}

void measure_peaks(DeviceProfile& p, bool quick) {
  const PeakKernel f32 = f32_peak_kernel();
  p.isa = f32.isa;
  p.fma_peak_gflops = measure_peak(p, f32, quick);
  if (const auto bf16 = bf16_kernel()) {
    p.bf16_isa = bf16->isa;
    p.bf16_peak_gflops = measure_peak(p, *bf16, quick);
  }
}

// How hetrain::matmul runs a dtype on this CPU (src/backends/cpu/eval_matmul.cpp).
std::string gemm_path(Dtype dt) {
  const std::string sgemm = cpu::sgemm_path() == cpu::SgemmPath::openblas
                                ? "OpenBLAS " + cpu::openblas_core_name() + " sgemm"
                                : std::string("oneDNN sgemm");
  if (dt == Dtype::f32) return sgemm;
  if (dt == Dtype::bf16 && cpu::bf16_gemm_path() == cpu::Bf16GemmPath::onednn)
    return "oneDNN bf16 matmul, " + cpu::bf16_gemm_impl_name(1024, 1024, 1024);
  return std::string(dtype_name(dt)) + " -> f32, " + sgemm;
}

// ---- GEMM through hetrain::matmul (the engine's own path: oneDNN/OpenBLAS underneath).
double measure_gemm(DeviceProfile& p, Dtype dt, int64_t n, int reps) {
  Generator gen(7);
  Tensor a = randn({n, n}, dt, gen).eval(), b = randn({n, n}, dt, gen).eval();
  matmul(a, b).eval();  // warm-up: primitive creation, buffer cache, thread start
  const double flops = 2.0 * static_cast<double>(n) * n * n;
  double t = 1e300, cpu_rate = 0;
  for (int r = 0; r < reps; ++r) {
    const double c0 = process_cpu_seconds(), t0 = now_s();
    matmul(a, b).eval();
    const double wall = now_s() - t0, cpu = process_cpu_seconds() - c0;
    t = std::min(t, wall);
    if (cpu > 0) cpu_rate = std::max(cpu_rate, flops / cpu);
  }
  const double gflops = flops / t * 1e-9;
  p.rows.push_back({"gemm " + std::string(dtype_name(dt)) + " n=" + std::to_string(n), gflops,
                    "GFLOP/s", t, gemm_path(dt)});
  // Per CPU second x threads assumes every thread worked: true only for the large sizes.
  if (dt == Dtype::f32 && n >= 1024)
    p.gemm_f32_cpu_gflops =
        std::max(p.gemm_f32_cpu_gflops, std::max(gflops, cpu_rate * p.threads * 1e-9));
  return gflops;
}

// The largest cache's size from sysfs (0 when unknown).
double last_level_cache_bytes() {
  double best = 0;
  for (int i = 0; i < 8; ++i) {
    std::ifstream in("/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i) + "/size");
    std::string s;
    if (!(in >> s) || s.empty()) continue;
    double v = std::atof(s.c_str());
    if (s.back() == 'K') v *= 1024;
    if (s.back() == 'M') v *= 1024 * 1024;
    best = std::max(best, v);
  }
  return best;
}

// ---- memory bandwidth: STREAM triad a = b + s*c over three buffers of `bytes` each: far
// beyond the LLC for memory bandwidth, within it for cache bandwidth. Returns GB/s per wall
// second; *cpu_gbs gets the rate per CPU second of the process times `threads`.
double triad_gbs(int64_t bytes, int reps, int threads, double* seconds, double* cpu_gbs) {
  const int64_t n = bytes / 4;
  std::vector<float> a(static_cast<size_t>(n)), b(static_cast<size_t>(n), 1.0f),
      c(static_cast<size_t>(n), 2.0f);
  auto triad = [&] {
    parallel_for(n, 1 << 16, [&](int64_t lo, int64_t hi) {
      float* ap = a.data();
      const float* bp = b.data();
      const float* cp = c.data();
      for (int64_t i = lo; i < hi; ++i) ap[i] = bp[i] + 3.0f * cp[i];
    });
  };
  triad();  // first touch of `a`
  double t = 1e300, cpu_rate = 0;
  for (int rep = 0; rep < reps; ++rep) {
    const double c0 = process_cpu_seconds(), t0 = now_s();
    triad();
    const double wall = now_s() - t0, cpu = process_cpu_seconds() - c0;
    t = std::min(t, wall);
    if (cpu > 0) cpu_rate = std::max(cpu_rate, 3.0 * static_cast<double>(bytes) / cpu);
  }
  volatile float keep = a[static_cast<size_t>(n / 2)];
  (void)keep;
  *seconds = t;
  const double gbs = 3.0 * static_cast<double>(bytes) / t * 1e-9;
  *cpu_gbs = std::max(gbs, cpu_rate * threads * 1e-9);
  return gbs;
}

void measure_triad(DeviceProfile& p, bool quick) {
  // Each buffer 4x the last-level cache (at least 64 MiB, at most 1 GiB), so no pass is
  // served from cache.
  p.llc_bytes = last_level_cache_bytes();
  const int64_t bytes = std::clamp<int64_t>(
      (static_cast<int64_t>(4 * p.llc_bytes) + (int64_t{1} << 20) - 1) & ~((int64_t{1} << 20) - 1),
      int64_t{64} << 20, int64_t{1} << 30);
  double t = 0, cpu_gbs = 0;
  p.mem_bw_gbs = triad_gbs(bytes, quick ? 3 : 8, p.threads, &t, &cpu_gbs);
  p.rows.push_back({"triad 3 x " + std::to_string(bytes >> 20) + " MiB", p.mem_bw_gbs, "GB/s", t,
                    "LLC " + std::to_string(static_cast<int64_t>(p.llc_bytes) >> 20) + " MiB"});
  // Per CPU second of the process, times the threads that ran it.
  p.mem_bw_cpu_gbs = cpu_gbs;
  p.rows.push_back({"triad per CPU second x threads", p.mem_bw_cpu_gbs, "GB/s", t,
                    "the bandwidth were the cores ours"});
  // The private caches of the threads in use: what elementwise operands of a small model
  // stay in between kernels (a VM's shared L3 figure is often the whole socket's).
  const long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
  if (l2 <= 0) return;
  p.cache_bytes = static_cast<double>(l2) * p.threads;
  const int64_t per_buffer = std::max<int64_t>(static_cast<int64_t>(p.cache_bytes) / 6, 16 << 10);
  // Many repetitions of a short loop: the best one saw the buffers resident in cache.
  p.cache_bw_gbs = triad_gbs(per_buffer, quick ? 50 : 200, p.threads, &t, &cpu_gbs);
  p.rows.push_back({"triad 3 x " + std::to_string(per_buffer >> 10) + " KiB (in cache)",
                    p.cache_bw_gbs, "GB/s", t, "L2 x threads"});
}

// ---- the engine's own kernels, forward and backward: what the planner charges on `local`
// for convolutions, the attention core and elementwise work. Each case is sized to about
// `flops` forward FLOPs so that small shapes are not all fixed cost; best of `reps`.
template <class F>
double best_eval(int reps, F&& build) {
  eval(build());  // warm-up: primitive creation, buffer cache
  return best_time(reps, [&] { eval(build()); });
}

/// A case to time: builds its graph on tensors made once (best_eval evaluates it).
using Builder = std::function<std::vector<Tensor>()>;

/// A convolution case, forward and both gradients, in dtype dt, on a batch sized to about
/// `flops` forward FLOPs. min_batch: at least this many images, so that per-call costs (weight
/// transforms and reorders, workspaces, the split over threads) weigh about as little as in a
/// training batch.
Builder conv_case(const DeviceProfile& p, const planning::ConvRate& r, double flops,
                  int64_t min_batch, Dtype dt, int64_t* batch_out = nullptr) {
  Generator gen(11);
  const double per_image = 2.0 * r.out_hw * r.out_hw * r.out * r.in * r.kernel * r.kernel;
  const int64_t batch = std::clamp<int64_t>(std::llround(flops / per_image),
                                            std::max<int64_t>(min_batch, 2 * p.threads), 256);
  const int64_t in_hw = r.out_hw * r.stride, pad = r.kernel / 2;
  Tensor x = cast(randn({batch, r.in, in_hw, in_hw}, Dtype::f32, gen), dt).eval();
  Tensor w = cast(randn({r.out, r.in, r.kernel, r.kernel}, Dtype::f32, gen), dt).eval();
  Tensor cot = cast(randn({batch, r.out, r.out_hw, r.out_hw}, Dtype::f32, gen), dt).eval();
  if (batch_out) *batch_out = batch;
  const int64_t stride = r.stride;
  return [=] {
    Tensor y = conv2d(x, w, {}, {stride, stride}, {pad, pad});
    std::vector<Tensor> g = grad({y}, {x, w}, {cot});
    return std::vector<Tensor>{y, g[0], g[1]};
  };
}

/// A linear layer with ReLU on `rows` rows, forward and both gradients, in dtype dt.
Builder linear_case(int64_t rows, int64_t in, int64_t out, Dtype dt, Generator& gen) {
  Tensor x = cast(randn({rows, in}, Dtype::f32, gen), dt).eval();
  Tensor w = cast(randn({out, in}, Dtype::f32, gen), dt).eval();
  Tensor cot = cast(randn({rows, out}, Dtype::f32, gen), dt).eval();
  return [=] {
    Tensor y = relu(linear(x, w));
    std::vector<Tensor> g = grad({y}, {x, w}, {cot});
    return std::vector<Tensor>{y, g[0], g[1]};
  };
}

std::string conv_case_name(const planning::ConvRate& r) {
  return "conv " + std::to_string(r.kernel) + "x" + std::to_string(r.kernel) + "/" +
         std::to_string(r.stride) + " " + std::to_string(r.in) + "->" + std::to_string(r.out) +
         " at " + std::to_string(r.out_hw) + "^2";
}

double measure_conv(DeviceProfile& p, planning::ConvRate r, double flops, int reps,
                    int64_t min_batch) {
  int64_t batch = 0;
  const double t = best_eval(reps, conv_case(p, r, flops, min_batch, Dtype::f32, &batch));
  const double per_image = 2.0 * r.out_hw * r.out_hw * r.out * r.in * r.kernel * r.kernel;
  const double gflops = 3 * per_image * static_cast<double>(batch) / t * 1e-9;
  p.rows.push_back({conv_case_name(r), gflops, "GFLOP/s", t,
                    "forward + both gradients, batch " + std::to_string(batch)});
  return gflops;
}

/// Heads of the attention cases, as in gpt-mini's layers.
constexpr int64_t kGptHeads = 4;

/// FLOPs of one head's causal attention forward at (s, d), counted as if not causal: the scores
/// and scores @ V.
double attention_flops_per_head(int64_t s, int64_t d) { return 4.0 * s * s * d; }

/// Causal attention as a GPT layer runs it (nn::CausalSelfAttention): on one packed
/// (B, s, 3 H d) projection (H = kGptHeads), the heads merged in the output (B, s, H d), forward
/// and the gradient to the packed input.
Builder attention_case(int64_t B, int64_t s, int64_t d, Generator& gen) {
  constexpr int64_t H = kGptHeads;
  Tensor qkv = randn({B, s, 3 * H * d}, Dtype::f32, gen).eval();
  Tensor cot = randn({B, s, H * d}, Dtype::f32, gen).eval();
  return [=] {
    Tensor y = scaled_dot_product_attention_packed(qkv, H, /*causal=*/true);
    std::vector<Tensor> g = grad({y}, {qkv}, {cot});
    return std::vector<Tensor>{y, g[0]};
  };
}

/// Batch of the attention case at (s, d) for about `flops` forward FLOPs.
int64_t attention_batch(const DeviceProfile& p, int64_t s, int64_t d, double flops) {
  constexpr int64_t H = kGptHeads;
  return std::clamp<int64_t>(std::llround(flops / attention_flops_per_head(s, d) / H),
                             (2 * p.threads + H - 1) / H, 256);
}

// ---- Choices between two paths (cpu::PathChoice): every case timed under each path in turn,
// best of `reps`, the faster taken by this process from then on. The faster has the lower
// geometric mean of time ratios over the cases, so small cases count as much as large ones.
struct PathTimes {
  double seconds[2] = {0, 0};  // each path's total over the cases
  double ratio = 1;            // path 0's time over path 1's, geometric mean
  int faster = 0;
};

PathTimes time_paths(DeviceProfile& p, cpu::PathChoice& choice, const std::vector<Builder>& cases,
                     int reps, const std::string& what, const std::array<std::string, 2>& how) {
  PathTimes t;
  double log_ratio = 0;
  for (const Builder& b : cases) {
    double s[2];
    for (int path : {0, 1}) {
      const cpu::PathOverride use(choice, path);
      s[path] = best_eval(reps, b);
      t.seconds[path] += s[path];
    }
    log_ratio += std::log(s[0] / s[1]);
  }
  t.ratio = std::exp(log_ratio / static_cast<double>(cases.size()));
  t.faster = t.ratio > 1 ? 1 : 0;
  choice.set_measured(t.faster);
  for (int path : {0, 1})
    p.rows.push_back({what, 1e3 * t.seconds[path], "ms", t.seconds[path],
                      how[path] + (path == t.faster ? " (taken)" : "")});
  return t;
}

// The engine's own f32 convolution kernels first, or oneDNN's (cpu::conv_path()): the 3x3 layers
// of a small ResNet (fashion-cnn's widths, a stride-2 layer doubling the channels), forward and
// both gradients, on a training batch of 128 images. Neither wins everywhere: on an Intel Xeon
// (Emerald Rapids) fashion-cnn's f32 step took 63 ms with the own kernels first and 68-73 with
// oneDNN's held to AVX2, 59 against 47 with AVX-512 (docs/PERFORMANCE.md). At 32 images these
// layers ranked oneDNN first held to AVX2 too, against the steps.
const std::vector<planning::ConvRate> kResNetLayers = {{3, 1, 16, 16, 28, 0},
                                                       {3, 2, 16, 32, 14, 0},
                                                       {3, 1, 32, 32, 14, 0},
                                                       {3, 2, 32, 64, 7, 0},
                                                       {3, 1, 64, 64, 7, 0}};

void measure_conv_paths(DeviceProfile& p, bool quick) {
  std::vector<Builder> cases;
  for (const auto& l : kResNetLayers) cases.push_back(conv_case(p, l, 50e6, 128, Dtype::f32));
  const PathTimes t =
      time_paths(p, cpu::conv_choice(), cases, quick ? 2 : 4, "3x3 conv layers, fwd + grads",
                 {"own Winograd/direct kernels first", "oneDNN first"});
  p.conv_own_s = t.seconds[0];
  p.conv_onednn_s = t.seconds[1];
  p.conv_own_over_onednn = t.ratio;
  p.conv_choice = cpu::conv_choice().name(t.faster);
}

// The two f32 GEMM libraries (sgemm() takes the path set_sgemm_path() gives), timed in the
// kernels that call sgemm: a linear layer with ReLU at the sizes of training (a batch of 128
// images through an MLP's layers, 2048 tokens through a small GPT's), and causal attention,
// whose tiles are small products (64 x 64 x 32 at gpt-mini's shape). Time in a layer's kernels,
// not a GEMM's alone: the libraries' time alone ranked them the other way round on an AMD EPYC
// Zen 4 held to AVX2, where whole training steps were faster with oneDNN. The linear layers
// alone still did there (OpenBLAS 10-17% faster on the GPT's) while gpt-mini's step was 1.14x
// faster with oneDNN: its attention ran 1.6x slower on OpenBLAS's small products.
struct LinearShape {
  int64_t rows, in, out;
};
const std::vector<LinearShape> kLinearLayers = {{128, 784, 512},  {128, 512, 256},
                                                {128, 256, 10},   {2048, 128, 384},
                                                {2048, 128, 512}, {2048, 512, 128}};

/// (sequence, head width) of the attention cases: gpt-mini's, and a longer, wider one.
const std::vector<std::pair<int64_t, int64_t>> kAttentionShapes = {{64, 32}, {256, 64}};

void measure_sgemm_paths(DeviceProfile& p, bool quick) {
  Generator gen(9);
  std::vector<Builder> cases;
  for (const auto& l : kLinearLayers)
    cases.push_back(linear_case(l.rows, l.in, l.out, Dtype::f32, gen));
  for (const auto& [s, d] : kAttentionShapes)
    cases.push_back(attention_case(attention_batch(p, s, d, 15e6), s, d, gen));
  const PathTimes t = time_paths(
      p, cpu::sgemm_choice(), cases, quick ? 3 : 8, "linear layers and attention, fwd + grads",
      {"oneDNN sgemm", "OpenBLAS " + cpu::openblas_core_name() + " sgemm"});
  p.sgemm_onednn_s = t.seconds[0];
  p.sgemm_openblas_s = t.seconds[1];
  p.sgemm_openblas_over_onednn = 1 / t.ratio;
  p.sgemm_choice = cpu::sgemm_choice().name(t.faster);
}

// bf16 on oneDNN's bf16 kernels or converted to f32 (cpu::bf16_gemm_path()), where oneDNN has
// bf16 kernels at all: the linear layers above and the ResNet layers, in bf16. The bf16 unit
// does not always pay: with AVX512-BF16 alone (an Intel Xeon whose AMX was not exposed),
// gpt-mini's bf16 step took 99 ms on it against 81 converted, fashion-cnn's 64-67 against 54-56.
void measure_bf16_paths(DeviceProfile& p, bool quick) {
  if (!cpu::onednn_has_bf16_matmul()) return;
  Generator gen(13);
  std::vector<Builder> cases;
  for (const auto& l : kLinearLayers)
    cases.push_back(linear_case(l.rows, l.in, l.out, Dtype::bf16, gen));
  for (const auto& l : kResNetLayers) cases.push_back(conv_case(p, l, 50e6, 128, Dtype::bf16));
  const PathTimes t = time_paths(p, cpu::bf16_gemm_choice(), cases, quick ? 2 : 4,
                                 "bf16 linear and conv layers, fwd + grads",
                                 {"oneDNN bf16 kernels", "converted to f32"});
  p.bf16_onednn_s = t.seconds[0];
  p.bf16_f32_s = t.seconds[1];
  p.bf16_f32_over_onednn = 1 / t.ratio;
  p.bf16_choice = cpu::bf16_gemm_choice().name(t.faster);
}

// f32 GEMMs of every (m, n, k) on a grid: thin and flat shapes (a layer's small batch or
// width) run well below a square GEMM of the same size.
void measure_gemm_grid(DeviceProfile& p, bool quick) {
  planning::GemmGrid& g = p.gemm_f32_grid;
  g.m = g.n = g.k = quick ? std::vector<double>{128, 1024} : std::vector<double>{128, 512, 2048};
  Generator gen(10);
  for (double m : g.m)
    for (double n : g.n)
      for (double k : g.k) {
        const auto mi = static_cast<int64_t>(m), ni = static_cast<int64_t>(n),
                   ki = static_cast<int64_t>(k);
        Tensor a = randn({mi, ki}, Dtype::f32, gen).eval(),
               b = randn({ki, ni}, Dtype::f32, gen).eval();
        const double t =
            best_eval(quick ? 2 : 4, [&] { return std::vector<Tensor>{matmul(a, b)}; });
        g.rates.push_back(2 * m * n * k / t * 1e-9);
      }
  p.rows.push_back({"gemm f32 grid, " + std::to_string(g.rates.size()) + " shapes",
                    *std::min_element(g.rates.begin(), g.rates.end()), "GFLOP/s", 0,
                    "slowest shape; all in the profile's gemm_f32_grid"});
}

void measure_convs(DeviceProfile& p, bool quick) {
  std::vector<planning::ConvRate> cases;
  const std::vector<int64_t> widths =
      quick ? std::vector<int64_t>{16, 64} : std::vector<int64_t>{16, 32, 64, 128};
  for (int64_t hw : quick ? std::vector<int64_t>{28, 7} : std::vector<int64_t>{28, 14, 7})
    for (int64_t c : widths) cases.push_back({3, 1, c, c, hw, 0});
  // Downsampling: a stride-2 3x3 and its 1x1 shortcut, doubling the channels.
  for (int64_t k : {3, 1})
    for (int64_t hw : quick ? std::vector<int64_t>{14} : std::vector<int64_t>{14, 7})
      for (int64_t c : widths)
        if (c < 128) cases.push_back({k, 2, c, 2 * c, hw, 0});
  for (auto r : cases) {
    // 32 images at least (8 for --quick): at 8, the 128-channel layers' fixed costs made the
    // wide CNN's predicted step 23-28% too slow; at 32, -6% and +4% (docs/PLANNING.md).
    r.gflops = measure_conv(p, r, quick ? 15e6 : 50e6, quick ? 2 : 3, quick ? 8 : 32);
    p.conv_f32_rates.push_back(r);
  }
}

void measure_attention(DeviceProfile& p, bool quick) {
  Generator gen(12);
  const std::vector<std::pair<int64_t, int64_t>> shapes =
      quick ? std::vector<std::pair<int64_t, int64_t>>{{64, 32}, {256, 64}}
            : std::vector<std::pair<int64_t, int64_t>>{{32, 32},  {64, 32},  {128, 32},
                                                       {128, 64}, {256, 32}, {256, 64}};
  constexpr int64_t H = kGptHeads;
  for (auto [s, d] : shapes) {
    const int64_t B = attention_batch(p, s, d, quick ? 15e6 : 50e6);
    const double t = best_eval(quick ? 2 : 3, attention_case(B, s, d, gen));
    const double gflops =
        3 * attention_flops_per_head(s, d) * static_cast<double>(B * H) / t * 1e-9;
    p.attention_f32_curve.emplace_back(std::cbrt(static_cast<double>(s * s * d)), gflops);
    p.rows.push_back({"causal attention s=" + std::to_string(s) + " d=" + std::to_string(d), gflops,
                      "GFLOP/s", t,
                      "forward + gradients, " + std::to_string(B) + " x " + std::to_string(H) +
                          " heads packed as in a GPT layer, 4 s^2 d each"});
  }
  std::sort(p.attention_f32_curve.begin(), p.attention_f32_curve.end());
}

// Batch norm (training statistics) and ReLU, forward and gradients: 32 channels at 14x14,
// batches giving 0.5 to 16 MiB tensors.
void measure_norm(DeviceProfile& p, bool quick) {
  Generator gen(14);
  constexpr int64_t c = 32, hw = 14;
  Tensor w = randn({c}, Dtype::f32, gen).eval(), b = randn({c}, Dtype::f32, gen).eval();
  for (int64_t batch : quick ? std::vector<int64_t>{64} : std::vector<int64_t>{16, 64, 256, 512}) {
    Tensor x = randn({batch, c, hw, hw}, Dtype::f32, gen).eval();
    Tensor cot = randn({batch, c, hw, hw}, Dtype::f32, gen).eval();
    const double t = best_eval(quick ? 2 : 5, [&] {
      Tensor y = relu(batch_norm2d(x, w, b)[0]);
      std::vector<Tensor> g = grad({y}, {x, w, b}, {cot});
      return std::vector<Tensor>{y, g[0], g[1], g[2]};
    });
    const double bytes = 4.0 * static_cast<double>(x.numel());
    p.norm_f32_curve.emplace_back(bytes, bytes / t * 1e-9);
    p.rows.push_back(
        {"batch norm + relu, " + std::to_string(static_cast<int64_t>(bytes) >> 10) + " KiB",
         bytes / t * 1e-9, "GB/s", t, "forward + gradients, per tensor byte"});
  }
}

// The elementwise ops of a GPT layer (width h, 4h MLP, biases, no dropout), forward and
// gradients, with the matmuls' and the attention's outputs as inputs and their inputs' gradients
// as cotangents: two layer norms, the four bias adds, two residual adds and the tanh GELU. Rated
// on the bytes planning::transformer_elementwise_passes counts for such a layer.
void measure_layer_elementwise(DeviceProfile& p, bool quick) {
  Generator gen(15);
  const std::vector<std::pair<int64_t, int64_t>> shapes =
      quick ? std::vector<std::pair<int64_t, int64_t>>{{2048, 128}}
            : std::vector<std::pair<int64_t, int64_t>>{
                  {1024, 128}, {2048, 128}, {2048, 256}, {4096, 256}};
  for (const auto& shape : shapes) {
    const int64_t tok = shape.first, h = shape.second;  // not a structured binding: clang 14
                                                        // cannot capture those in lambdas
    auto in = [&](int64_t width) { return randn({tok, width}, Dtype::f32, gen).eval(); };
    auto vec = [&](int64_t n) { return randn({n}, Dtype::f32, gen).eval(); };
    Tensor x = in(h), qkv = in(3 * h), att = in(h), fc = in(4 * h), proj = in(h);
    Tensor bq = vec(3 * h), ba = vec(h), bf = vec(4 * h), bp = vec(h);
    Tensor w1 = vec(h), c1 = vec(h), w2 = vec(h), c2 = vec(h);
    Tensor g_n1 = in(h), g_q = in(3 * h), g_n2 = in(h), g_g = in(4 * h), g_out = in(h);
    const std::vector<Tensor> wrt = {x, qkv, att, fc, proj, bq, ba, bf, bp, w1, c1, w2, c2};
    const double t = best_eval(quick ? 2 : 3, [&] {
      Tensor n1 = layer_norm(x, {h}, w1, c1);
      Tensor q = qkv + bq;
      Tensor h1 = x + (att + ba);
      Tensor n2 = layer_norm(h1, {h}, w2, c2);
      Tensor g = gelu(fc + bf, "tanh");
      Tensor out = h1 + (proj + bp);
      std::vector<Tensor> r = grad({n1, q, n2, g, out}, wrt, {g_n1, g_q, g_n2, g_g, g_out});
      r.insert(r.end(), {n1, q, n2, g, out});
      return r;
    });
    planning::TransformerSpec tf;
    tf.hidden = h, tf.heads = 1, tf.kv_heads = 1, tf.ffn_hidden = 4 * h, tf.dropout = false;
    const planning::ElementwisePasses e = planning::transformer_elementwise_passes(tf, 1, false);
    const double bytes = 4.0 * static_cast<double>(tok) * (e.forward + e.backward);
    p.layer_f32_curve.emplace_back(bytes, bytes / t * 1e-9);
    p.rows.push_back(
        {"gpt layer elementwise, " + std::to_string(tok) + " tokens x " + std::to_string(h),
         bytes / t * 1e-9, "GB/s", t, "norms, bias adds, residuals, gelu: forward + gradients"});
  }
}

// Eight chained adds of n floats: 12 n bytes moved per node, node costs included.
void measure_stream(DeviceProfile& p, bool quick) {
  Generator gen(13);
  constexpr int kOps = 8;
  for (int64_t n : quick ? std::vector<int64_t>{1 << 12, 1 << 20}
                         : std::vector<int64_t>{1 << 10, 1 << 13, 1 << 16, 1 << 19, 1 << 22}) {
    Tensor x = randn({n}, Dtype::f32, gen).eval();
    const double t = best_eval(quick ? 3 : 10, [&] {
      Tensor y = x;
      for (int i = 0; i < kOps; ++i) y = add(y, x);
      return std::vector<Tensor>{y};
    });
    const double bytes = 12.0 * static_cast<double>(n);
    p.stream_f32_curve.emplace_back(bytes, kOps * bytes / t * 1e-9);
    p.rows.push_back({"elementwise add, " + std::to_string(n * 4 >> 10) + " KiB operands",
                      kOps * bytes / t * 1e-9, "GB/s", t / kOps, "per node, 8 chained nodes"});
  }
}

std::string today_utc() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[16];
  std::strftime(buf, sizeof buf, "%Y-%m-%d", &tm);
  return buf;
}

}  // namespace
DeviceProfile measure_device(const BenchOptions& opts) {
  DeviceProfile p;
  p.threads = num_threads();
  const CpuFeatures& f = cpu_features();
  p.cpu_model = f.model;
  p.hetrain_version = HETRAIN_VERSION;
  p.name = (f.model.empty() ? std::string("this CPU") : f.model) + " (" +
           std::to_string(p.threads) + " threads)";
  p.date = today_utc();
  p.mem_bytes =
      static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
  measure_peaks(p, opts.quick);
  measure_sgemm_paths(p, opts.quick);
  measure_conv_paths(p, opts.quick);
  measure_bf16_paths(p, opts.quick);
  if (cpu::bf16_gemm_path() == cpu::Bf16GemmPath::onednn)
    p.gemm_bf16_impl = cpu::bf16_gemm_impl_name(1024, 1024, 1024);
  const std::vector<int64_t> sizes =
      opts.quick ? std::vector<int64_t>{1024} : std::vector<int64_t>{1024, 2048};
  const int reps = opts.quick ? 2 : 3;
  // Small GEMMs, where fixed costs and cache blocking matter: the planner's GEMM curve.
  for (int64_t n : {64, 128, 256, 512})
    p.gemm_f32_curve.emplace_back(n, measure_gemm(p, Dtype::f32, n, opts.quick ? 5 : 20));
  for (int64_t n : sizes) {
    const double f32 = measure_gemm(p, Dtype::f32, n, reps);
    p.gemm_f32_curve.emplace_back(n, f32);
    p.gemm_f32_tflops = std::max(p.gemm_f32_tflops, f32 * 1e-3);
    p.gemm_bf16_tflops = std::max(p.gemm_bf16_tflops, measure_gemm(p, Dtype::bf16, n, reps) * 1e-3);
    p.gemm_f16_tflops = std::max(p.gemm_f16_tflops, measure_gemm(p, Dtype::f16, n, reps) * 1e-3);
  }
  p.rows.push_back({"gemm f32 per CPU second x threads", p.gemm_f32_cpu_gflops, "GFLOP/s", 0,
                    "best size; the rate were the cores ours"});
  measure_triad(p, opts.quick);
  measure_gemm_grid(p, opts.quick);
  measure_convs(p, opts.quick);
  measure_attention(p, opts.quick);
  measure_stream(p, opts.quick);
  measure_norm(p, opts.quick);
  measure_layer_elementwise(p, opts.quick);
  return p;
}

}  // namespace hetrain::insight
