// The plan cache: placements by graph structure, so a training loop plans once and replays.
#include <atomic>
#include <mutex>
#include <unordered_map>

#include "hetrain/base/error.h"
#include "hetrain/graph/primitive.h"
#include "hetrain/runtime/eval.h"
#include "hetrain/runtime/perf_model.h"
#include "runtime/internal.h"

namespace hetrain::runtime {

namespace {

std::atomic<int64_t> g_plans{0};
std::atomic<int64_t> g_plan_hits{0};
std::atomic<int64_t> g_copy_tasks{0};

struct PlanCache {
  std::mutex mu;
  std::unordered_map<uint64_t, std::vector<int>> plans;  // structure hash -> device per node
};
PlanCache& plan_cache() {
  static PlanCache* c = new PlanCache();
  return *c;
}

/// The structure: primitives, shapes, edges, pins and where outside data lives. Attributes are
/// left out: they change costs little and never correctness.
uint64_t structure_hash(const std::vector<Node*>& order, const OrderIndex& index) {
  const auto& cfg = config();
  const auto& devs = cfg.devices;
  const size_t n = order.size();
  uint64_t h = mix(devs.size(), static_cast<uint64_t>(cfg.placement));
  h = mix(h, perf_models().generation());
  for (size_t i = 0; i < n; ++i) {
    const Node* nd = order[i];
    h = mix(h, reinterpret_cast<uintptr_t>(nd->prim->name()));
    for (const Array& o : nd->outs) {
      h = mix(h, static_cast<uint64_t>(o.dtype));
      for (int64_t d : o.shape) h = mix(h, static_cast<uint64_t>(d));
    }
    if (nd->pinned) {
      check_pin(*nd);
      h = mix(h, 1000 + static_cast<uint64_t>(device_index(nd->device)));
    }
    for (const Tensor& t : nd->inputs) {
      const Node* p = t.node();
      const int at = index.of(p);
      h = mix(h, at >= 0 ? static_cast<uint64_t>(at)
                         : (uint64_t{1} << 40 | uint64_t{p->sharded} << 39 |
                            present_mask(p, t.index(), devs)));
      h = mix(h, static_cast<uint64_t>(t.index()));
    }
  }
  return h;
}

}  // namespace

void check_pin(const Node& n) {
  if (n.pinned && device_index(n.device) < 0)
    fail("[", n.prim->name(), "] is pinned to ", n.device.str(),
         ", which is not among the configured devices (", configured_devices(),
         "); devices found: ", available_devices());
}

void plan_devices(const std::vector<Node*>& order, const OrderIndex& index,
                  std::vector<int>& device) {
  const uint64_t h = structure_hash(order, index);
  const size_t n = order.size();
  PlanCache& cache = plan_cache();
  {
    std::lock_guard<std::mutex> lk(cache.mu);
    auto it = cache.plans.find(h);
    if (it != cache.plans.end() && it->second.size() == n) {
      device = it->second;
      ++g_plan_hits;
      return;
    }
  }
  const auto& cfg = config();
  std::vector<TaskNode> g = task_graph(order, index, cfg.devices);
  CalibratedModel model(cfg.devices, perf_models());
  Schedule s = place(g, cfg.placement, model, static_cast<int>(cfg.devices.size()));
  device = std::move(s.device);
  ++g_plans;
  std::lock_guard<std::mutex> lk(cache.mu);
  if (cache.plans.size() > 256) cache.plans.clear();
  cache.plans[h] = device;
}

void count_copy_tasks(int64_t n) { g_copy_tasks += n; }

void clear_plan_cache() {
  std::lock_guard<std::mutex> lk(plan_cache().mu);
  plan_cache().plans.clear();
}

SchedulerStats scheduler_stats() {
  return {g_plans.load(), g_plan_hits.load(), g_copy_tasks.load()};
}

}  // namespace hetrain::runtime
