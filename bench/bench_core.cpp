// Core-engine micro-benchmarks: the CPU's FMA peak and memory bandwidth (the
// ceilings), and what Hetrain reaches against them: GEMM GFLOP/s, elementwise
// and reduction GB/s, and the per-node cost of building and evaluating the lazy
// graph.
//
//   build/bench/bench_core --benchmark_counters_tabular=true
//   build/bench/bench_core --benchmark_filter='Gemm' --benchmark_format=json
//
// tools/run_bench.sh runs this next to tools/bench_torch.py and prints one
// table.
#include <benchmark/benchmark.h>
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "backends/cpu/gemm.h"
#include "backends/cpu/isa.h"
#include "hetrain/base/cpu_features.h"
#include "hetrain/base/thread_pool.h"
#include "hetrain/graph/autodiff.h"
#include "hetrain/graph/ops.h"
#include "hetrain/insight/device_profile.h"
#include "hetrain/runtime/eval.h"

namespace {

using namespace hetrain;

/// CPU seconds used by the calling thread. On a shared machine wall-clock rates fall with
/// the load; rates over CPU time say what the code reaches while it holds a core.
double thread_cpu_s() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}
/// CPU seconds used by the whole process (all threads, the BLAS/OpenMP ones included).
double process_cpu_s() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

/// Sets `name` (units per wall-clock second) and `name`_cpu (units per CPU second of this
/// process times the number of cores: the rate were every core ours, which on a shared
/// machine is the better estimate of what the code can do; busy-waiting threads lower it).
void set_rate(benchmark::State& state, const std::string& name, double units_per_iter,
              double process_cpu) {
  const double units = units_per_iter * static_cast<double>(state.iterations());
  state.counters[name] = benchmark::Counter(units, benchmark::Counter::kIsRate);
  state.counters[name + "_cpu"] =
      units / process_cpu * static_cast<double>(std::thread::hardware_concurrency());
}

double wall_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// ---- FMA peak
// ------------------------------------------------------------------------------

// The kernel is the library's (insight::fma_kernel), so bench and `hetrain bench` agree.
using insight::fma_kernel;
using insight::PeakKernel;

void BM_FmaPeak(benchmark::State& state) {
  const int threads = state.range(0) == 0 ? static_cast<int>(std::thread::hardware_concurrency())
                                          : static_cast<int>(state.range(0));
  const PeakKernel k = fma_kernel();
  const int64_t iters = 20'000'000;
  std::vector<float> sink(static_cast<size_t>(threads));
  std::vector<double> cpu(static_cast<size_t>(threads), 0.0);
  for (auto _ : state) {
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([&, t] {
        const double c0 = thread_cpu_s();
        sink[static_cast<size_t>(t)] = k.fn(iters);
        cpu[static_cast<size_t>(t)] += thread_cpu_s() - c0;
      });
    for (auto& th : pool) th.join();
    benchmark::DoNotOptimize(sink.data());
  }
  const double flops_per_thread =
      k.flops_per_iter * static_cast<double>(iters) * static_cast<double>(state.iterations());
  double per_cpu_s = 0;  // sum over threads of each thread's flops per CPU second
  for (double c : cpu) per_cpu_s += flops_per_thread / c;
  state.counters["threads"] = threads;
  state.counters["GFLOPS"] =
      benchmark::Counter(flops_per_thread * threads * 1e-9, benchmark::Counter::kIsRate);
  state.counters["GFLOPS_cpu"] = per_cpu_s * 1e-9;
  state.SetLabel(k.isa);
}
BENCHMARK(BM_FmaPeak)->Arg(1)->Arg(0)->UseRealTime()->Unit(benchmark::kMillisecond);

// ---- memory bandwidth
// ---------------------------------------------------------------------

constexpr int64_t kBig = 64 << 20;  // bytes per operand: twice the LLC here (32 MiB)

/// STREAM triad a = b + s * c over three 64 MiB buffers, threaded on Hetrain's
/// pool. Counted bytes: 2 reads + 1 write per element (write-allocate traffic
/// not counted, the same convention as the elementwise benchmarks below).
void BM_Triad(benchmark::State& state) {
  const int64_t n = kBig / 4;
  std::vector<float> a(static_cast<size_t>(n)), b(static_cast<size_t>(n), 1.0f),
      c(static_cast<size_t>(n), 2.0f);
  const float s = 3.0f;
  auto triad = [&] {
    parallel_for(n, 1 << 16, [&](int64_t lo, int64_t hi) {
      float* ap = a.data();
      const float* bp = b.data();
      const float* cp = c.data();
      for (int64_t i = lo; i < hi; ++i) ap[i] = bp[i] + s * cp[i];
    });
  };
  triad();
  const double pc0 = process_cpu_s();
  for (auto _ : state) {
    triad();
    benchmark::ClobberMemory();
  }
  const double pcpu = process_cpu_s() - pc0;
  set_rate(state, "GBps", 3.0 * kBig * 1e-9, pcpu);
}
BENCHMARK(BM_Triad)->UseRealTime()->Unit(benchmark::kMillisecond);

/// Read-only bandwidth: a threaded sum over one 64 MiB buffer (the ceiling for
/// reductions).
void BM_ReadBandwidth(benchmark::State& state) {
  const int64_t n = kBig / 4;
  std::vector<float> b(static_cast<size_t>(n), 1.0f);
  std::vector<double> partial(1024);
  const double pc0 = process_cpu_s();
  for (auto _ : state) {
    std::fill(partial.begin(), partial.end(), 0.0);
    parallel_for(n, 1 << 18, [&](int64_t lo, int64_t hi) {
      float acc[16] = {};
      int64_t i = lo;
      for (; i + 16 <= hi; i += 16)
        for (int k = 0; k < 16; ++k) acc[k] += b[static_cast<size_t>(i + k)];
      for (; i < hi; ++i) acc[0] += b[static_cast<size_t>(i)];
      float t = 0;
      for (float v : acc) t += v;
      partial[static_cast<size_t>(lo >> 18) & 1023] += t;
    });
    benchmark::DoNotOptimize(partial.data());
  }
  const double pcpu = process_cpu_s() - pc0;
  set_rate(state, "GBps", 1.0 * kBig * 1e-9, pcpu);
}
BENCHMARK(BM_ReadBandwidth)->UseRealTime()->Unit(benchmark::kMillisecond);

// ---- GEMM
// ----------------------------------------------------------------------------------

Dtype dtype_arg(int64_t v) { return v == 0 ? Dtype::f32 : Dtype::bf16; }

void BM_Gemm(benchmark::State& state) {
  const int64_t n = state.range(0);
  const Dtype dt = dtype_arg(state.range(1));
  Generator gen(7);
  Tensor a = randn({n, n}, dt, gen).eval(), b = randn({n, n}, dt, gen).eval();
  matmul(a, b).eval();  // warm-up: primitive creation, buffer cache
  const double pc0 = process_cpu_s();
  for (auto _ : state) {
    Tensor c = matmul(a, b);
    c.eval();
    benchmark::DoNotOptimize(c.array().raw());
  }
  const double pcpu = process_cpu_s() - pc0;
  set_rate(state, "GFLOPS", 2.0 * static_cast<double>(n * n * n) * 1e-9, pcpu);
  state.SetLabel(std::string(dtype_name(dt)));
}
BENCHMARK(BM_Gemm)
    ->ArgsProduct({{256, 1024, 2048}, {0, 1}})
    ->ArgNames({"n", "bf16"})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Gemm)
    ->ArgsProduct({{4096}, {0, 1}})
    ->ArgNames({"n", "bf16"})
    ->Iterations(2)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

/// f32 GEMM backends side by side (C = A @ B, n x n): 0 oneDNN sgemm, 1 OpenBLAS cblas_sgemm.
/// OpenBLAS reads OPENBLAS_CORETYPE at load time; the label shows the kernels it took.
void BM_SgemmBackend(benchmark::State& state) {
  const int64_t n = state.range(0);
  const bool openblas = state.range(1) == 1;
  std::vector<float> a(static_cast<size_t>(n * n)), b(a.size()), c(a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    a[i] = static_cast<float>((i * 7) % 13) * 0.1f - 0.6f;
    b[i] = static_cast<float>((i * 5) % 11) * 0.1f - 0.5f;
  }
  auto gemm = openblas ? cpu::sgemm_openblas : cpu::sgemm_onednn;
  gemm(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
  const double pc0 = process_cpu_s();
  for (auto _ : state) {
    gemm(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    benchmark::DoNotOptimize(c.data());
  }
  const double pcpu = process_cpu_s() - pc0;
  set_rate(state, "GFLOPS", 2.0 * static_cast<double>(n * n * n) * 1e-9, pcpu);
  state.SetLabel(openblas ? "openblas:" + cpu::openblas_core_name() : std::string("onednn"));
}
BENCHMARK(BM_SgemmBackend)
    ->ArgsProduct({{2048}, {0, 1}})
    ->ArgNames({"n", "openblas"})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

/// The two bf16 GEMM paths Matmul can take (bf16 in, bf16 out): 0 oneDNN's bf16 matmul
/// primitive, 1 convert to f32 + sgemm + round back (as ops: cast, matmul, cast).
void BM_Bf16Path(benchmark::State& state) {
  const int64_t n = state.range(0);
  const bool convert = state.range(1) == 1;
  if (!convert && !cpu::onednn_has_bf16_matmul()) {
    state.SkipWithError("oneDNN has no bf16 matmul on this CPU (needs AVX-512)");
    return;
  }
  Generator gen(5);
  Tensor a = randn({n, n}, Dtype::bf16, gen).eval(), b = randn({n, n}, Dtype::bf16, gen).eval();
  std::vector<BFloat16> c(static_cast<size_t>(n * n));
  auto run = [&] {
    if (convert) {
      Tensor y = cast(matmul(cast(a, Dtype::f32), cast(b, Dtype::f32)), Dtype::bf16);
      y.eval();
      benchmark::DoNotOptimize(y.array().raw());
    } else {
      cpu::gemm_bf16_onednn(false, false, n, n, n, a.array().data<BFloat16>(), n,
                            b.array().data<BFloat16>(), n, c.data(), true, n);
      benchmark::DoNotOptimize(c.data());
    }
  };
  run();
  const double pc0 = process_cpu_s();
  for (auto _ : state) run();
  const double pcpu = process_cpu_s() - pc0;
  set_rate(state, "GFLOPS", 2.0 * static_cast<double>(n * n * n) * 1e-9, pcpu);
  state.SetLabel(convert ? std::string("convert+sgemm")
                         : "onednn:" + cpu::bf16_gemm_impl_name(n, n, n));
}
BENCHMARK(BM_Bf16Path)
    ->ArgsProduct({{256, 1024, 2048}, {0, 1}})
    ->ArgNames({"n", "convert"})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

// ---- elementwise and reduction through Hetrain ops
// ---------------------------------------

enum class EwOp { add, mul, exp, sum };

void BM_Elementwise(benchmark::State& state) {
  const auto op = static_cast<EwOp>(state.range(0));
  const int64_t n = kBig / 4;
  Generator gen(3);
  Tensor x = rand({n}, -1, 1, Dtype::f32, gen).eval(), y = rand({n}, -1, 1, Dtype::f32, gen).eval();
  auto build = [&] {
    switch (op) {
      case EwOp::add:
        return add(x, y);
      case EwOp::mul:
        return mul(x, y);
      case EwOp::exp:
        return exp(x);
      case EwOp::sum:
        return sum(x);
    }
    return Tensor();
  };
  build().eval();  // warm-up: the allocator caches the output block
  const double pc0 = process_cpu_s();
  for (auto _ : state) {
    Tensor r = build();
    r.eval();
    benchmark::DoNotOptimize(r.array().raw());
  }
  // Bytes moved: inputs read + output written.
  const double operands = op == EwOp::add || op == EwOp::mul ? 3.0 : op == EwOp::exp ? 2.0 : 1.0;
  const double pcpu = process_cpu_s() - pc0;
  set_rate(state, "GBps", operands * kBig * 1e-9, pcpu);
  static const char* names[] = {"add", "mul", "exp", "sum"};
  state.SetLabel(names[state.range(0)]);
}
BENCHMARK(BM_Elementwise)->DenseRange(0, 3)->UseRealTime()->Unit(benchmark::kMillisecond);

// ---- attention as a GPT layer runs it
// -------------------------------------------------------

/// Causal attention forward + gradient to the fused (B, s, 3 H d) projection, gpt-mini's shape
/// (B 32, s 64, H 4, d 32). Arg 0: split the projection, view each part as (B, H, s, d), attend
/// and merge the heads (the copies and the split's gradient adds included); arg 1: the packed
/// op, which reads and writes those layouts in place.
void BM_AttentionLayout(benchmark::State& state) {
  const int64_t B = 32, s = 64, H = 4, d = 32, D = H * d;
  const bool packed = state.range(0) == 1;
  Generator gen(5);
  Tensor qkv = randn({B, s, 3 * D}, Dtype::f32, gen).eval();
  Tensor cot = randn({B, s, D}, Dtype::f32, gen).eval();
  auto step = [&] {
    Tensor y;
    if (packed) {
      y = scaled_dot_product_attention_packed(qkv, H, true);
    } else {
      auto parts = split(qkv, {D, D, D}, 2);
      auto heads = [&](const Tensor& x) { return transpose(reshape(x, {B, s, H, d}), 1, 2); };
      y = scaled_dot_product_attention(heads(parts[0]), heads(parts[1]), heads(parts[2]), true);
      y = reshape(transpose(y, 1, 2), {B, s, D});
    }
    std::vector<Tensor> g = grad({y}, {qkv}, {cot});
    eval({y, g[0]});
  };
  step();
  for (auto _ : state) step();
  state.SetLabel(packed ? "packed" : "split heads");
}
BENCHMARK(BM_AttentionLayout)->Arg(0)->Arg(1)->UseRealTime()->Unit(benchmark::kMillisecond);

/// gpt-mini's causal attention forward (+ gradient) in bf16 (operands as autocast leaves them),
/// arg 0 forward only, 1 forward + gradient: the batched bf16 products where
/// cpu::bf16_gemm_path() is oneDNN (AMX, AVX512-BF16), else the f32 kernels over converted tiles.
void BM_AttentionBf16(benchmark::State& state) {
  const bool backward = state.range(0) == 1;
  Generator gen(7);
  // Scores of a trained layer's order (q.k / sqrt(d) within a few units), not randn's +-30.
  Tensor qkv = cast(randn({32, 64, 384}, Dtype::f32, gen) * 0.25, Dtype::bf16).eval();
  Tensor cot = cast(randn({32, 64, 128}, Dtype::f32, gen), Dtype::bf16).eval();
  auto step = [&] {
    Tensor y = scaled_dot_product_attention_packed(qkv, 4, true);
    if (backward)
      eval({y, grad({y}, {qkv}, {cot})[0]});
    else
      y.eval();
  };
  step();
  for (auto _ : state) step();
  state.SetLabel(backward ? "forward + gradient" : "forward");
}
BENCHMARK(BM_AttentionBf16)->Arg(0)->Arg(1)->UseRealTime()->Unit(benchmark::kMillisecond);

// ---- a product's epilogue: inside the product or a pass after it
// ---------------------------------------------------------------------

/// gpt-mini's linear layers in bf16 with their bias, 2048 rows: arg 0 the shape (0: 128 -> 512,
/// 1: 512 -> 128, 2: 128 -> 384), arg 1 how the bias is added: 0 not at all (oneDNN's product
/// alone), 1 as oneDNN's binary post-op inside the product (one rounding, as PyTorch's addmm),
/// 2 as Hetrain runs `matmul(x, w) + b` (the fusion pass's epilogue: the product into the output,
/// then the add over it, the unfused graph's bits). Where oneDNN has no bf16 matmul, skipped.
void BM_Bf16LinearBias(benchmark::State& state) {
  if (!cpu::onednn_has_bf16_matmul()) {
    state.SkipWithError("oneDNN has no bf16 matmul on this CPU");
    return;
  }
  static const int64_t kShapes[][2] = {{128, 512}, {512, 128}, {128, 384}};
  const int64_t M = 2048, K = kShapes[state.range(0)][0], N = kShapes[state.range(0)][1];
  const int mode = static_cast<int>(state.range(1));
  Generator gen(3);
  Tensor x = cast(randn({M, K}, Dtype::f32, gen), Dtype::bf16).eval();
  Tensor w = cast(randn({K, N}, Dtype::f32, gen), Dtype::bf16).eval();
  Tensor b = cast(randn({N}, Dtype::f32, gen), Dtype::bf16).eval();
  using dt = dnnl::memory::data_type;
  using tag = dnnl::memory::format_tag;
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream strm(eng);
  const dnnl::memory::desc a_md({M, K}, dt::bf16, tag::ab), w_md({K, N}, dt::bf16, tag::ab),
      c_md({M, N}, dt::bf16, tag::ab), b_md({1, N}, dt::bf16, tag::ab);
  dnnl::primitive_attr attr;
  if (mode == 1) {
    dnnl::post_ops po;
    po.append_binary(dnnl::algorithm::binary_add, b_md);
    attr.set_post_ops(po);
  }
  const dnnl::matmul prim(
      dnnl::matmul::primitive_desc(dnnl::matmul::desc(a_md, w_md, c_md), attr, eng));
  std::vector<BFloat16> out(static_cast<size_t>(M * N));
  dnnl::memory am(a_md, eng, x.array().raw()), wm(w_md, eng, w.array().raw()),
      cm(c_md, eng, out.data()), bm(b_md, eng, b.array().raw());
  auto step = [&] {
    if (mode == 2) {
      add(matmul(x, w), b).eval();
      return;
    }
    std::unordered_map<int, dnnl::memory> args{
        {DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, wm}, {DNNL_ARG_DST, cm}};
    if (mode == 1) args.emplace(DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) | DNNL_ARG_SRC_1, bm);
    prim.execute(strm, args);
    strm.wait();
  };
  step();
  for (auto _ : state) step();
  static const char* modes[] = {"product alone", "bias as oneDNN post-op",
                                "bias as Hetrain's epilogue"};
  state.SetLabel(std::to_string(K) + " -> " + std::to_string(N) + ", " + modes[mode]);
}
BENCHMARK(BM_Bf16LinearBias)
    ->ArgsProduct({{0, 1, 2}, {0, 1, 2}})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

/// gpt-mini's f32 linear layers, 2048 rows (arg 0 the shape: 0 128 -> 512, 1 512 -> 128,
/// 2 128 -> 384, 3 128 -> 128), arg 1 what follows the product: 0 nothing, 1 a bias add, 2 a
/// residual add of a (2048, N) tensor, 3 the tanh-GELU gradient's chain (the MLP's backward:
/// the product times gelu'(h) of a saved h), 4 bias then tanh-GELU. 1-4 run as the fusion pass
/// makes them, the chain as the product's epilogue, a pass over the product once it is made (over
/// mode 0, the epilogue's cost). GFLOP/s counts the product's work only.
void BM_LinearEpilogue(benchmark::State& state) {
  static const int64_t kShapes[][2] = {{128, 512}, {512, 128}, {128, 384}, {128, 128}};
  const int64_t M = 2048, K = kShapes[state.range(0)][0], N = kShapes[state.range(0)][1];
  const int mode = static_cast<int>(state.range(1));
  Generator gen(5);
  Tensor x = randn({M, K}, Dtype::f32, gen).eval(), w = randn({K, N}, Dtype::f32, gen).eval();
  Tensor b = randn({N}, Dtype::f32, gen).eval(), r = randn({M, N}, Dtype::f32, gen).eval();
  Tensor h = randn({M, N}, Dtype::f32, gen).eval();
  // The gradient of gelu_tanh at h, as autodiff builds it, with the product as the cotangent.
  auto step = [&] {
    Tensor y = matmul(x, w);
    if (mode == 1) y = y + b;
    if (mode == 2) y = y + r;
    if (mode == 3) y = grad({gelu(h, "tanh")}, {h}, {y})[0];
    if (mode == 4) y = gelu(y + b, "tanh");
    y.eval();
  };
  step();
  for (auto _ : state) step();
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * static_cast<double>(M * N * K),
                                                 benchmark::Counter::kIsIterationInvariantRate);
  static const char* modes[] = {"product alone", "+ bias", "+ residual", "* gelu'(h)",
                                "gelu(+ bias)"};
  state.SetLabel(std::to_string(K) + " -> " + std::to_string(N) + ", " + modes[mode]);
}
BENCHMARK(BM_LinearEpilogue)
    ->ArgsProduct({{0, 1, 2, 3}, {0, 1, 2, 3, 4}})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

// ---- one kernel source at every vector width
// ---------------------------------------------------------

/// A vector kernel at each ISA this CPU runs (cpu::set_vector_isa; the same binary): arg 0 the
/// kernel (0 tanh-GELU forward + gradient on (2048, 512), gpt-mini's MLP activation; 1 layer norm
/// forward + gradients on (2048, 128); 2 gpt-mini's causal attention forward + gradient, whose
/// exp tiles are the vector part), arg 1 the ISA (0 baseline, 1 avx2, 2 avx512; skipped where
/// the CPU lacks it). Time is the process's CPU time per iteration.
void BM_KernelIsa(benchmark::State& state) {
  const auto isa = static_cast<cpu::Isa>(state.range(1));
  if (isa > cpu::widest_isa()) {
    state.SkipWithError("this CPU lacks the ISA");
    return;
  }
  const cpu::Isa saved = cpu::set_vector_isa(isa);
  Generator gen(11);
  std::function<void()> step;
  Tensor a, b, c;
  switch (state.range(0)) {
    case 0:
      a = randn({2048, 512}, Dtype::f32, gen).eval();
      b = randn({2048, 512}, Dtype::f32, gen).eval();
      step = [&] {
        Tensor y = gelu(a, "tanh");
        eval({y, grad({y}, {a}, {b})[0]});
      };
      break;
    case 1:
      a = randn({2048, 128}, Dtype::f32, gen).eval();
      b = randn({128}, Dtype::f32, gen).eval();
      c = randn({2048, 128}, Dtype::f32, gen).eval();
      step = [&] {
        Tensor y = layer_norm(a, {128}, b, b);
        auto g = grad({y}, {a, b}, {c});
        eval({y, g[0], g[1]});
      };
      break;
    default:
      a = randn({32, 64, 384}, Dtype::f32, gen).eval();
      b = randn({32, 64, 128}, Dtype::f32, gen).eval();
      step = [&] {
        Tensor y = scaled_dot_product_attention_packed(a, 4, true);
        eval({y, grad({y}, {a}, {b})[0]});
      };
  }
  step();
  const double pc0 = process_cpu_s();
  int64_t iters = 0;
  for (auto _ : state) {
    step();
    ++iters;
  }
  state.counters["cpu_ms"] = 1e3 * (process_cpu_s() - pc0) / static_cast<double>(iters);
  static const char* kernels[] = {"gelu_tanh fwd+bwd", "layer_norm fwd+bwd", "attention fwd+bwd"};
  state.SetLabel(std::string(kernels[state.range(0)]) + " @ " + cpu::isa_name(isa));
  cpu::set_vector_isa(saved);
}
BENCHMARK(BM_KernelIsa)
    ->ArgsProduct({{0, 1, 2}, {0, 1, 2}})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

// ---- per-node overhead
// ---------------------------------------------------------------------

/// A chain of `nodes` tiny adds on a one-element tensor: the graph-building, scheduling and
/// dispatch cost per node (the kernel itself adds one float). Reported per node: build +
/// eval, and each part; "_cpu" counters use the calling thread's CPU time (the chain runs on
/// that thread alone), the others wall-clock time.
void BM_NodeOverhead(benchmark::State& state) {
  const int64_t nodes = state.range(0);
  Tensor one = scalar(1.0).eval();
  double build_w = 0, build_c = 0, eval_w = 0, eval_c = 0;
  for (auto _ : state) {
    double w0 = wall_s(), c0 = thread_cpu_s();
    Tensor y = one;
    for (int64_t i = 0; i < nodes; ++i) y = add(y, one);
    double w1 = wall_s(), c1 = thread_cpu_s();
    // Evaluating also releases the chain's links, so dropping y never recurses 10k deep.
    y.eval();
    benchmark::DoNotOptimize(y.array().raw());
    double w2 = wall_s(), c2 = thread_cpu_s();
    build_w += w1 - w0;
    build_c += c1 - c0;
    eval_w += w2 - w1;
    eval_c += c2 - c1;
  }
  const double us = 1e6 / static_cast<double>(nodes * static_cast<int64_t>(state.iterations()));
  state.counters["us_per_node"] = (build_w + eval_w) * us;
  state.counters["us_per_node_cpu"] = (build_c + eval_c) * us;
  state.counters["build_us"] = build_w * us;
  state.counters["build_us_cpu"] = build_c * us;
  state.counters["eval_us"] = eval_w * us;
  state.counters["eval_us_cpu"] = eval_c * us;
}
BENCHMARK(BM_NodeOverhead)->Arg(10000)->Unit(benchmark::kMillisecond);

/// A tensor read by `uses` nodes (exp(x * c_i), summed by a tree of adds) and its gradient: the
/// gradient's accumulation is a chain of `uses` adds, which the fusion pass once absorbed into
/// one chain in quadratic time (8000 uses: 192 s, now a third of a second). Graph building,
/// autodiff, fusion and evaluation together, per iteration.
void BM_SharedTensorGradient(benchmark::State& state) {
  const int64_t uses = state.range(0);
  Generator gen(1);
  Tensor x = randn({16}, Dtype::f32, gen).eval();
  x.requires_grad_(true);
  for (auto _ : state) {
    std::vector<Tensor> parts;
    for (int64_t i = 0; i < uses; ++i) parts.push_back(exp(x * (0.001 * static_cast<double>(i))));
    while (parts.size() > 1) {
      std::vector<Tensor> next;
      for (size_t i = 0; i + 1 < parts.size(); i += 2) next.push_back(parts[i] + parts[i + 1]);
      if (parts.size() % 2) next.push_back(parts.back());
      parts = std::move(next);
    }
    Tensor g = grad({sum(parts[0])}, {x})[0];
    g.eval();
    benchmark::DoNotOptimize(g.array().raw());
  }
}
BENCHMARK(BM_SharedTensorGradient)->Arg(2000)->Arg(8000)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
