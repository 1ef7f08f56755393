// Scheduler benchmark: makespan of each placement policy against the lower bound
// max(critical path, total work / devices), with bytes moved, on standard random task-graph
// families (layered, fork-join, tiled Cholesky) and on the presets' training steps
// (simulate mode); then the inter-op speedup of the executor on 2 cores for independent
// branches (real kernels).
//
//   build/bench/bench_sched            # all three parts (about 30 s)
//   build/bench/bench_sched families   # one part: families | presets | interop
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "hetrain/base/thread_pool.h"
#include "hetrain/graph/ops.h"
#include "hetrain/runtime/eval.h"
#include "hetrain/runtime/perf_model.h"
#include "hetrain/runtime/scheduler.h"
#include "hetrain/training/trainer.h"

using namespace hetrain;
namespace rt = hetrain::runtime;

namespace {

const rt::PlacementPolicy kPolicies[] = {rt::PlacementPolicy::pinned, rt::PlacementPolicy::density,
                                         rt::PlacementPolicy::heft};

/// A node of `gflop` work over tiles of `mb` megabytes read from each input.
rt::TaskNode node(double flops, double bytes, std::vector<int> from) {
  rt::TaskNode n;
  n.name = "task";
  n.flops = flops;
  n.bytes = bytes * static_cast<double>(from.size() + 1);
  for (int p : from) n.inputs.push_back({.producer = p, .index = 0, .bytes = bytes});
  return n;
}

double log_uniform(std::mt19937_64& rng, double lo, double hi) {
  std::uniform_real_distribution<double> u(std::log(lo), std::log(hi));
  return std::exp(u(rng));
}

/// Layered DAG: `layers` of `width` nodes, each reading 1-3 nodes of the previous layer.
std::vector<rt::TaskNode> layered(uint64_t seed, int layers, int width) {
  std::mt19937_64 rng(seed);
  std::vector<rt::TaskNode> g;
  for (int l = 0; l < layers; ++l)
    for (int w = 0; w < width; ++w) {
      std::vector<int> from;
      if (l > 0) {
        const int k = 1 + static_cast<int>(rng() % 3);
        for (int i = 0; i < k; ++i)
          from.push_back((l - 1) * width + static_cast<int>(rng() % width));
        std::sort(from.begin(), from.end());
        from.erase(std::unique(from.begin(), from.end()), from.end());
      }
      g.push_back(node(log_uniform(rng, 1e7, 1e9), log_uniform(rng, 1e5, 4e6), from));
    }
  return g;
}

/// Fork-join: `stages` of a fork into `width` branches of `depth` nodes, then a join.
std::vector<rt::TaskNode> fork_join(uint64_t seed, int stages, int width, int depth) {
  std::mt19937_64 rng(seed);
  std::vector<rt::TaskNode> g = {node(1e6, 1e6, {})};
  for (int s = 0; s < stages; ++s) {
    const int fork = static_cast<int>(g.size()) - 1;
    std::vector<int> ends;
    for (int w = 0; w < width; ++w) {
      int prev = fork;
      for (int d = 0; d < depth; ++d) {
        g.push_back(node(log_uniform(rng, 5e7, 5e8), 1e6, {prev}));
        prev = static_cast<int>(g.size()) - 1;
      }
      ends.push_back(prev);
    }
    g.push_back(node(1e6, 1e6, ends));
  }
  return g;
}

/// Tiled right-looking Cholesky over t x t tiles of b x b f32: POTRF, TRSM, SYRK and GEMM
/// tasks with their data dependencies (the classic StarPU/PaRSEC test DAG).
std::vector<rt::TaskNode> cholesky(int t, double b) {
  std::vector<rt::TaskNode> g;
  std::vector<std::vector<int>> last(static_cast<size_t>(t),
                                     std::vector<int>(static_cast<size_t>(t), -1));
  const double tile = b * b * 4;
  auto add = [&](double flops, std::vector<int> from, int i, int j) {
    from.erase(std::remove(from.begin(), from.end(), -1), from.end());
    std::sort(from.begin(), from.end());
    from.erase(std::unique(from.begin(), from.end()), from.end());
    g.push_back(node(flops, tile, from));
    last[static_cast<size_t>(i)][static_cast<size_t>(j)] = static_cast<int>(g.size()) - 1;
  };
  auto L = [&](int i, int j) { return last[static_cast<size_t>(i)][static_cast<size_t>(j)]; };
  for (int k = 0; k < t; ++k) {
    add(b * b * b / 3, {L(k, k)}, k, k);                                       // POTRF
    for (int i = k + 1; i < t; ++i) add(b * b * b, {L(k, k), L(i, k)}, i, k);  // TRSM
    for (int i = k + 1; i < t; ++i) {
      add(b * b * b, {L(i, k), L(i, i)}, i, i);  // SYRK
      for (int j = k + 1; j < i; ++j)
        add(2 * b * b * b, {L(i, k), L(j, k), L(i, j)}, i, j);  // GEMM
    }
  }
  return g;
}

void families() {
  // A CPU and two slower devices: one a core's share, one four times slower than that, each
  // modelled as hardware of its own (not sharing the CPU's cores) to compare the policies.
  std::vector<rt::DeviceModel> devs = rt::parse_devices("cpu,sim:0,sim:1@4");
  for (auto& d : devs) d.host_cores = 0;
  const rt::RooflineModel model(devs);
  const int nd = static_cast<int>(devs.size());
  std::printf("## task-graph families on cpu,sim:0,sim:1@4 (roofline durations)\n\n");
  std::printf("devices:");
  for (const auto& d : devs)
    std::printf(" %s %.0f GFLOP/s %.0f GB/s;", d.device.str().c_str(), d.gflops / d.slowdown,
                d.gbps / d.slowdown);
  std::printf(" links %.0f GB/s\n\n", devs[1].link_gbps);
  std::printf(
      "| graph | nodes | lower bound ms | pinned ms | density ms | heft ms | heft / bound | heft "
      "MB moved | heft copies |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|\n");
  struct Case {
    std::string name;
    std::vector<rt::TaskNode> g;
  };
  std::vector<Case> cases;
  for (uint64_t s = 1; s <= 3; ++s)
    cases.push_back({"layered 10x8 seed " + std::to_string(s), layered(s, 10, 8)});
  for (uint64_t s = 1; s <= 3; ++s)
    cases.push_back({"fork-join 4x6x3 seed " + std::to_string(s), fork_join(s, 4, 6, 3)});
  cases.push_back({"cholesky 6x6 tiles of 256", cholesky(6, 256)});
  cases.push_back({"cholesky 10x10 tiles of 512", cholesky(10, 512)});
  for (const Case& c : cases) {
    const double lb = rt::makespan_lower_bound(c.g, model, nd);
    double ms[3];
    rt::Schedule heft;
    for (int p = 0; p < 3; ++p) {
      rt::Schedule s = rt::place(c.g, kPolicies[p], model, nd);
      ms[p] = s.makespan;
      if (kPolicies[p] == rt::PlacementPolicy::heft) heft = std::move(s);
    }
    std::printf("| %s | %zu | %.3f | %.3f | %.3f | %.3f | %.2f | %.2f | %zu |\n", c.name.c_str(),
                c.g.size(), lb * 1e3, ms[0] * 1e3, ms[1] * 1e3, ms[2] * 1e3, ms[2] / lb,
                heft.bytes_moved * 1e-6, heft.copies.size());
  }
  std::printf("\n");
}

void presets() {
  std::printf(
      "## training steps of the presets, simulate mode (durations: perf models where "
      "trusted, else roofline)\n\n");
  std::printf(
      "| preset | devices | policy | step ms | lower bound ms | step / bound | MB moved | copies | "
      "nodes |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|\n");
  const std::string warn = rt::perf_models().load(rt::perf_model_path());
  if (!warn.empty()) std::fprintf(stderr, "warning: %s\n", warn.c_str());
  for (const char* preset : {"fashion-mlp", "gpt-mini"}) {
    training::TrainConfig cfg = training::preset_config(preset);
    for (const char* devices : {"cpu", "cpu,sim:0,sim:1"}) {
      for (auto policy : kPolicies) {
        if (std::string(devices) == "cpu" && policy != rt::PlacementPolicy::heft) continue;
        rt::configure({.devices = rt::parse_devices(devices), .placement = policy});
        rt::SimulationLog log;
        log.keep_tasks = false;
        double c0 = 0, lb0 = 0, b0 = 0, h0 = 0;
        int64_t k0 = 0, n0 = 0;
        {
          rt::SimulateScope sim(log);
          training::run_synthetic_steps(cfg, 2, [&](int64_t s) {
            if (s == 0) {
              c0 = log.clock;
              lb0 = log.lower_bound;
              b0 = log.bytes_moved;
              h0 = log.host_s;
              k0 = log.copies;
              n0 = log.nodes;
            }
          });
        }
        const double step = log.clock - c0, lb = log.lower_bound - lb0 + (log.host_s - h0);
        std::printf("| %s | %s | %s | %.2f | %.2f | %.2f | %.2f | %lld | %lld |\n", preset, devices,
                    rt::placement_name(policy), step * 1e3, lb * 1e3, step / lb,
                    (log.bytes_moved - b0) * 1e-6, static_cast<long long>(log.copies - k0),
                    static_cast<long long>(log.nodes - n0));
      }
    }
  }
  rt::configure({});
  std::printf("\n");
}

/// Wall seconds of one eval of `branches` independent chains of small matmul+tanh nodes
/// (each kernel too small to split across threads: any speedup is inter-op).
double chains_seconds(int branches, int depth) {
  std::vector<Tensor> outs;
  for (int b = 0; b < branches; ++b) {
    Tensor x = full({96, 96}, 0.01 * (b + 1)).eval();
    Tensor y = x;
    for (int d = 0; d < depth; ++d) y = tanh(matmul(y, x));
    outs.push_back(y);
  }
  const auto t0 = std::chrono::steady_clock::now();
  eval(outs);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void interop() {
  std::printf("## inter-op parallelism: 8 independent chains of 40 (96x96 matmul, tanh) nodes\n\n");
  std::printf("| threads | median ms (15 runs) | speedup |\n|---|---|---|\n");
  double base = 0;
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    chains_seconds(8, 40);
    std::vector<double> v;
    for (int r = 0; r < 15; ++r) v.push_back(chains_seconds(8, 40));
    std::sort(v.begin(), v.end());
    const double med = v[v.size() / 2];
    if (threads == 1) base = med;
    std::printf("| %d | %.3f | %.2f |\n", threads, med * 1e3, base / med);
  }
  set_num_threads(0);
  std::printf("\n");
}

}  // namespace

int main(int argc, char** argv) {
  const std::string part = argc > 1 ? argv[1] : "all";
  if (part != "all" && part != "families" && part != "presets" && part != "interop") {
    std::fprintf(stderr, "usage: bench_sched [all|families|presets|interop]\n");
    return 2;
  }
  if (part == "all" || part == "families") families();
  if (part == "all" || part == "presets") presets();
  if (part == "all" || part == "interop") interop();
  return 0;
}
