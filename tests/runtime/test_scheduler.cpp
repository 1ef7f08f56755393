// The heterogeneous scheduler over cpu + sim devices: pins, coherence (bit-identical results
// to CPU-only runs on random graphs), copies made once, plan caching, and the list scheduler.
#include <gtest/gtest.h>

#include <cstring>
#include <optional>
#include <random>

#include "hetrain/base/error.h"
#include "hetrain/graph/autodiff.h"
#include "hetrain/graph/ops.h"
#include "hetrain/graph/primitive.h"
#include "hetrain/runtime/eval.h"
#include "hetrain/runtime/perf_model.h"
#include "hetrain/runtime/scheduler.h"
#include "runtime/internal.h"  // replica_count

using namespace hetrain;
namespace rt = hetrain::runtime;

namespace {

class Scheduler : public ::testing::Test {
 protected:
  void TearDown() override { rt::configure({}); }
  static void use(const std::string& devices, rt::PlacementPolicy p) {
    rt::configure({.devices = rt::parse_devices(devices), .placement = p});
  }
};

const Device kSim0{DeviceKind::sim, 0};
const Device kSim1{DeviceKind::sim, 1};

/// A random DAG of matmuls, elementwise ops, reductions and views over a few leaves; node k
/// is pinned to pins[k % pins.size()] when pins is not empty (an empty Device list: no pins).
std::vector<Tensor> random_graph(uint64_t seed, const std::vector<std::optional<Device>>& pins) {
  std::mt19937_64 rng(seed);
  Generator gen(seed);
  const int64_t n = 24;
  std::vector<Tensor> pool;
  for (int i = 0; i < 3; ++i) pool.push_back(randn({n, n}, Dtype::f32, gen).eval());
  std::vector<Tensor> outs;
  for (int k = 0; k < 40; ++k) {
    std::optional<DeviceScope> pin;
    if (!pins.empty() && pins[static_cast<size_t>(k) % pins.size()])
      pin.emplace(*pins[static_cast<size_t>(k) % pins.size()]);
    auto pick = [&]() -> const Tensor& {
      // Favour recent tensors so the graph is deep as well as wide.
      const size_t m = pool.size();
      const size_t back = std::min<size_t>(m - 1, rng() % 6);
      return rng() % 3 ? pool[m - 1 - back] : pool[rng() % m];
    };
    const Tensor &a = pick(), &b = pick();  // pool grows only after y is built
    Tensor y;
    switch (rng() % 9) {
      case 0:
        y = matmul(a, b) * (1.0 / n);
        break;
      case 1:
        y = a + b;
        break;
      case 2:
        y = a * b;
        break;
      case 3:
        y = tanh(a);
        break;
      case 4:
        y = transpose(a, 0, 1);
        break;  // a view
      case 5:
        y = broadcast_to(sum(a, {0}, true), {n, n}) * 0.1;
        break;
      case 6:
        y = softmax(a, -1);
        break;
      case 7:
        y = maximum(a, b) - exp(b * 0.1);
        break;
      default:
        y = slice(a, 0, 0, n, 1) + 1.0;
        break;
    }
    pool.push_back(y);
    if (rng() % 4 == 0) outs.push_back(y);
  }
  outs.push_back(sum(pool.back()));
  return outs;
}

std::vector<std::vector<float>> values(const std::vector<Tensor>& ts) {
  eval(ts);
  std::vector<std::vector<float>> v;
  for (const Tensor& t : ts) v.push_back(t.to_vector<float>());
  return v;
}

void expect_bit_identical(const std::vector<std::vector<float>>& a,
                          const std::vector<std::vector<float>>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].size(), b[i].size()) << what;
    EXPECT_EQ(0, std::memcmp(a[i].data(), b[i].data(), a[i].size() * sizeof(float)))
        << what << ": output " << i << " differs, e.g. " << a[i][0] << " vs " << b[i][0];
  }
}

}  // namespace

TEST_F(Scheduler, ParseDevicesAndErrors) {
  auto d = rt::parse_devices("cpu,sim:0,sim:1@4");
  ASSERT_EQ(d.size(), 3u);
  EXPECT_EQ(d[1].device, kSim0);
  EXPECT_EQ(d[2].slowdown, 4.0);
  try {
    rt::parse_devices("cpu,gpu:0");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown device 'gpu:0'; devices found: cpu, sim:0"),
              std::string::npos)
        << e.what();
  }
  if (rt::available_devices().find("cuda:0") == std::string::npos) {
    // No GPU here (or no CUDA backend): the error says so and lists what there is.
    try {
      rt::parse_devices("cpu,cuda:0");
      FAIL() << "expected an error";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("device 'cuda:0' is not present"), std::string::npos) << msg;
      EXPECT_NE(msg.find("devices found: cpu, sim:0 .. sim:7"), std::string::npos) << msg;
      EXPECT_TRUE(msg.find("no CUDA device") != std::string::npos ||
                  msg.find("no CUDA backend") != std::string::npos)
          << msg;
    }
  }
  EXPECT_THROW(rt::parse_devices("cpu,sim:0,sim:0"), Error);
  EXPECT_THROW(rt::parse_devices("sim:0,cpu"), Error);
  EXPECT_THROW(rt::parse_devices("cpu,sim:1@0.5"), Error);
  EXPECT_THROW(rt::parse_placement("fastest"), Error);
}

TEST_F(Scheduler, PinToAbsentDeviceNamesIt) {
  Tensor x = ones({4});
  Tensor y;
  {
    DeviceScope on(Device{DeviceKind::sim, 3});
    y = exp(x);
  }
  try {
    y.eval();
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[exp] is pinned to sim:3, which is not among the "
                                         "configured devices (cpu)"),
              std::string::npos)
        << e.what();
  }
}

TEST_F(Scheduler, PinsAreRespectedByEveryPolicy) {
  for (auto policy :
       {rt::PlacementPolicy::pinned, rt::PlacementPolicy::density, rt::PlacementPolicy::heft}) {
    use("cpu,sim:0,sim:1@2", policy);
    Tensor x = randn({32, 32}).eval();
    Tensor a, b, c;
    {
      DeviceScope on(kSim1);
      a = matmul(x, x);
    }
    {
      DeviceScope on(kSim0);
      b = tanh(a);
    }
    c = a + b;
    eval({c});
    EXPECT_EQ(a.node()->device, kSim1) << rt::placement_name(policy);
    EXPECT_EQ(a.array().device(), kSim1) << "a's data lives in sim:1's memory node";
    EXPECT_EQ(b.node()->device, kSim0);
    EXPECT_EQ(b.array().device(), kSim0);
    // Values agree with the CPU.
    rt::configure({});
    Tensor c2 = matmul(x, x) + tanh(matmul(x, x));
    const auto want = c2.to_vector<float>(), got = c.to_vector<float>();
    EXPECT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * sizeof(float)));
  }
}

TEST_F(Scheduler, RandomGraphsBitIdenticalToCpuOnly) {
  const std::vector<std::vector<std::optional<Device>>> pin_sets = {
      {},                                           // placement alone
      {kSim0, kSim1, std::nullopt, Device::cpu()},  // pins spread over every device
      {kSim1, kSim1, kSim0},
  };
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    rt::configure({});
    const auto want = values(random_graph(seed, {}));
    for (auto policy :
         {rt::PlacementPolicy::pinned, rt::PlacementPolicy::density, rt::PlacementPolicy::heft}) {
      for (size_t ps = 0; ps < pin_sets.size(); ++ps) {
        use("cpu,sim:0,sim:1", policy);
        const rt::SchedulerStats before = rt::scheduler_stats();
        const auto got = values(random_graph(seed, pin_sets[ps]));
        expect_bit_identical(want, got,
                             "seed " + std::to_string(seed) + " policy " +
                                 rt::placement_name(policy) + " pins " + std::to_string(ps));
        if (ps > 0) {
          EXPECT_GT(rt::scheduler_stats().copy_tasks, before.copy_tasks);
        }
      }
    }
  }
}

TEST_F(Scheduler, TrainingStepBitIdentical) {
  // Forward, backward and an update over cpu + two sim devices, with HEFT free to spread.
  auto step = [](bool hetero) {
    if (hetero) {
      rt::configure({.devices = rt::parse_devices("cpu,sim:0,sim:1"),
                     .placement = rt::PlacementPolicy::heft});
    } else {
      rt::configure({});
    }
    Generator gen(7);
    Tensor x = randn({64, 48}, Dtype::f32, gen), w1 = randn({48, 96}, Dtype::f32, gen),
           w2 = randn({96, 10}, Dtype::f32, gen);
    w1.requires_grad_();
    w2.requires_grad_();
    Tensor loss = mean(square(matmul(gelu(matmul(x, w1)), w2)));
    std::vector<Tensor> g = grad({loss}, {w1, w2});
    Tensor w1n = w1 - g[0] * 0.01, w2n = w2 - g[1] * 0.01;
    return values({loss, w1n, w2n, g[0]});
  };
  expect_bit_identical(step(false), step(true), "training step");
}

TEST_F(Scheduler, CopiesAreMadeOnceAndReused) {
  use("cpu,sim:0,sim:1", rt::PlacementPolicy::pinned);
  Tensor x = randn({256}).eval();  // on the CPU
  reset_transfer_stats();
  std::vector<Tensor> ys;
  {
    DeviceScope on(kSim0);
    ys = {exp(x), tanh(x), x * x};
  }
  eval(ys);
  EXPECT_EQ(transfer_stats().copies, 1) << "three consumers on sim:0 share one copy of x";
  EXPECT_EQ(transfer_stats().bytes, 256 * 4);
  // A later graph finds x already on sim:0.
  Tensor z;
  {
    DeviceScope on(kSim0);
    z = abs(x);
  }
  z.eval();
  EXPECT_EQ(transfer_stats().copies, 1) << "the replica on sim:0 is still valid";
  // sim:1 needs its own copy; two CPU consumers of a sim:0 result share one copy back.
  Tensor u;
  {
    DeviceScope on(kSim1);
    u = neg(x);
  }
  Tensor v = ys[0] + 1.0, w = ys[0] * 3.0;
  eval({u, v, w});
  EXPECT_EQ(transfer_stats().copies, 3);
  EXPECT_EQ(w.array().device(), Device::cpu());
  EXPECT_EQ(v.to_vector<float>(), (exp(x) + 1.0).to_vector<float>());
}

TEST_F(Scheduler, WriteInvalidatesOtherCopies) {
  use("cpu,sim:0", rt::PlacementPolicy::pinned);
  Tensor x = full({8}, 1.0).eval();
  Tensor a;
  {
    DeviceScope on(kSim0);
    a = x + x;
  }
  EXPECT_EQ(a.to_vector<float>()[0], 2.0f);
  ASSERT_EQ(rt::replica_count(x.node()), 1u);
  // A new value written to x (a fresh buffer): the sim:0 copy is stale and must not be read.
  Tensor fresh = full({8}, 5.0).eval();
  x.node()->outs[0] = fresh.array();
  reset_transfer_stats();
  Tensor b;
  {
    DeviceScope on(kSim0);
    b = x + x;
  }
  EXPECT_EQ(b.to_vector<float>()[0], 10.0f);
  EXPECT_EQ(transfer_stats().copies, 1);
}

TEST_F(Scheduler, PlanIsCachedByGraphStructure) {
  use("cpu,sim:0,sim:1", rt::PlacementPolicy::heft);
  auto build = [](uint64_t seed) {
    Generator gen(seed);
    Tensor a = randn({16, 16}, Dtype::f32, gen), b = randn({16, 16}, Dtype::f32, gen);
    return sum(tanh(matmul(a, b)) + exp(a));
  };
  build(1).eval();
  const auto s0 = rt::scheduler_stats();
  build(2).eval();  // same structure, other values
  const auto s1 = rt::scheduler_stats();
  EXPECT_EQ(s1.plans, s0.plans);
  EXPECT_EQ(s1.plan_hits, s0.plan_hits + 1);
}

TEST_F(Scheduler, SimDeviceMemoryIsItsOwnNode) {
  use("cpu,sim:0", rt::PlacementPolicy::pinned);
  const int64_t host_before = host_allocator().stats().current_total;
  const int64_t sim_before = allocator_for(kSim0).stats().current_total;
  Tensor y;
  {
    DeviceScope on(kSim0);
    y = exp(zeros({1024}));
  }
  y.eval();
  EXPECT_EQ(allocator_for(kSim0).stats().current_total - sim_before, 1024 * 4);
  EXPECT_LE(host_allocator().stats().current_total - host_before, 0);
  EXPECT_EQ(y.to_vector<float>()[0], 1.0f);
}

// ---- the list scheduler on task graphs -----------------------------------------------------

namespace {
rt::TaskNode work(double gflop, std::vector<rt::TaskInput> in = {}) {
  rt::TaskNode n;
  n.name = "work";
  n.flops = gflop * 1e9;
  n.bytes = 1e3;
  n.inputs = std::move(in);
  return n;
}
rt::TaskInput from(int p, double bytes = 1e3) {
  rt::TaskInput i;
  i.producer = p;
  i.bytes = bytes;
  return i;
}
std::vector<rt::DeviceModel> equal_devices(int k) {
  std::vector<rt::DeviceModel> d(static_cast<size_t>(k));
  for (int i = 0; i < k; ++i) {
    d[static_cast<size_t>(i)].device = i == 0 ? Device::cpu() : Device{DeviceKind::sim, i - 1};
    d[static_cast<size_t>(i)].gflops = 1;
    d[static_cast<size_t>(i)].node_overhead_s = 0;
    d[static_cast<size_t>(i)].link_latency_s = 0;
    d[static_cast<size_t>(i)].link_gbps = 1;  // 1e3 bytes: 1 us
  }
  return d;
}
}  // namespace

TEST(ListScheduler, HeftSpreadsIndependentWorkAndMeetsTheBound) {
  // Fork-join: one source, four 1-second branches, one sink.
  std::vector<rt::TaskNode> g = {work(0.001)};
  for (int i = 0; i < 4; ++i) g.push_back(work(1, {from(0)}));
  g.push_back(work(0.001, {from(1), from(2), from(3), from(4)}));
  rt::RooflineModel m(equal_devices(2));
  const double lb = rt::makespan_lower_bound(g, m, 2);
  EXPECT_NEAR(lb, 2.001, 1e-6);  // total work 4.002 s over two devices
  const rt::Schedule pinned = rt::place(g, rt::PlacementPolicy::pinned, m, 2);
  const rt::Schedule heft = rt::place(g, rt::PlacementPolicy::heft, m, 2);
  EXPECT_NEAR(pinned.makespan, 4.002, 1e-6);
  EXPECT_LT(heft.makespan, 2.01);
  EXPECT_GE(heft.makespan, lb - 1e-12);
  // Two branches on the second device: the source's output moves there once, and each branch
  // result comes back once.
  int on1 = 0;
  for (int v = 1; v <= 4; ++v) on1 += heft.device[static_cast<size_t>(v)] == 1;
  EXPECT_EQ(on1, 2);
  EXPECT_EQ(heft.copies.size(), 3u);
}

TEST(ListScheduler, DensityKeepsCheapOpsWithTheirData) {
  // A fast device 1 behind a slow link: a big matmul-like node goes there, a cheap
  // elementwise node on big data stays on device 0 where its input is.
  auto devs = equal_devices(2);
  devs[1].gflops = 100;
  devs[0].gbps = devs[1].gbps = 10;
  devs[1].link_gbps = 0.1;
  rt::RooflineModel m(devs);
  rt::TaskNode dense =
      work(10, {rt::TaskInput{.producer = -1, .bytes = 1e6, .present = 1, .external = 0}});
  rt::TaskNode light =
      work(1e-6, {rt::TaskInput{.producer = -1, .bytes = 1e8, .present = 1, .external = 1}});
  light.bytes = 2e8;
  const rt::Schedule s = rt::place({dense, light}, rt::PlacementPolicy::density, m, 2);
  EXPECT_EQ(s.device[0], 1);
  EXPECT_EQ(s.device[1], 0);
  EXPECT_EQ(s.bytes_moved, 1e6);
}

TEST(ListScheduler, PinsOverrideEveryPolicy) {
  std::vector<rt::TaskNode> g = {work(1), work(1), work(1)};
  g[0].pin = 1;
  g[2].pin = 1;
  rt::RooflineModel m(equal_devices(3));
  for (auto p :
       {rt::PlacementPolicy::pinned, rt::PlacementPolicy::density, rt::PlacementPolicy::heft}) {
    const rt::Schedule s = rt::place(g, p, m, 3);
    EXPECT_EQ(s.device[0], 1);
    EXPECT_EQ(s.device[2], 1);
  }
}

TEST(ListScheduler, NodesStayOffDevicesWithoutTheirKernel) {
  // Device 1 is 100x faster, but node 1 has no kernel there (a CUDA device without that
  // op's eval_cuda): every policy keeps it on device 0; node 0 may still go to device 1.
  auto devs = equal_devices(2);
  devs[1].gflops = 100;
  rt::RooflineModel m(devs);
  std::vector<rt::TaskNode> g = {work(10), work(10, {from(0)})};
  g[1].forbid = 1u << 1;
  for (auto p : {rt::PlacementPolicy::density, rt::PlacementPolicy::heft}) {
    const rt::Schedule s = rt::place(g, p, m, 2);
    EXPECT_EQ(s.device[0], 1);
    EXPECT_EQ(s.device[1], 0);
  }
}

TEST(ListScheduler, NoisyCalibrationIsNotTrusted) {
  // StarPU issue 50: a few noisy samples claiming device 1 is 1000x faster sent every GEMM
  // there. Two samples are not trusted: HEFT keeps using the roofline and spreads the work.
  auto devs = equal_devices(2);
  std::vector<rt::TaskNode> g;
  for (int i = 0; i < 8; ++i) {
    rt::TaskNode n = work(0.01);
    n.name = "matmul";
    n.size = 1e6;
    n.footprint = 42;
    g.push_back(n);
  }
  rt::PerfModels models;
  const std::string fast = rt::device_class(devs[1]);
  models.record("matmul", fast, Dtype::f32, 42, 1e6, 1e-5);
  models.record("matmul", fast, Dtype::f32, 42, 1e6, 3e-5);
  const rt::CalibratedModel noisy(devs, models);
  const rt::Schedule s = rt::place(g, rt::PlacementPolicy::heft, noisy, 2);
  int on1 = 0;
  for (int d : s.device) on1 += d == 1;
  EXPECT_EQ(on1, 4) << "untrusted samples must not attract the work";
  // Once the samples agree (3+, mean known to 10%), the model is trusted and used.
  for (int k = 0; k < 10; ++k) models.record("matmul", fast, Dtype::f32, 42, 1e6, 2e-5);
  const rt::CalibratedModel trusted(devs, models);
  const rt::Schedule t = rt::place(g, rt::PlacementPolicy::heft, trusted, 2);
  on1 = 0;
  for (int d : t.device) on1 += d == 1;
  EXPECT_GE(on1, 7);
}

TEST_F(Scheduler, ConvAttentionNormOnSimDevicesBitIdentical) {
  // The oneDNN convolution, flash attention and layer norm kernels (forward and backward) run
  // on sim devices' serial workers and give the CPU's bits.
  auto run = [](bool hetero) {
    if (hetero) {
      rt::configure({.devices = rt::parse_devices("cpu,sim:0,sim:1"),
                     .placement = rt::PlacementPolicy::heft});
    } else {
      rt::configure({});
    }
    Generator gen(11);
    Tensor x = randn({4, 8, 12, 12}, Dtype::f32, gen), w = randn({16, 8, 3, 3}, Dtype::f32, gen);
    Tensor q = randn({2, 2, 16, 8}, Dtype::f32, gen), k = randn({2, 2, 16, 8}, Dtype::f32, gen);
    w.requires_grad_();
    q.requires_grad_();
    std::optional<DeviceScope> on;
    if (hetero) on.emplace(kSim0);
    Tensor c = conv2d(x, w);
    Tensor a = scaled_dot_product_attention(q, k, k, true);
    Tensor loss = mean(square(layer_norm(c, {16, 10, 10}))) + sum(a * a);
    on.reset();
    std::vector<Tensor> g = grad({loss}, {w, q});
    return values({loss, g[0], g[1]});
  };
  expect_bit_identical(run(false), run(true), "conv, attention, layer norm");
}

TEST(ListScheduler, DevicesSharingTheHostCoresRunNoMoreNodesThanCores) {
  // Two independent 1-second nodes pinned to the CPU and to a sim device. As hardware of their
  // own they overlap (1 s); as threads on one shared core they take turns (2 s); on two cores
  // they overlap again. A sim device slowed 4x holds the core for a quarter of its 4 s (the rest
  // is its declared slowdown, spent asleep), so the CPU's node starts after 1 s, not 4 s.
  std::vector<rt::TaskNode> g = {work(1), work(1)};
  g[0].pin = 0;
  g[1].pin = 1;
  auto devs = equal_devices(2);
  EXPECT_NEAR(rt::place(g, rt::PlacementPolicy::pinned, rt::RooflineModel(devs), 2).makespan, 1,
              1e-9);
  for (auto& d : devs) d.host_cores = 1;
  rt::RooflineModel one_core(devs);
  EXPECT_EQ(one_core.shared_cores(), 1);
  EXPECT_NEAR(rt::place(g, rt::PlacementPolicy::pinned, one_core, 2).makespan, 2, 1e-9);
  EXPECT_NEAR(rt::makespan_lower_bound(g, one_core, 2), 2, 1e-9);  // two core-seconds, one core
  for (auto& d : devs) d.host_cores = 2;
  EXPECT_NEAR(rt::place(g, rt::PlacementPolicy::pinned, rt::RooflineModel(devs), 2).makespan, 1,
              1e-9);
  for (auto& d : devs) d.host_cores = 1;
  devs[1].slowdown = 4;
  std::vector<rt::TaskNode> sim_first = {work(1), work(1)};
  sim_first[0].pin = 1;
  sim_first[1].pin = 0;
  const rt::Schedule s =
      rt::place(sim_first, rt::PlacementPolicy::pinned, rt::RooflineModel(devs), 2);
  EXPECT_NEAR(s.finish[0], 4, 1e-9);
  EXPECT_NEAR(s.start[1], 1, 1e-9);
  EXPECT_NEAR(s.makespan, 4, 1e-9);
  // A device list with sim devices shares this machine's cores; modelled hardware does not.
  const auto parsed = rt::parse_devices("cpu,sim:0");
  EXPECT_GT(rt::RooflineModel(parsed).shared_cores(), 0);
  EXPECT_EQ(rt::RooflineModel(rt::parse_devices("cpu")).shared_cores(), 0);
}
