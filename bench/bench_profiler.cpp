// The profiler's cost: one training run of a GPT preset with the profiler switched on for
// every other step, so on- and off-steps share the process, the data and the machine's load.
// Prints the median step time of each and the overhead.
//
//   build/bench/bench_profiler [--preset gpt-mini] [--pairs 8] [--threads 0]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "hetrain/base/error.h"
#include "hetrain/graph/ops.h"
#include "hetrain/insight/profiler.h"
#include "hetrain/training/trainer.h"

using namespace hetrain;

namespace {
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0 : n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}
// Seconds per node of a graph of n tiny adds (the kernel is nearly free, so this is the
// executor's own cost per node, plus the profiler's when it is on).
double seconds_per_tiny_node(insight::Profiler* prof, int n) {
  Tensor x = ones({4}).eval();
  double best = 1e300;
  for (int rep = 0; rep < 5; ++rep) {
    Tensor y = x;
    for (int i = 0; i < n; ++i) y = y + x;
    if (prof) prof->start();
    const auto t0 = std::chrono::steady_clock::now();
    y.eval();
    const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (prof) prof->stop();
    best = std::min(best, t / n);
  }
  return best;
}
}  // namespace

int main(int argc, char** argv) {
  std::string preset = "gpt-mini";
  int pairs = 8, threads = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--preset"))
      preset = argv[i + 1];
    else if (!std::strcmp(argv[i], "--pairs"))
      pairs = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--threads"))
      threads = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: bench_profiler [--preset P] [--pairs N] [--threads N]\n");
      return 2;
    }
  }
  try {
    training::TrainConfig cfg = training::preset_config(preset);
    const int warmup = 2;
    cfg.steps = warmup + 2 * pairs;
    cfg.threads = threads;
    cfg.progress = false;
    cfg.final_eval = false;
    cfg.log_every = cfg.steps;
    insight::Profiler prof;
    // Steps warmup, warmup+2, ... are profiled; the others are not.
    auto profiled = [&](int64_t s) { return s >= warmup && (s - warmup) % 2 == 0; };
    training::StepHooks hooks;
    hooks.begin = [&](int64_t s) {
      if (!profiled(s)) return;
      prof.start();
      prof.begin_step(s);
    };
    hooks.end = [&](int64_t s, double loss) {
      if (!profiled(s)) return;
      prof.end_step(loss);
      prof.stop();
    };
    training::TrainResult r = training::train(cfg, hooks);
    std::vector<double> on, off;
    for (size_t s = warmup; s < r.step_seconds.size(); ++s)
      (profiled(static_cast<int64_t>(s)) ? on : off).push_back(r.step_seconds[s]);
    const double m_on = median(on), m_off = median(off);
    std::printf(
        "%s, %d threads: median step %.2f ms profiler off, %.2f ms on (%zu steps each); "
        "overhead %+.1f%%; %zu node events, %zu memory samples\n",
        preset.c_str(), r.threads, m_off * 1e3, m_on * 1e3, on.size(), 100 * (m_on / m_off - 1),
        prof.nodes().size(), prof.memory().size());
    // The hook's own cost per node, and what it adds to a step of this preset.
    insight::Profiler tiny;
    const double off_s = seconds_per_tiny_node(nullptr, 20000);
    const double on_s = seconds_per_tiny_node(&tiny, 20000);
    const double nodes_per_step = static_cast<double>(prof.nodes().size()) / on.size();
    std::printf(
        "tiny nodes: %.2f us each profiler off, %.2f us on: %.2f us per node; x %.0f nodes "
        "per step = %.2f ms = %.2f%% of the median step\n",
        off_s * 1e6, on_s * 1e6, (on_s - off_s) * 1e6, nodes_per_step,
        (on_s - off_s) * nodes_per_step * 1e3, 100 * (on_s - off_s) * nodes_per_step / m_off);
  } catch (const Error& e) {
    std::fprintf(stderr, "bench_profiler: %s\n", e.what());
    return 1;
  }
  return 0;
}
