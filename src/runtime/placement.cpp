// Placement policies and the list scheduler that predicts a placement's schedule. The
// executor (eval.cpp) and simulate mode share this code: the executor runs the plan, simulate
// reports the prediction.
#include <algorithm>
#include <limits>
#include <optional>
#include <queue>
#include <unordered_map>

#include "hetrain/base/error.h"
#include "hetrain/runtime/scheduler.h"

namespace hetrain::runtime {

double RooflineModel::node_seconds(const TaskNode& node, int d) const {
  const DeviceModel& m = devices_[static_cast<size_t>(d)];
  if (node.view) return m.node_overhead_s;
  const double t = std::max(node.flops / (m.gflops * 1e9), node.bytes / (m.gbps * 1e9));
  return t * m.slowdown + m.node_overhead_s;
}

int RooflineModel::shared_cores() const {
  int sharing = 0, cores = 0;
  for (const DeviceModel& m : devices_)
    if (m.host_cores > 0) {
      ++sharing;
      cores = std::max(cores, m.host_cores);
    }
  return sharing > 1 ? cores : 0;
}

double RooflineModel::core_seconds(double seconds, int d) const {
  const DeviceModel& m = devices_[static_cast<size_t>(d)];
  return m.host_cores > 0 ? seconds / m.slowdown : 0.0;
}

double RooflineModel::copy_seconds(double bytes, int d) const {
  const DeviceModel& m = devices_[static_cast<size_t>(d)];
  return m.link_latency_s + bytes / (m.link_gbps * 1e9);
}

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

/// Key of one piece of data at one destination: (producer output or external id, device).
uint64_t copy_key(const TaskInput& in, int device) {
  const uint64_t data =
      in.producer >= 0 ? (static_cast<uint64_t>(in.producer) << 8 | static_cast<uint64_t>(in.index))
                       : (uint64_t{1} << 62 | static_cast<uint64_t>(in.external));
  return data << 5 | static_cast<uint64_t>(device);
}

class ListScheduler {
 public:
  ListScheduler(const std::vector<TaskNode>& g, const DurationModel& m, int devices, Schedule& s)
      : g_(g),
        m_(m),
        s_(s),
        worker_free_(static_cast<size_t>(devices)),
        link_free_(static_cast<size_t>(devices), 0.0),
        core_free_(static_cast<size_t>(m.shared_cores()), 0.0) {
    s_.device.assign(g.size(), -1);
    s_.start.assign(g.size(), 0);
    s_.finish.assign(g.size(), 0);
    s_.busy.assign(static_cast<size_t>(devices), 0);
    for (int d = 0; d < devices; ++d)
      worker_free_[static_cast<size_t>(d)].assign(static_cast<size_t>(std::max(1, m.workers(d))),
                                                  0.0);
  }

  /// The worker of device d that is free first.
  size_t first_free(int d) const {
    const auto& w = worker_free_[static_cast<size_t>(d)];
    return static_cast<size_t>(std::min_element(w.begin(), w.end()) - w.begin());
  }

  /// The shared core free first, or none when a node holding one for `hold` seconds needs none.
  std::optional<size_t> core_for(double hold) const {
    if (core_free_.empty() || hold <= 0) return std::nullopt;
    return static_cast<size_t>(std::min_element(core_free_.begin(), core_free_.end()) -
                               core_free_.begin());
  }

  /// Where input `in` is (a device index), or -1 when it is external data.
  int location(const TaskInput& in) const {
    return in.producer >= 0 ? s_.device[static_cast<size_t>(in.producer)] : -1;
  }
  bool present(const TaskInput& in, int d) const {
    if (in.producer >= 0) return location(in) == d;
    return (in.present >> d) & 1u;
  }

  /// Earliest finish of node v on device d, with the copies its inputs would need.
  double eft(int v, int d, double* start_out = nullptr) const {
    const TaskNode& n = g_[static_cast<size_t>(v)];
    double ready = 0, link = link_free_[static_cast<size_t>(d)];
    for (const TaskInput& in : n.inputs) {
      const double avail = in.producer >= 0 ? s_.finish[static_cast<size_t>(in.producer)] : 0.0;
      if (present(in, d)) {
        ready = std::max(ready, avail);
        continue;
      }
      auto it = copies_.find(copy_key(in, d));
      if (it != copies_.end()) {
        ready = std::max(ready, s_.copies[it->second].finish);
        continue;
      }
      link = std::max(link, avail) + m_.copy_seconds(in.bytes, d);
      ready = std::max(ready, link);
    }
    const double dur = m_.node_seconds(n, d);
    double st = std::max(ready, worker_free_[static_cast<size_t>(d)][first_free(d)]);
    if (auto c = core_for(m_.core_seconds(dur, d))) st = std::max(st, core_free_[*c]);
    if (start_out) *start_out = st;
    return st + dur;
  }

  /// Places v on d: records its copies (each once), the worker's and the link's time.
  void commit(int v, int d) {
    const TaskNode& n = g_[static_cast<size_t>(v)];
    double ready = 0;
    double& link = link_free_[static_cast<size_t>(d)];
    for (size_t k = 0; k < n.inputs.size(); ++k) {
      const TaskInput& in = n.inputs[k];
      const double avail = in.producer >= 0 ? s_.finish[static_cast<size_t>(in.producer)] : 0.0;
      if (present(in, d)) {
        ready = std::max(ready, avail);
        continue;
      }
      const uint64_t key = copy_key(in, d);
      auto it = copies_.find(key);
      if (it == copies_.end()) {
        CopyTask c{.producer = in.producer,
                   .index = in.index,
                   .consumer = v,
                   .input = static_cast<int>(k),
                   .device = d,
                   .bytes = in.bytes};
        c.start = std::max(link, avail);
        c.finish = c.start + m_.copy_seconds(in.bytes, d);
        link = c.finish;
        s_.bytes_moved += in.bytes;
        it = copies_.emplace(key, s_.copies.size()).first;
        s_.copies.push_back(c);
      }
      ready = std::max(ready, s_.copies[it->second].finish);
    }
    const double dur = m_.node_seconds(n, d);
    const size_t w = first_free(d);
    double st = std::max(ready, worker_free_[static_cast<size_t>(d)][w]);
    const double hold = m_.core_seconds(dur, d);
    if (const std::optional<size_t> core = core_for(hold)) {
      st = std::max(st, core_free_[*core]);
      core_free_[*core] = st + hold;
    }
    s_.device[static_cast<size_t>(v)] = d;
    s_.start[static_cast<size_t>(v)] = st;
    s_.finish[static_cast<size_t>(v)] = st + dur;
    worker_free_[static_cast<size_t>(d)][w] = st + dur;
    s_.busy[static_cast<size_t>(d)] += dur;
    s_.makespan = std::max(s_.makespan, st + dur);
  }

  /// Roofline time on d plus the time to bring the inputs that are not there.
  double density_cost(int v, int d) const {
    const TaskNode& n = g_[static_cast<size_t>(v)];
    double t = m_.node_seconds(n, d);
    for (const TaskInput& in : n.inputs)
      if (!present(in, d)) t += m_.copy_seconds(in.bytes, d);
    return t;
  }

 private:
  const std::vector<TaskNode>& g_;
  const DurationModel& m_;
  Schedule& s_;
  std::vector<std::vector<double>> worker_free_;  // per device, per worker
  std::vector<double> link_free_;
  std::vector<double> core_free_;  // per shared host core
  std::unordered_map<uint64_t, size_t> copies_;
};

std::vector<std::vector<int>> consumers_of(const std::vector<TaskNode>& g) {
  std::vector<std::vector<int>> c(g.size());
  for (size_t v = 0; v < g.size(); ++v)
    for (const TaskInput& in : g[v].inputs)
      if (in.producer >= 0) {
        HT_ASSERT(static_cast<size_t>(in.producer) < v);
        c[static_cast<size_t>(in.producer)].push_back(static_cast<int>(v));
      }
  return c;
}

/// The devices node v may run on.
bool allowed(const TaskNode& n, int d) { return n.pin >= 0 ? n.pin == d : !((n.forbid >> d) & 1u); }

}  // namespace

Schedule place(const std::vector<TaskNode>& g, PlacementPolicy policy, const DurationModel& m,
               int nd, bool explain) {
  HT_ASSERT(nd >= 1 && nd <= 32);
  for (const TaskNode& n : g)
    if (n.pin >= nd)
      fail("[placement] a node (", n.name, ") is pinned to device #", n.pin, " but only ", nd,
           " devices are configured");
  Schedule s;
  ListScheduler ls(g, m, nd, s);
  const size_t n = g.size();
  if (explain) s.finish_on.assign(n, std::vector<double>(static_cast<size_t>(nd), -1.0));
  const std::vector<std::vector<int>> cons = consumers_of(g);

  // Priorities: HEFT's upward rank (mean duration plus the longest path to an exit, copies
  // at their mean cost); the other policies keep graph order.
  std::vector<double> prio(n, 0.0);
  if (policy == PlacementPolicy::heft) {
    for (size_t v = n; v-- > 0;) {
      double w = 0;
      int k = 0;
      for (int d = 0; d < nd; ++d)
        if (allowed(g[v], d)) {
          w += m.node_seconds(g[v], d);
          ++k;
        }
      w /= std::max(k, 1);
      double tail = 0;
      for (int c : cons[v]) {
        double bytes = 0;
        for (const TaskInput& in : g[static_cast<size_t>(c)].inputs)
          if (in.producer == static_cast<int>(v)) bytes = std::max(bytes, in.bytes);
        double comm = 0;
        for (int d = 0; d < nd; ++d) comm += m.copy_seconds(bytes, d);
        comm *= static_cast<double>(nd - 1) / static_cast<double>(nd * nd);
        tail = std::max(tail, comm + prio[static_cast<size_t>(c)]);
      }
      prio[v] = w + tail;
    }
  } else {
    for (size_t v = 0; v < n; ++v) prio[v] = -static_cast<double>(v);
  }

  std::vector<int> pending(n, 0);
  for (size_t v = 0; v < n; ++v)
    for (const TaskInput& in : g[v].inputs)
      if (in.producer >= 0) ++pending[v];
  using Item = std::pair<double, int>;  // (priority, -index): highest first, then graph order
  std::priority_queue<Item> ready;
  for (size_t v = 0; v < n; ++v)
    if (pending[v] == 0) ready.emplace(prio[v], -static_cast<int>(v));

  while (!ready.empty()) {
    const int v = -ready.top().second;
    ready.pop();
    const TaskNode& node = g[static_cast<size_t>(v)];
    int best = -1;
    if (node.pin >= 0) {
      best = node.pin;
    } else if (node.view && !node.inputs.empty()) {
      // A view costs nothing where its input is; anywhere else it would cost a copy.
      const TaskInput& in = node.inputs[0];
      best = in.producer >= 0 ? ls.location(in) : 0;
      if (in.producer < 0 && !(in.present & 1u))
        for (int d = 0; d < nd; ++d)
          if ((in.present >> d) & 1u) {
            best = d;
            break;
          }
    } else if (policy == PlacementPolicy::pinned) {
      best = 0;
    } else {
      double best_t = kInf;
      for (int d = 0; d < nd; ++d) {
        if (!allowed(node, d)) continue;
        const double t = policy == PlacementPolicy::heft ? ls.eft(v, d) : ls.density_cost(v, d);
        if (t < best_t) {
          best_t = t;
          best = d;
        }
      }
    }
    if (explain)
      for (int d = 0; d < nd; ++d)
        if (allowed(node, d))
          s.finish_on[static_cast<size_t>(v)][static_cast<size_t>(d)] = ls.eft(v, d);
    ls.commit(v, best);
    for (int c : cons[static_cast<size_t>(v)])
      if (--pending[static_cast<size_t>(c)] == 0) ready.emplace(prio[static_cast<size_t>(c)], -c);
  }
  return s;
}

double makespan_lower_bound(const std::vector<TaskNode>& g, const DurationModel& m, int nd) {
  std::vector<double> path(g.size(), 0.0);
  double work = 0, cp = 0, work0 = 0;
  int slots = 0;
  for (int d = 0; d < nd; ++d) slots += std::max(1, m.workers(d));
  // ratio[d]: the least t(v, d) / t(v, 0) over nodes. Device d's workers, busy at most T each,
  // can do at most workers_d * T / ratio[d] of device-0 time, so
  // T >= (total device-0 time) / sum_d (workers_d / ratio[d]): the area bound for devices of
  // different speeds (exact when durations scale by a constant per device).
  std::vector<double> ratio(static_cast<size_t>(nd), kInf);
  for (size_t v = 0; v < g.size(); ++v) {
    double best = kInf;
    for (int d = 0; d < nd; ++d)
      if (allowed(g[v], d)) best = std::min(best, m.node_seconds(g[v], d));
    double before = 0;
    for (const TaskInput& in : g[v].inputs)
      if (in.producer >= 0) before = std::max(before, path[static_cast<size_t>(in.producer)]);
    path[v] = before + best;
    cp = std::max(cp, path[v]);
    work += best;
    const double t0 = m.node_seconds(g[v], 0);
    work0 += t0;
    if (t0 > 0)
      for (int d = 0; d < nd; ++d)
        ratio[static_cast<size_t>(d)] =
            std::min(ratio[static_cast<size_t>(d)], m.node_seconds(g[v], d) / t0);
  }
  double capacity = 0;
  for (int d = 0; d < nd; ++d)
    if (ratio[static_cast<size_t>(d)] > 0)
      capacity += std::max(1, m.workers(d)) / ratio[static_cast<size_t>(d)];
  const double area = capacity > 0 ? work0 / capacity : 0;
  // Devices sharing the host's cores: a node that can run only on them holds a core for at least
  // its least core time, and the cores are all there are.
  double core_work = 0;
  if (const int cores = m.shared_cores(); cores > 0) {
    for (const TaskNode& n : g) {
      double least = kInf;
      for (int d = 0; d < nd; ++d)
        if (allowed(n, d)) least = std::min(least, m.core_seconds(m.node_seconds(n, d), d));
      core_work += least;
    }
    core_work /= cores;
  }
  return std::max({cp, work / slots, area, core_work});
}

}  // namespace hetrain::runtime
