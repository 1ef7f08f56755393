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
  for (int rep = 0; rep < (quick ? 2 : 3); ++rep) {
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

void measure_peaks(DeviceProfile& p, bool quick) {
  const PeakKernel f32 = fma_kernel();
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

/// min_batch: at least this many images, so that per-call costs (weight transforms and
/// reorders, workspaces, the split over threads) weigh about as little as in a training batch.
double measure_conv(DeviceProfile& p, planning::ConvRate r, double flops, int reps,
                    int64_t min_batch) {
  Generator gen(11);
  const double per_image = 2.0 * r.out_hw * r.out_hw * r.out * r.in * r.kernel * r.kernel;
  const int64_t batch = std::clamp<int64_t>(std::llround(flops / per_image),
                                            std::max<int64_t>(min_batch, 2 * p.threads), 256);
  const int64_t in_hw = r.out_hw * r.stride, pad = r.kernel / 2;
  Tensor x = randn({batch, r.in, in_hw, in_hw}, Dtype::f32, gen).eval();
  Tensor w = randn({r.out, r.in, r.kernel, r.kernel}, Dtype::f32, gen).eval();
  Tensor cot = randn({batch, r.out, r.out_hw, r.out_hw}, Dtype::f32, gen).eval();
  const double t = best_eval(reps, [&] {
    Tensor y = conv2d(x, w, {}, {r.stride, r.stride}, {pad, pad});
    std::vector<Tensor> g = grad({y}, {x, w}, {cot});
    return std::vector<Tensor>{y, g[0], g[1]};
  });
  const double gflops = 3 * per_image * static_cast<double>(batch) / t * 1e-9;
  p.rows.push_back({"conv " + std::to_string(r.kernel) + "x" + std::to_string(r.kernel) + "/" +
                        std::to_string(r.stride) + " " + std::to_string(r.in) + "->" +
                        std::to_string(r.out) + " at " + std::to_string(r.out_hw) + "^2",
                    gflops, "GFLOP/s", t,
                    "forward + both gradients, batch " + std::to_string(batch)});
  return gflops;
}

// ---- The two f32 GEMM libraries, each in turn under the engine (sgemm() takes the path
// set_sgemm_path() gives): a linear layer with ReLU, forward and both gradients, at the sizes of
// training (a batch of 128 images through an MLP's layers, 2048 tokens through a small GPT's),
// best of `reps`. Time in a layer's kernels, not a GEMM's alone: the libraries' time alone
// ranked them the other way round on an AMD EPYC Zen 4 held to AVX2, where whole training
// steps were faster with oneDNN. The faster library has the lower geometric mean of time
// ratios over the layers (the small layers count as much as the large ones).
void measure_sgemm_paths(DeviceProfile& p, bool quick) {
  struct Layer {
    int64_t rows, in, out;
  };
  const std::vector<Layer> layers = {{128, 784, 512},  {128, 512, 256},  {128, 256, 10},
                                     {2048, 128, 384}, {2048, 128, 512}, {2048, 512, 128}};
  const int reps = quick ? 3 : 8;
  Generator gen(9);
  double log_ratio = 0;
  p.sgemm_onednn_s = p.sgemm_openblas_s = 0;
  for (const Layer& l : layers) {
    Tensor x = randn({l.rows, l.in}, Dtype::f32, gen).eval();
    Tensor w = randn({l.out, l.in}, Dtype::f32, gen).eval();
    Tensor cot = randn({l.rows, l.out}, Dtype::f32, gen).eval();
    double t[2];
    for (const cpu::SgemmPath path : {cpu::SgemmPath::onednn, cpu::SgemmPath::openblas}) {
      const cpu::SgemmPathOverride use(path);
      t[path == cpu::SgemmPath::openblas] = best_eval(reps, [&] {
        Tensor y = relu(linear(x, w));
        std::vector<Tensor> g = grad({y}, {x, w}, {cot});
        return std::vector<Tensor>{y, g[0], g[1]};
      });
    }
    p.sgemm_onednn_s += t[0];
    p.sgemm_openblas_s += t[1];
    log_ratio += std::log(t[1] / t[0]);
  }
  const cpu::SgemmPath faster = log_ratio < 0 ? cpu::SgemmPath::openblas : cpu::SgemmPath::onednn;
  p.sgemm_openblas_over_onednn = std::exp(log_ratio / static_cast<double>(layers.size()));
  p.sgemm_choice = cpu::sgemm_path_name(faster);
  cpu::set_sgemm_path(faster);
  for (const cpu::SgemmPath path : {cpu::SgemmPath::onednn, cpu::SgemmPath::openblas}) {
    const bool ob = path == cpu::SgemmPath::openblas;
    const double seconds = ob ? p.sgemm_openblas_s : p.sgemm_onednn_s;
    p.rows.push_back({"linear + ReLU layers, fwd + grads", 1e3 * seconds, "ms", seconds,
                      (ob ? "OpenBLAS " + cpu::openblas_core_name() : std::string("oneDNN")) +
                          " sgemm" + (path == faster ? " (taken)" : "")});
  }
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
  // As a GPT layer runs it (nn::CausalSelfAttention): on one packed (B, s, 3 H d) projection,
  // the heads merged in the output (B, s, H d), the gradient taken to the packed input.
  constexpr int64_t H = 4;
  for (auto [s, d] : shapes) {
    const double per_head = 4.0 * s * s * d;  // scores and scores @ V, as if not causal
    const int64_t B = std::clamp<int64_t>(std::llround((quick ? 15e6 : 50e6) / per_head / H),
                                          (2 * p.threads + H - 1) / H, 256);
    Tensor qkv = randn({B, s, 3 * H * d}, Dtype::f32, gen).eval();
    Tensor cot = randn({B, s, H * d}, Dtype::f32, gen).eval();
    const double t = best_eval(quick ? 2 : 3, [&] {
      Tensor y = scaled_dot_product_attention_packed(qkv, H, /*causal=*/true);
      std::vector<Tensor> g = grad({y}, {qkv}, {cot});
      return std::vector<Tensor>{y, g[0]};
    });
    const double gflops = 3 * per_head * static_cast<double>(B * H) / t * 1e-9;
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

std::string apply_gemm_choice(const std::string& path) {
  DeviceProfile p;
  std::string why;
  if (path.empty()) return "no device profile (no cache directory)";
  if (!load_device_profile(path, 0, &p, &why)) return why;
  if (p.sgemm_choice.empty()) return "device profile '" + path + "' has no sgemm timings";
  cpu::set_sgemm_path(p.sgemm_choice == "openblas" ? cpu::SgemmPath::openblas
                                                   : cpu::SgemmPath::onednn);
  char buf[160];
  std::snprintf(buf, sizeof buf,
                "%s (OpenBLAS's time over oneDNN's on linear layers: %.2f, geometric mean)",
                p.sgemm_choice.c_str(), p.sgemm_openblas_over_onednn);
  return buf;
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
