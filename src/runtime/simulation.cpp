// Simulate mode: the same placement and list scheduler as a real run, durations from the
// performance models and no kernel run; memory is still allocated where outputs would live, so
// later evals see the data locations of a real run.
#include "hetrain/base/error.h"
#include "hetrain/graph/primitive.h"
#include "hetrain/runtime/perf_model.h"
#include "runtime/internal.h"

namespace hetrain::runtime {

namespace {

thread_local SimulationLog* g_sim = nullptr;
thread_local int64_t g_sim_mark_ns = 0;  // end of the last simulated eval (host time after it)

/// Adds the simulated tasks (nodes, then copies) to the log's task list.
void keep_tasks(SimulationLog& log, const std::vector<TaskNode>& g, const Schedule& s,
                const CalibratedModel& model) {
  for (size_t i = 0; i < g.size(); ++i) {
    SimTask t;
    t.name = g[i].name;
    t.device = s.device[i];
    t.start = log.clock + s.start[i];
    t.finish = log.clock + s.finish[i];
    t.flops = g[i].flops;
    t.bytes = g[i].bytes;
    const PerfEstimate e = model.estimate(g[i], s.device[i]);
    t.source = g[i].view ? "view" : e.trusted ? e.source : "roofline";
    if (log.explain) {
      t.finish_on = s.finish_on[i];
      for (double& f : t.finish_on)
        if (f >= 0) f += log.clock;
    }
    log.tasks.push_back(std::move(t));
  }
  for (const CopyTask& c : s.copies) {
    SimTask t;
    t.name = "copy";
    t.copy = true;
    t.device = c.device;
    t.start = log.clock + c.start;
    t.finish = log.clock + c.finish;
    t.bytes = c.bytes;
    log.tasks.push_back(std::move(t));
  }
}

}  // namespace

bool simulating() { return g_sim != nullptr; }

void simulate_eval(const std::vector<Node*>& order, bool release_graph) {
  SimulationLog& log = *g_sim;
  const int64_t t_in = now_ns();
  const double host = 1e-9 * static_cast<double>(t_in - g_sim_mark_ns);
  log.host_s += host;
  log.clock += host;
  const auto& cfg = config();
  const auto& devs = cfg.devices;
  const size_t n = order.size();
  OrderIndex index;
  index.assign(order);
  for (const Node* nd : order) check_pin(*nd);
  const std::vector<TaskNode> g = task_graph(order, index, devs);
  const CalibratedModel model(devs, perf_models());
  const Schedule s = place(g, cfg.placement, model, static_cast<int>(devs.size()), log.explain);
  log.busy.resize(devs.size(), 0.0);
  for (size_t d = 0; d < devs.size(); ++d) log.busy[d] += s.busy[d];
  log.bytes_moved += s.bytes_moved;
  log.lower_bound += makespan_lower_bound(g, model, static_cast<int>(devs.size()));
  log.copies += static_cast<int64_t>(s.copies.size());
  log.nodes += static_cast<int64_t>(n);
  ++log.evals;
  if (log.keep_tasks) keep_tasks(log, g, s, model);
  log.clock += s.makespan;
  // Give every output memory on its device, and every input a (content-free) copy where its
  // consumer runs, so later evals see the same data locations as a real run.
  for (size_t i = 0; i < n; ++i) {
    Node* nd = order[i];
    const Device dev = devs[static_cast<size_t>(s.device[i])].device;
    std::vector<Array> held;
    for (const Tensor& t : nd->inputs) held.push_back(placeholder_copy(t.node(), t.index(), dev));
    nd->device = dev;
    AllocationDeviceScope alloc(dev);
    if (nd->prim->is_view()) {
      // Views only set strides: cheap, and later nodes need their layout.
      std::vector<const Array*> in;
      for (const Array& a : held) in.push_back(&a);
      std::vector<Array*> out;
      for (auto& o : nd->outs) out.push_back(&o);
      nd->prim->eval_cpu(in, out);
    } else {
      for (Array& o : nd->outs) o.allocate();
    }
    drop_replicas(nd);
    if (!nd->requires_grad || release_graph) {
      nd->prim.reset();
      nd->inputs.clear();
    }
  }
  // Planning time is not host time of the run being simulated.
  g_sim_mark_ns = now_ns();
}

SimulateScope::SimulateScope(SimulationLog& log) : prev_(g_sim) {
  g_sim = &log;
  g_sim_mark_ns = now_ns();
}
SimulateScope::~SimulateScope() { g_sim = prev_; }

SimulatePause::SimulatePause() : prev_(g_sim) { g_sim = nullptr; }
SimulatePause::~SimulatePause() { g_sim = prev_; }

}  // namespace hetrain::runtime
