// Planner speed: the strategy search over the whole hardware catalog for GPT-3 175B (300B
// tokens, a 90-day deadline), as `hetrain plan --model gpt3-175b --tokens 300e9` runs it.
// The search is meant to answer at a prompt (well under a second); this is where that is
// measured, not in a test.
//
//   build/bench/bench_plan
#include <benchmark/benchmark.h>

#include <string>

#include "hetrain/planning/plan.h"

using namespace hetrain::planning;

static void BM_SearchWholeCatalog(benchmark::State& state) {
  const Catalog c = Catalog::load(std::string(HETRAIN_SOURCE_DIR) + "/data/hardware.json");
  Job j;
  j.model = preset("gpt3-175b");
  j.tokens = 300e9;
  j.global_batch = 1536;
  SearchOptions o;
  o.deadline_days = 90;
  for (auto _ : state) {
    SearchResult r = search(j, c, o);
    benchmark::DoNotOptimize(r.plans.data());
  }
}
BENCHMARK(BM_SearchWholeCatalog)->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();
