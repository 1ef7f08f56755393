// Convolution and batch-norm speed on fashion-cnn's shapes (batch 128), and one training step
// (forward + backward, no optimizer) of the fashion-cnn ResNet (widths 16/32/64, one block per
// stage). The last argument of the conv and step benchmarks picks the conv path: 0 = im2col + GEMM
// (the path before oneDNN), 1 = oneDNN, 2 = the direct kernels where they apply (oneDNN
// for the other shapes), 3 = Winograd F(2x2,3x3) for 3x3 stride 1, then as 2; BM_BatchNorm's: 1 =
// fused batch_norm2d, 0 = the composite of mean/var/elementwise ops it replaced, 2 = fused with
// relu, 3 = fused then a separate relu. BM_ConvAB runs one conv pass on two paths or Winograd tile
// sizes, and BM_FashionCnnStepTiles training steps with 2x2 Winograd tiles and with the size
// picked by output width, alternately in one process; each reports both medians and the median
// ratio b/a of adjacent runs, which holds on a machine whose speed drifts.
//   cmake -S . -B build -G Ninja -DHETRAIN_BUILD_BENCH=ON && cmake --build build -j2
//   [THREADS=N] ./build/bench/bench_conv --benchmark_filter=Step
// "Time" is wall clock, "CPU" the whole process's CPU time (a steadier measure of work on a shared
// machine); GFLOP/s is per wall-clock second.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <vector>

#include "backends/cpu/conv_direct.h"
#include "backends/cpu/conv_dnnl.h"
#include "backends/cpu/conv_winograd.h"
#include "backends/cpu/isa.h"
#include "hetrain/base/thread_pool.h"
#include "hetrain/graph/autodiff.h"
#include "hetrain/graph/ops.h"
#include "hetrain/runtime/eval.h"
#include "hetrain/runtime/fusion.h"
#include "hetrain/training/nn.h"

using namespace hetrain;

namespace {

struct ConvCase {
  int64_t C, H, O, k, s, p;
};
// The nine convolutions of fashion-cnn (block 0's two 16->16 convs share a shape).
const ConvCase kConvs[] = {
    {1, 28, 16, 3, 1, 1},   // 0 stem
    {16, 28, 16, 3, 1, 1},  // 1 block 0 conv1/conv2
    {16, 28, 32, 3, 2, 1},  // 2 block 1 conv1
    {32, 14, 32, 3, 1, 1},  // 3 block 1 conv2
    {16, 28, 32, 1, 2, 0},  // 4 block 1 shortcut
    {32, 14, 64, 3, 2, 1},  // 5 block 2 conv1
    {64, 7, 64, 3, 1, 1},   // 6 block 2 conv2
    {32, 14, 64, 1, 2, 0},  // 7 block 2 shortcut
};
constexpr int64_t kBatch = 128;

// THREADS=N in the environment sets hetrain's thread count (default: every core).
const bool kThreadsSet = [] {
  const char* t = std::getenv("THREADS");
  if (t) set_num_threads(std::atoi(t));
  return t != nullptr;
}();

/// 0: im2col, 1: oneDNN, 2: direct (then oneDNN), 3: Winograd (then direct, then oneDNN); -1
/// restores the default order.
void use_conv_path(int64_t path) {
  cpu::set_winograd_conv_disabled(path >= 0 && path != 3);
  cpu::set_direct_conv_disabled(path == 0 || path == 1);
  cpu::set_dnnl_conv_disabled(path == 0);
}

/// One of kConvs with random input, weights and output gradient; run(pass) evaluates pass 0
/// (forward), 1 (input gradient) or 2 (weight gradient).
struct ConvBench {
  const ConvCase& c;
  Tensor x, w, gy;
  explicit ConvBench(const ConvCase& cc) : c(cc) {
    Generator gen(1);
    x = randn({kBatch, c.C, c.H, c.H}, Dtype::f32, gen);
    w = randn({c.O, c.C, c.k, c.k}, Dtype::f32, gen);
    gy = randn(conv().shape(), Dtype::f32, gen);
    eval({x, w, gy});
  }
  Tensor conv() const { return conv2d(x, w, {}, {c.s, c.s}, {c.p, c.p}); }
  void run(int64_t pass) const {
    eval({pass == 0 ? conv() : grad({conv()}, {pass == 1 ? x : w}, {gy})[0]});
  }
};

/// range(0): case, range(1): 0 forward, 1 backward data, 2 backward weights, range(2): path.
void BM_Conv(benchmark::State& st) {
  const ConvBench b(kConvs[st.range(0)]);
  use_conv_path(st.range(2));
  for (auto _ : st) b.run(st.range(1));
  const double flops = 2.0 * static_cast<double>(b.gy.numel() * b.c.C * b.c.k * b.c.k);
  st.counters["GFLOP/s"] =
      benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  use_conv_path(-1);
}

void conv_args(benchmark::internal::Benchmark* b) {
  for (int64_t i = 0; i < static_cast<int64_t>(std::size(kConvs)); ++i)
    for (int64_t pass = 0; pass < 3; ++pass)
      for (int64_t path : {0, 1, 2, 3}) b->Args({i, pass, path});
}

/// Batch norm on (128, 16, 28, 28): forward and the gradients of x, weight and bias. Arg 2: with
/// relu fused into the kernels; 3: the same relu as a separate op after the fused batch norm.
void BM_BatchNorm(benchmark::State& st) {
  const bool fused = st.range(0) >= 1;
  const bool with_relu = st.range(0) >= 2, relu_fused = st.range(0) == 2;
  Generator gen(2);
  const int64_t C = 16;
  Tensor x = randn({kBatch, C, 28, 28}, Dtype::f32, gen), gy = randn(x.shape(), Dtype::f32, gen);
  Tensor w = ones({C}), b = zeros({C});
  eval({x, gy, w, b});
  auto f = [&](const std::vector<Tensor>& in) {
    if (with_relu && relu_fused) return batch_norm2d(in[0], in[1], in[2], 1e-5, true)[0];
    if (with_relu) return relu(batch_norm2d(in[0], in[1], in[2])[0]);
    if (fused) return batch_norm2d(in[0], in[1], in[2])[0];
    const Shape bs{1, C, 1, 1};
    Tensor mu = mean(in[0], {0, 2, 3}, true);
    Tensor d = in[0] - mu;
    Tensor v = mean(square(d), {0, 2, 3}, true);
    return d * rsqrt(v + 1e-5) * reshape(in[1], bs) + reshape(in[2], bs);
  };
  for (auto _ : st) {
    Tensor y = f({x, w, b});
    auto g = grad({y}, {x, w, b}, {gy});
    eval({y, g[0], g[1], g[2]});
  }
}

/// Runs a and b alternately, once each per iteration, and reports the median time of each and
/// the median of their per-iteration ratios (b / a): on a machine whose speed drifts, adjacent
/// runs of the two compare where separate benchmarks of each do not.
void interleaved(benchmark::State& st, const std::function<void()>& a,
                 const std::function<void()>& b) {
  std::vector<double> ta, tb, ratio;
  auto time = [](const std::function<void()>& f) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  };
  for (auto _ : st) {
    ta.push_back(time(a));
    tb.push_back(time(b));
    ratio.push_back(tb.back() / ta.back());
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
  };
  st.counters["a_ms"] = median(ta);
  st.counters["b_ms"] = median(tb);
  st.counters["b/a"] = median(ratio);
}

/// One conv pass of case range(0) (pass range(1) as in BM_Conv) on two variants, range(2) (a) and
/// range(3) (b), interleaved: 0-3 the paths of BM_Conv (picking their tile size), 4 Winograd
/// with 2x2 output tiles forced, 5 with 4x4 tiles forced, 6 path 3 (the own kernels first) with
/// the vector width held to AVX2, 7 path 3 at the CPU's widest (AVX-512 where it has it).
void BM_ConvAB(benchmark::State& st) {
  const ConvBench b(kConvs[st.range(0)]);
  const cpu::Isa isa = cpu::vector_isa();
  auto run = [&](int64_t variant) {
    return [&, variant] {
      use_conv_path(variant >= 6 ? 3 : std::min<int64_t>(variant, 3));
      cpu::set_winograd_tile_size(variant == 4 ? 2 : variant == 5 ? 4 : 0);
      cpu::set_vector_isa(variant == 6 ? cpu::Isa::avx2 : isa);
      b.run(st.range(1));
    };
  };
  interleaved(st, run(st.range(2)), run(st.range(3)));
  cpu::set_vector_isa(isa);
  cpu::set_winograd_tile_size(0);
  use_conv_path(-1);
}

/// A downsampling block's 3x3 stride-2 convolution (case range(0): 2 or 5) and its 1x1 shortcut
/// (the case two after it), forward (range(1) 0) or both weight gradients (2): with the fusion
/// pass off (a: two nodes) and on (b: one node), interleaved.
void BM_ConvPair(benchmark::State& st) {
  const ConvCase &c = kConvs[st.range(0)], &s = kConvs[st.range(0) + 2];
  Generator gen(1);
  Tensor x = randn({kBatch, c.C, c.H, c.H}, Dtype::f32, gen);
  Tensor w = randn({c.O, c.C, c.k, c.k}, Dtype::f32, gen);
  Tensor w2 = randn({s.O, s.C, s.k, s.k}, Dtype::f32, gen);
  const Shape ys = conv2d(x, w, {}, {c.s, c.s}, {c.p, c.p}).shape();
  Tensor gy = randn(ys, Dtype::f32, gen), gy2 = randn(ys, Dtype::f32, gen);
  eval({x, w, w2, gy, gy2});
  auto run = [&](bool pair) {
    return [&, pair] {
      runtime::set_fusion_enabled(pair);
      Tensor y = conv2d(x, w, {}, {c.s, c.s}, {c.p, c.p}),
             y2 = conv2d(x, w2, {}, {s.s, s.s}, {s.p, s.p});
      if (st.range(1) == 0)
        eval({y, y2});
      else
        eval(grad({y, y2}, {w, w2}, {gy, gy2}));
      runtime::set_fusion_enabled(true);
    };
  };
  interleaved(st, run(false), run(true));
}

/// A fashion-cnn model and batch; step() runs one training step: forward, cross-entropy,
/// backward, running statistics.
struct FashionCnn {
  Generator gen{3};
  nn::ResNet model{1, 10, {16, 32, 64}, 1, gen};
  Tensor x, t;
  FashionCnn() {
    model.train();
    x = randn({kBatch, 1, 28, 28}, Dtype::f32, gen);
    std::vector<int64_t> labels(kBatch);
    for (int64_t i = 0; i < kBatch; ++i) labels[static_cast<size_t>(i)] = (i * 7) % 10;
    t = from_vector(labels, {kBatch});
    eval({x, t});
  }
  void step() {
    Tensor loss = cross_entropy(model.forward(x), t);
    loss.backward();
    std::vector<Tensor> buffers;
    for (auto& [n, buf] : model.named_buffers()) buffers.push_back(*buf);
    eval(buffers);
    for (auto& [n, buf] : model.named_buffers()) *buf = buf->detach();
    model.zero_grad();
  }
};

/// One fashion-cnn training step.
void BM_FashionCnnStep(benchmark::State& st) {
  use_conv_path(st.range(0));
  FashionCnn net;
  for (auto _ : st) net.step();
  st.counters["samples/s"] = benchmark::Counter(static_cast<double>(kBatch),
                                                benchmark::Counter::kIsIterationInvariantRate);
  use_conv_path(-1);
}

/// fashion-cnn training steps with the Winograd passes on 2x2 output tiles (a) and on the tile
/// size picked by output width (b), interleaved.
void BM_FashionCnnStepTiles(benchmark::State& st) {
  FashionCnn net;
  auto run = [&](int64_t m) {
    return [&, m] {
      cpu::set_winograd_tile_size(m);
      net.step();
    };
  };
  interleaved(st, run(2), run(0));
  cpu::set_winograd_tile_size(0);
}

}  // namespace

BENCHMARK(BM_Conv)->Apply(conv_args)->MeasureProcessCPUTime()->UseRealTime()->Unit(
    benchmark::kMillisecond);
// Winograd tile sizes on the 28x28 and 14x14 stride-1 convs; direct against oneDNN on the
// stride-2 convs to 7x7 outputs.
BENCHMARK(BM_ConvAB)
    ->ArgsProduct({{1, 3, 6}, {0, 1, 2}, {4}, {5}})
    ->ArgsProduct({{5, 7}, {0, 1, 2}, {1}, {2}})
    // The own kernels' register tiles at AVX2 width against the widest, and against oneDNN.
    ->ArgsProduct({{1, 2, 3, 5, 6}, {0, 1, 2}, {6, 1}, {7}})
    ->Iterations(40)
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ConvPair)
    ->ArgsProduct({{2, 5}, {0, 2}})
    ->Iterations(40)
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_FashionCnnStepTiles)->Iterations(20)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_BatchNorm)
    ->Arg(0)
    ->Arg(1)
    ->Arg(2)
    ->Arg(3)
    ->MeasureProcessCPUTime()
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_FashionCnnStep)
    ->Arg(0)
    ->Arg(1)
    ->Arg(2)
    ->Arg(3)
    ->MeasureProcessCPUTime()
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();
