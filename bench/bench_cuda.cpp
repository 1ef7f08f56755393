// CUDA kernel micro-benchmarks (issue 8): each primitive's CUDA kernel on data already in GPU
// memory, timed from eval() to the end of the device's queued work (graph building included,
// a few microseconds per node). Counters: TFLOP/s for GEMM, convolution and attention, GB/s
// (bytes read plus written once) for the memory-bound kernels. Without a CUDA device (or
// backend) every benchmark reports "no CUDA device".
//
//   build/bench/bench_cuda --benchmark_counters_tabular=true
//   build/bench/bench_cuda --benchmark_filter='Matmul'
#include <benchmark/benchmark.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "graph/prims/attention.h"
#include "hetrain/graph/autodiff.h"
#include "hetrain/graph/ops.h"
#include "hetrain/memory/allocator.h"
#include "hetrain/runtime/eval.h"
#include "hetrain/runtime/scheduler.h"
#if HETRAIN_HAVE_CUDA
#include "backends/cuda/api.h"
#endif

namespace {

using namespace hetrain;
const Device kCuda0{DeviceKind::cuda, 0};

bool have_cuda() { return devices_found().find("cuda:0") != std::string::npos; }

/// x (evaluated on the CPU) as a leaf resident on cuda:0.
Tensor to_gpu(const Tensor& x) { return make_leaf(copy_to_device(x.eval().array(), kCuda0)); }

/// Random normal data (its absolute value when positive) of shape s and dtype dt, resident
/// on cuda:0.
Tensor on_gpu(const Shape& s, Dtype dt, uint64_t seed, bool positive = false) {
  Generator gen(seed);
  Tensor x = randn(s, Dtype::f32, gen);
  if (positive) x = abs(x);
  return to_gpu(cast(x, dt));
}

/// Times build() evaluated on cuda:0 until its kernels finished; sets the rate counters.
void run(benchmark::State& state, const std::function<std::vector<Tensor>()>& build, double flops,
         double bytes) {
#if HETRAIN_HAVE_CUDA
  if (!have_cuda()) {
    state.SkipWithError("no CUDA device");
    return;
  }
  runtime::configure({.devices = runtime::parse_devices("cpu,cuda:0"),
                      .placement = runtime::PlacementPolicy::pinned});
  auto once = [&] {
    DeviceScope on(kCuda0);
    std::vector<Tensor> outs = build();
    eval(outs);
    cuda::synchronize(0);
  };
  once();  // warm-up: cuBLASLt heuristics, allocator cache
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    once();
    state.SetIterationTime(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  if (flops > 0)
    state.counters["TFLOP/s"] =
        benchmark::Counter(flops * 1e-12, benchmark::Counter::kIsIterationInvariantRate);
  if (bytes > 0)
    state.counters["GB/s"] =
        benchmark::Counter(bytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  runtime::configure({});
#else
  state.SkipWithError("no CUDA device (built without the CUDA backend)");
#endif
}

void BM_Matmul(benchmark::State& state, Dtype dt) {
  const int64_t n = state.range(0);
  if (!have_cuda()) return run(state, {}, 0, 0);
  Tensor a = on_gpu({n, n}, dt, 1), b = on_gpu({n, n}, dt, 2);
  run(
      state, [&] { return std::vector<Tensor>{matmul(a, b)}; }, 2.0 * n * n * n, 0);
}
BENCHMARK_CAPTURE(BM_Matmul, bf16, Dtype::bf16)->Arg(4096)->Arg(8192)->UseManualTime();
BENCHMARK_CAPTURE(BM_Matmul, f16, Dtype::f16)->Arg(4096)->UseManualTime();
BENCHMARK_CAPTURE(BM_Matmul, f32, Dtype::f32)->Arg(4096)->UseManualTime();

void BM_AddBroadcast(benchmark::State& state) {
  if (!have_cuda()) return run(state, {}, 0, 0);
  Tensor a = on_gpu({8192, 4096}, Dtype::bf16, 3), b = on_gpu({4096}, Dtype::bf16, 4);
  run(
      state, [&] { return std::vector<Tensor>{a + b}; }, 0, 2.0 * 2 * 8192 * 4096);
}
BENCHMARK(BM_AddBroadcast)->UseManualTime();

void BM_Softmax(benchmark::State& state) {
  if (!have_cuda()) return run(state, {}, 0, 0);
  Tensor x = on_gpu({8192, 4096}, Dtype::f32, 5);
  run(
      state, [&] { return std::vector<Tensor>{softmax(x, -1)}; }, 0, 2.0 * 4 * 8192 * 4096);
}
BENCHMARK(BM_Softmax)->UseManualTime();

void BM_SumRows(benchmark::State& state) {
  if (!have_cuda()) return run(state, {}, 0, 0);
  Tensor x = on_gpu({8192, 4096}, Dtype::f32, 6);
  run(
      state, [&] { return std::vector<Tensor>{sum(x, {0})}; }, 0, 4.0 * 8192 * 4096);
}
BENCHMARK(BM_SumRows)->UseManualTime();

void BM_LayerNorm(benchmark::State& state) {
  if (!have_cuda()) return run(state, {}, 0, 0);
  Tensor x = on_gpu({8192, 768}, Dtype::bf16, 7), w = on_gpu({768}, Dtype::bf16, 8),
         b = on_gpu({768}, Dtype::bf16, 9);
  run(
      state, [&] { return std::vector<Tensor>{layer_norm(x, {768}, w, b)}; }, 0,
      2.0 * 2 * 8192 * 768);
}
BENCHMARK(BM_LayerNorm)->UseManualTime();

void BM_CrossEntropy(benchmark::State& state) {
  if (!have_cuda()) return run(state, {}, 0, 0);
  Tensor logits = on_gpu({8192, 50304}, Dtype::f32, 10);
  Generator gen(11);
  Tensor t = make_leaf(copy_to_device(
      cast(rand({8192}, 0, 50303, Dtype::f32, gen), Dtype::i64).eval().array(), kCuda0));
  run(
      state, [&] { return std::vector<Tensor>{cross_entropy(logits, t)}; }, 0, 4.0 * 8192 * 50304);
}
BENCHMARK(BM_CrossEntropy)->UseManualTime();

// GPT-2 124M's attention: 8 x 12 heads, context 1024, head dim 64, causal, bf16. Forward
// FLOPs: q k^T and p v over the visible half of the scores.
const Shape kGpt2Heads{8, 12, 1024, 64};
constexpr double kGpt2AttentionFlops = 4.0 * 8 * 12 * 1024 * 1024 * 64 / 2;

void BM_Attention(benchmark::State& state) {
  if (!have_cuda()) return run(state, {}, 0, 0);
  Tensor q = on_gpu(kGpt2Heads, Dtype::bf16, 12), k = on_gpu(kGpt2Heads, Dtype::bf16, 13),
         v = on_gpu(kGpt2Heads, Dtype::bf16, 14);
  run(
      state, [&] { return std::vector<Tensor>{scaled_dot_product_attention(q, k, v, true)}; },
      kGpt2AttentionFlops, 0);
}
BENCHMARK(BM_Attention)->UseManualTime();

/// The backward kernels alone (sdpa_backward: D, dq, then dk and dv) from the forward's o and
/// lse, computed once on the CPU: q k^T recomputed plus four products, 2.5x the forward FLOPs.
void BM_AttentionBackward(benchmark::State& state) {
  if (!have_cuda()) return run(state, {}, 0, 0);
  const double scale = 0.125;  // 1 / sqrt(64)
  Generator gen(30);
  std::vector<Tensor> in;
  for (int i = 0; i < 4; ++i) in.push_back(cast(randn(kGpt2Heads, Dtype::f32, gen), Dtype::bf16));
  std::vector<Tensor> fwd =
      make_node(std::make_shared<SdpaForward>(true, scale), {in[0], in[1], in[2]});
  Tensor q = to_gpu(in[0]), k = to_gpu(in[1]), v = to_gpu(in[2]), g = to_gpu(in[3]),
         o = to_gpu(fwd[0]), lse = to_gpu(fwd[1]);
  run(
      state,
      [&] {
        return make_node(std::make_shared<SdpaBackward>(true, scale), {q, k, v, o, g, lse});
      },
      2.5 * kGpt2AttentionFlops, 0);
}
BENCHMARK(BM_AttentionBackward)->UseManualTime();

// A ResNet-50 stage-1 3x3 layer: batch 32, 64 -> 64 channels, 56 x 56, stride 1, padding 1.
constexpr int64_t kConvN = 32, kConvC = 64, kConvHW = 56;
constexpr double kConvFlops = 2.0 * kConvN * kConvC * kConvHW * kConvHW * kConvC * 9;

void BM_Conv2d(benchmark::State& state, Dtype dt) {
  if (!have_cuda()) return run(state, {}, 0, 0);
  Tensor x = on_gpu({kConvN, kConvC, kConvHW, kConvHW}, dt, 19),
         w = on_gpu({kConvC, kConvC, 3, 3}, dt, 20), b = on_gpu({kConvC}, dt, 21);
  run(
      state, [&] { return std::vector<Tensor>{conv2d(x, w, b, {1}, {1})}; }, kConvFlops, 0);
}
BENCHMARK_CAPTURE(BM_Conv2d, bf16, Dtype::bf16)->UseManualTime();
BENCHMARK_CAPTURE(BM_Conv2d, f32, Dtype::f32)->UseManualTime();

/// The input and weight gradients of the same layer from a given output gradient.
void BM_Conv2dBackward(benchmark::State& state, Dtype dt) {
  if (!have_cuda()) return run(state, {}, 0, 0);
  Tensor x = on_gpu({kConvN, kConvC, kConvHW, kConvHW}, dt, 22),
         w = on_gpu({kConvC, kConvC, 3, 3}, dt, 23),
         g = on_gpu({kConvN, kConvC, kConvHW, kConvHW}, dt, 24);
  run(
      state,
      [&] {
        return grad({conv2d(x, w, {}, {1}, {1})}, {x, w}, {g});
      },
      2 * kConvFlops, 0);
}
BENCHMARK_CAPTURE(BM_Conv2dBackward, bf16, Dtype::bf16)->UseManualTime();

void BM_MaxPool2d(benchmark::State& state) {
  if (!have_cuda()) return run(state, {}, 0, 0);
  // ResNet's stem pool: 3x3, stride 2, padding 1 on (32, 64, 112, 112); y and the i64 indices.
  Tensor x = on_gpu({32, 64, 112, 112}, Dtype::bf16, 25);
  run(
      state, [&] { return std::vector<Tensor>{max_pool2d(x, {3}, {2}, {1})}; }, 0,
      2.0 * 32 * 64 * 112 * 112 + (2.0 + 8.0) * 32 * 64 * 56 * 56);
}
BENCHMARK(BM_MaxPool2d)->UseManualTime();

void BM_BatchNorm2d(benchmark::State& state) {
  if (!have_cuda()) return run(state, {}, 0, 0);
  // Training-mode forward and backward on (32, 64, 112, 112) bf16: x read and y written
  // (forward), x and g read and dx written (backward).
  const Shape s{32, 64, 112, 112};
  Tensor x = on_gpu(s, Dtype::bf16, 26), w = on_gpu({64}, Dtype::bf16, 27),
         b = on_gpu({64}, Dtype::bf16, 28), g = on_gpu(s, Dtype::bf16, 29);
  run(
      state,
      [&] {
        Tensor y = batch_norm2d(x, w, b)[0];
        std::vector<Tensor> outs = grad({y}, {x, w, b}, {g});
        outs.push_back(y);
        return outs;
      },
      0, 2.0 * 5 * static_cast<double>(numel(s)));
}
BENCHMARK(BM_BatchNorm2d)->UseManualTime();

void BM_AdamW(benchmark::State& state) {
  if (!have_cuda()) return run(state, {}, 0, 0);
  const int64_t n = 124 << 20;
  Tensor p = on_gpu({n}, Dtype::f32, 15), g = on_gpu({n}, Dtype::f32, 16),
         m = on_gpu({n}, Dtype::f32, 17), v = on_gpu({n}, Dtype::f32, 18, true);
  AdamWStepArgs a;
  a.weight_decay = 0.1;
  run(
      state, [&] { return adamw_update(p, g, m, v, a); }, 0, 4.0 * 7 * n);
}
BENCHMARK(BM_AdamW)->UseManualTime();

}  // namespace

BENCHMARK_MAIN();
