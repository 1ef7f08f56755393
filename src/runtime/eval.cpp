#include "hetrain/runtime/eval.h"

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "hetrain/base/error.h"
#include "hetrain/base/thread_pool.h"
#include "hetrain/graph/primitive.h"
#include "hetrain/runtime/fusion.h"
#include "hetrain/runtime/perf_model.h"
#include "hetrain/runtime/scheduler.h"
#include "runtime/internal.h"
#if HETRAIN_HAVE_CUDA
#include "backends/cuda/api.h"
#endif

namespace hetrain {

namespace {
std::atomic<uint64_t> g_epoch{0};
std::atomic<int64_t> g_nodes_run{0};
std::atomic<int64_t> g_evals{0};
std::atomic<NodeObserver*> g_observer{nullptr};

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Nesting depth of node runs on this thread: an eval() inside a kernel runs inline.
thread_local int g_in_node = 0;

/// Coherence: the valid copies of an output are its array (on the device that produced it)
/// and the replicas whose source is still that array's buffer. Replicas are added by copy
/// tasks while other tasks read them, hence the lock.
std::mutex g_replica_mu;

bool replica_valid(const Replica& r, const Array& primary) {
  // An expired source locks to null: a freed buffer never matches, even at a reused address.
  return r.source.lock() == primary.buffer && r.source_offset == primary.offset;
}

/// The copy of output idx of p on device d, or nullptr (caller holds g_replica_mu).
const Array* valid_copy(const Node* p, int idx, Device d) {
  const Array& a = p->outs[static_cast<size_t>(idx)];
  if (a.device() == d) return &a;
  for (const Replica& r : p->replicas)
    if (r.index == idx && r.array.device() == d && replica_valid(r, a)) return &r.array;
  return nullptr;
}

/// Runs prim's kernel for device dev: eval_cpu on the CPU and sim devices (a sim device runs
/// CPU kernels on its own worker and memory node), eval_cuda on a CUDA device (the calling
/// thread is that device's worker, bound to it).
void run_kernel(const Primitive& prim, Device dev, const std::vector<const Array*>& in,
                const std::vector<Array*>& out) {
  switch (dev.kind) {
    case DeviceKind::cpu:
    case DeviceKind::sim:
      prim.eval_cpu(in, out);
      return;
    case DeviceKind::cuda:
#if HETRAIN_HAVE_CUDA
      cuda::bind_thread(dev.index);  // cheap when already current
      prim.eval_cuda(in, out);
      return;
#else
      fail("[", prim.name(), "] is placed on ", dev.str(), " but this build has no CUDA backend");
#endif
  }
}

/// Waits for a CUDA device's queued work (a no-op elsewhere).
void synchronize_device(Device d) {
#if HETRAIN_HAVE_CUDA
  if (d.kind == DeviceKind::cuda) cuda::synchronize(d.index);
#else
  (void)d;
#endif
}

/// Footprint and size (bytes in and out) of a node, for performance models.
std::pair<uint64_t, double> node_footprint(const Node* n) {
  std::vector<std::vector<int64_t>> shapes;
  double bytes = 0;
  for (const auto& t : n->inputs) {
    shapes.push_back(t.shape());
    bytes += static_cast<double>(numel(t.shape()) * static_cast<int64_t>(dtype_size(t.dtype())));
  }
  for (const auto& o : n->outs) {
    shapes.push_back(o.shape);
    shapes.back().push_back(static_cast<int64_t>(o.dtype) + 1000);
    bytes += static_cast<double>(o.nbytes());
  }
  return {runtime::shape_footprint(shapes), bytes};
}

/// Runs n's kernel on device dev (the executor already made its inputs present there). With
/// perf_class set, the kernel's time goes into the performance models under that class.
void run_node(Node* n, bool release_graph, Device dev = Device::cpu(), double slowdown = 1,
              bool placed = false, const std::string* perf_class = nullptr) {
  std::vector<const Array*> in;
  in.reserve(n->inputs.size());
  std::vector<Array> held;  // placed: the input copies, by value (replica lists may grow)
  if (!placed) {
    for (const auto& t : n->inputs) in.push_back(&t.node()->outs[t.index()]);
  } else {
    held.reserve(n->inputs.size());
    {
      std::lock_guard<std::mutex> lk(g_replica_mu);
      for (const auto& t : n->inputs) {
        const Array* a = valid_copy(t.node(), t.index(), dev);
        HT_ASSERT(a != nullptr);  // the scheduler inserted a copy task before this node
        held.push_back(*a);
      }
    }
    for (const Array& a : held) in.push_back(&a);
  }
  std::vector<Array*> out;
  out.reserve(n->outs.size());
  for (auto& o : n->outs) out.push_back(&o);
  NodeObserver* obs = g_observer.load(std::memory_order_relaxed);
  const bool timed = obs || slowdown > 1 || perf_class;
  int64_t t0 = timed ? now_ns() : 0;
  ++g_in_node;
  try {
    if (placed) {
      n->device = dev;
      AllocationDeviceScope alloc(dev);
      run_kernel(*n->prim, dev, in, out);
    } else if (n->device.kind == DeviceKind::cuda) {
      // A CUDA node outside placement (an eval nested in a kernel) still allocates on its GPU.
      AllocationDeviceScope alloc(n->device);
      run_kernel(*n->prim, n->device, in, out);
    } else {
      run_kernel(*n->prim, n->device, in, out);
    }
    // A CUDA kernel is only queued when eval_cuda returns; a measured time waits for it.
    if (timed) synchronize_device(n->device);
  } catch (...) {
    --g_in_node;
    throw;
  }
  --g_in_node;
  // A new value: copies of the old one (none for a fresh node) are no longer valid.
  if (placed && !n->replicas.empty()) {
    std::lock_guard<std::mutex> lk(g_replica_mu);
    n->replicas.clear();
  }
  if (slowdown > 1) {
    // A sim device's declared speed: the kernel takes slowdown times as long.
    const int64_t ran = now_ns() - t0;
    std::this_thread::sleep_for(
        std::chrono::nanoseconds(static_cast<int64_t>(static_cast<double>(ran) * (slowdown - 1))));
  }
  if (obs || perf_class) {
    const int64_t t1 = now_ns();
    if (obs) obs->on_node(*n, t0, t1);
    if (perf_class && !n->prim->is_view()) {
      const auto [fp, size] = node_footprint(n);
      runtime::perf_models().record(n->prim->name(), *perf_class, n->outs[0].dtype, fp, size,
                                    1e-9 * static_cast<double>(t1 - t0));
    }
  }
  // A node that no gradient will need forgets how it was made, so its inputs can be
  // freed as soon as their last consumer has run.
  if (!n->requires_grad || release_graph) {
    n->prim.reset();
    n->inputs.clear();
  }
}

/// Copies output idx of p to device dst (from its primary array) and records the replica.
void run_copy(Node* p, int idx, Device dst) {
  Array src;
  {
    std::lock_guard<std::mutex> lk(g_replica_mu);
    if (valid_copy(p, idx, dst)) return;  // already there (another eval made it)
    src = p->outs[static_cast<size_t>(idx)];
  }
  Replica r;
  r.index = idx;
  r.array = copy_to_device(src, dst);
  r.source = src.buffer;
  r.source_offset = src.offset;
  std::lock_guard<std::mutex> lk(g_replica_mu);
  // Drop stale copies of this output while here.
  std::erase_if(p->replicas, [&](const Replica& x) {
    return x.index == idx && !replica_valid(x, p->outs[static_cast<size_t>(idx)]);
  });
  p->replicas.push_back(std::move(r));
}

/// A sim or CUDA device's dedicated worker: one thread, its kernels serial, its allocations
/// in the device's memory node (a CUDA device's kernels queue on the device's stream). Never
/// destroyed (tasks may be queued at exit by static tensors).
class DeviceWorker {
 public:
  explicit DeviceWorker(Device d) : device_(d) {
    std::thread([this] { loop(); }).detach();
  }
  void submit(std::function<void()> task) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      queue_.push_back(std::move(task));
    }
    cv_.notify_one();
  }

 private:
  void loop() {
    SerialScope serial;
    AllocationDeviceScope alloc(device_);
    for (;;) {
      std::function<void()> task;
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [this] { return !queue_.empty(); });
        task = std::move(queue_.front());
        queue_.pop_front();
      }
      task();
    }
  }
  Device device_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
};

/// The worker of a sim or CUDA device.
DeviceWorker& device_worker(Device d) {
  static std::mutex mu;
  static std::array<DeviceWorker*, kMaxSimDevices> sim{};
  static std::array<DeviceWorker*, kMaxCudaDevices> cuda{};
  std::lock_guard<std::mutex> lk(mu);
  HT_ASSERT(d.index >= 0 &&
            d.index < (d.kind == DeviceKind::sim ? kMaxSimDevices : kMaxCudaDevices));
  auto& w = (d.kind == DeviceKind::sim ? sim.data() : cuda.data())[d.index];
  if (!w) w = new DeviceWorker(d);
  return *w;
}
}  // namespace

void set_node_observer(NodeObserver* obs) { g_observer.store(obs); }

ExecutorStats executor_stats() { return {g_nodes_run.load(), g_evals.load()}; }

namespace {
/// Per-call working memory of eval(), reused across calls: building it afresh for every
/// call cost more than running a small node (large vectors freed each call also made glibc
/// consolidate its free lists). eval() may nest (a kernel evaluating a subgraph), so each
/// level takes its own scratch from a per-thread free list.
struct EvalScratch {
  std::vector<Node*> order;
  std::vector<std::pair<Node*, size_t>> stack;
  std::vector<int> pending;
  std::vector<int> consumer_begin;  // consumers of node i: consumer_list[begin[i], begin[i+1])
  std::vector<int> consumer_list;
  std::vector<int> edges;  // (producer, consumer) pairs before grouping
  std::vector<int> ready;
};

class ScratchLease {
 public:
  ScratchLease() {
    if (free_list().empty()) {
      s_ = std::make_unique<EvalScratch>();
    } else {
      s_ = std::move(free_list().back());
      free_list().pop_back();
    }
  }
  ~ScratchLease() {
    // Keep the capacity of typical graphs, not of an occasional huge one.
    constexpr size_t kKeep = 1 << 20;
    if (s_->order.capacity() > kKeep || s_->edges.capacity() > 2 * kKeep) return;
    s_->order.clear();
    s_->stack.clear();
    s_->ready.clear();
    free_list().push_back(std::move(s_));
  }
  ScratchLease(const ScratchLease&) = delete;
  ScratchLease& operator=(const ScratchLease&) = delete;
  EvalScratch& operator*() { return *s_; }

 private:
  static std::vector<std::unique_ptr<EvalScratch>>& free_list() {
    thread_local std::vector<std::unique_ptr<EvalScratch>> l;
    return l;
  }
  std::unique_ptr<EvalScratch> s_;
};
}  // namespace

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

inline uint64_t mix(uint64_t h, uint64_t v) {
  return h ^ (v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2));
}

/// Bit d set when configured device d holds a valid copy of output idx of p.
uint32_t present_mask(const Node* p, int idx, const std::vector<runtime::DeviceModel>& devs) {
  uint32_t m = 0;
  std::lock_guard<std::mutex> lk(g_replica_mu);
  for (size_t d = 0; d < devs.size(); ++d)
    if (valid_copy(p, idx, devs[d].device)) m |= 1u << d;
  return m;
}

bool in_graph(const Node* p, uint64_t base, size_t n) {
  return p->mark >= base && p->mark < base + n && !p->evaluated();
}

/// The task graph placement works on: per node its cost, footprint, inputs and pin.
std::vector<runtime::TaskNode> task_graph(const std::vector<Node*>& order, uint64_t base,
                                          const std::vector<runtime::DeviceModel>& devs) {
  const size_t n = order.size();
  std::vector<runtime::TaskNode> g(n);
  std::unordered_map<const Node*, int> ext_ids;
  std::vector<TensorMeta> in_meta, out_meta;
  for (size_t i = 0; i < n; ++i) {
    const Node* nd = order[i];
    runtime::TaskNode& tn = g[i];
    in_meta.clear();
    out_meta.clear();
    for (const Tensor& t : nd->inputs) in_meta.push_back({t.shape(), t.dtype()});
    for (const Array& o : nd->outs) out_meta.push_back({o.shape, o.dtype});
    tn.name = nd->prim->name();
    tn.dtype = nd->outs[0].dtype;
    tn.view = nd->prim->is_view();
    if (!tn.view) {
      const Cost c = nd->prim->cost(in_meta, out_meta);
      tn.flops = c.flops;
      tn.bytes = c.bytes_read + c.bytes_written;
      const auto [fp, size] = node_footprint(nd);
      tn.footprint = fp;
      tn.size = size;
    }
    tn.pin = nd->pinned ? runtime::device_index(nd->device) : -1;
    // Devices without a kernel for this primitive (a CUDA device, for most ops without an
    // eval_cuda) are never chosen for it.
    for (size_t d = 0; d < devs.size(); ++d)
      if (!nd->prim->has_kernel(devs[d].device.kind)) tn.forbid |= 1u << d;
    for (const Tensor& t : nd->inputs) {
      const Node* p = t.node();
      runtime::TaskInput in;
      in.index = t.index();
      in.bytes = static_cast<double>(p->outs[static_cast<size_t>(t.index())].nbytes());
      if (in_graph(p, base, n)) {
        in.producer = static_cast<int>(p->mark - base);
      } else {
        in.present = present_mask(p, t.index(), devs);
        auto [it, fresh] = ext_ids.emplace(p, static_cast<int>(ext_ids.size()));
        in.external = it->second * 64 + t.index();
      }
      tn.inputs.push_back(in);
    }
  }
  return g;
}

/// The device (an index into the configured devices) of each node in order, from the plan
/// cached for this graph structure or a new placement. Nodes are marked base + position.
void plan_devices(const std::vector<Node*>& order, uint64_t base, std::vector<int>& dev) {
  const auto& cfg = runtime::config();
  const auto& devs = cfg.devices;
  const size_t n = order.size();
  // The structure: primitives, shapes, edges, pins and where outside data lives. Attributes
  // are left out: they change costs little and never correctness.
  uint64_t h = mix(devs.size(), static_cast<uint64_t>(cfg.placement));
  h = mix(h, runtime::perf_models().generation());
  for (size_t i = 0; i < n; ++i) {
    const Node* nd = order[i];
    h = mix(h, reinterpret_cast<uintptr_t>(nd->prim->name()));
    for (const Array& o : nd->outs) {
      h = mix(h, static_cast<uint64_t>(o.dtype));
      for (int64_t d : o.shape) h = mix(h, static_cast<uint64_t>(d));
    }
    if (nd->pinned) {
      const int d = runtime::device_index(nd->device);
      if (d < 0)
        fail("[", nd->prim->name(), "] is pinned to ", nd->device.str(),
             ", which is not among the configured devices (", runtime::configured_devices(),
             "); devices found: ", runtime::available_devices());
      h = mix(h, 1000 + static_cast<uint64_t>(d));
    }
    for (const Tensor& t : nd->inputs) {
      const Node* p = t.node();
      h = mix(h, in_graph(p, base, n) ? p->mark - base
                                      : (uint64_t{1} << 40 | present_mask(p, t.index(), devs)));
      h = mix(h, static_cast<uint64_t>(t.index()));
    }
  }
  PlanCache& cache = plan_cache();
  {
    std::lock_guard<std::mutex> lk(cache.mu);
    auto it = cache.plans.find(h);
    if (it != cache.plans.end() && it->second.size() == n) {
      dev = it->second;
      ++g_plan_hits;
      return;
    }
  }
  std::vector<runtime::TaskNode> g = task_graph(order, base, devs);
  runtime::CalibratedModel model(devs, runtime::perf_models());
  runtime::Schedule s = runtime::place(g, cfg.placement, model, static_cast<int>(devs.size()));
  dev = std::move(s.device);
  ++g_plans;
  std::lock_guard<std::mutex> lk(cache.mu);
  if (cache.plans.size() > 256) cache.plans.clear();
  cache.plans[h] = dev;
}

/// A copy of one output to one device, inserted between a producer and its consumers.
struct CopyTaskExec {
  Node* producer;
  int index;
  int device;  // configured device index
};
}  // namespace

namespace {
thread_local runtime::SimulationLog* g_sim = nullptr;
thread_local int64_t g_sim_mark_ns = 0;  // end of the last simulated eval (host time after it)

/// Simulate mode's eval: the same placement and list scheduler as a real run, no kernels.
void simulate_eval(const std::vector<Node*>& order, bool release_graph) {
  runtime::SimulationLog& log = *g_sim;
  const int64_t t_in = now_ns();
  const double host = 1e-9 * static_cast<double>(t_in - g_sim_mark_ns);
  log.host_s += host;
  log.clock += host;
  const auto& cfg = runtime::config();
  const auto& devs = cfg.devices;
  const size_t n = order.size();
  const uint64_t base = g_epoch.fetch_add(n + 1) + 1;
  for (size_t i = 0; i < n; ++i) order[i]->mark = base + i;
  for (const Node* nd : order)
    if (nd->pinned && runtime::device_index(nd->device) < 0)
      fail("[", nd->prim->name(), "] is pinned to ", nd->device.str(),
           ", which is not among the configured devices (", runtime::configured_devices(),
           "); devices found: ", runtime::available_devices());
  const std::vector<runtime::TaskNode> g = task_graph(order, base, devs);
  const runtime::CalibratedModel model(devs, runtime::perf_models());
  const runtime::Schedule s =
      runtime::place(g, cfg.placement, model, static_cast<int>(devs.size()), log.explain);
  log.busy.resize(devs.size(), 0.0);
  for (size_t d = 0; d < devs.size(); ++d) log.busy[d] += s.busy[d];
  log.bytes_moved += s.bytes_moved;
  log.lower_bound += runtime::makespan_lower_bound(g, model, static_cast<int>(devs.size()));
  log.copies += static_cast<int64_t>(s.copies.size());
  log.nodes += static_cast<int64_t>(n);
  ++log.evals;
  if (log.keep_tasks) {
    for (size_t i = 0; i < n; ++i) {
      runtime::SimTask t;
      t.name = g[i].name;
      t.device = s.device[i];
      t.start = log.clock + s.start[i];
      t.finish = log.clock + s.finish[i];
      t.flops = g[i].flops;
      t.bytes = g[i].bytes;
      const runtime::PerfEstimate e = model.estimate(g[i], s.device[i]);
      t.source = g[i].view ? "view" : e.trusted ? e.source : "roofline";
      if (log.explain) {
        t.finish_on = s.finish_on[i];
        for (double& f : t.finish_on)
          if (f >= 0) f += log.clock;
      }
      log.tasks.push_back(std::move(t));
    }
    for (const runtime::CopyTask& c : s.copies) {
      runtime::SimTask t;
      t.name = "copy";
      t.copy = true;
      t.device = c.device;
      t.start = log.clock + c.start;
      t.finish = log.clock + c.finish;
      t.bytes = c.bytes;
      log.tasks.push_back(std::move(t));
    }
  }
  log.clock += s.makespan;
  // Give every output memory on its device, and every input a (content-free) copy where its
  // consumer runs, so later evals see the same data locations as a real run.
  for (size_t i = 0; i < n; ++i) {
    Node* nd = order[i];
    const Device dev = devs[static_cast<size_t>(s.device[i])].device;
    std::vector<Array> held;
    for (const Tensor& t : nd->inputs) {
      Node* p = t.node();
      const Array* a = valid_copy(p, t.index(), dev);
      if (!a) {
        const Array& src = p->outs[static_cast<size_t>(t.index())];
        Replica r;
        r.index = t.index();
        r.array = src;
        r.array.buffer = allocator_for(dev).allocate(std::max<size_t>(src.buffer->bytes(), 1),
                                                     src.buffer->tag());
        r.source = src.buffer;
        r.source_offset = src.offset;
        p->replicas.push_back(std::move(r));
        a = &p->replicas.back().array;
      }
      held.push_back(*a);
    }
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
    nd->replicas.clear();
    if (!nd->requires_grad || release_graph) {
      nd->prim.reset();
      nd->inputs.clear();
    }
  }
  // Planning time is not host time of the run being simulated.
  g_sim_mark_ns = now_ns();
}
}  // namespace

namespace runtime {
SimulateScope::SimulateScope(SimulationLog& log) : prev_(g_sim) {
  g_sim = &log;
  g_sim_mark_ns = now_ns();
}
SimulateScope::~SimulateScope() { g_sim = prev_; }
}  // namespace runtime

namespace runtime {
void clear_plan_cache() {
  std::lock_guard<std::mutex> lk(plan_cache().mu);
  plan_cache().plans.clear();
}
SchedulerStats scheduler_stats() {
  return {g_plans.load(), g_plan_hits.load(), g_copy_tasks.load()};
}
}  // namespace runtime

void eval(const std::vector<Tensor>& targets, bool release_graph) {
  const uint64_t mark = ++g_epoch;
  ScratchLease lease;
  EvalScratch& sc = *lease;
  // Post-order DFS over unevaluated nodes: inputs come before their consumers.
  std::vector<Node*>& order = sc.order;
  auto& stack = sc.stack;
  bool any_pinned = false;
  for (const auto& t : targets) {
    Node* n = t.node();
    if (!n || n->evaluated() || n->mark == mark) continue;
    n->mark = mark;
    stack.emplace_back(n, 0);
    while (!stack.empty()) {
      auto& [cur, i] = stack.back();
      if (i < cur->inputs.size()) {
        Node* in = cur->inputs[i++].node();
        if (!in->evaluated() && in->mark != mark) {
          if (!in->prim)
            fail("[eval] a tensor has neither data nor a producer (was it moved from?)");
          in->mark = mark;
          stack.emplace_back(in, 0);
        }
      } else {
        any_pinned |= cur->pinned;
        order.push_back(cur);
        stack.pop_back();
      }
    }
  }
  if (order.empty()) return;
  if (runtime::fusion_enabled()) runtime::fuse_nodes(order);
  ++g_evals;
  g_nodes_run += static_cast<int64_t>(order.size());
  // Keep the targets' nodes alive; intermediates live as long as their consumers do.
  std::vector<std::shared_ptr<Node>> keep;
  keep.reserve(targets.size());
  for (const auto& t : targets) keep.push_back(t.node_ptr());

  if (g_sim && g_in_node == 0) {
    simulate_eval(order, release_graph);
    return;
  }
  // Placement and copies when more than the CPU is in play (configured devices, a pin, or
  // data living in another memory node). An eval() nested in a kernel runs inline.
  const bool placed =
      g_in_node == 0 && (runtime::heterogeneous() || any_pinned || device_memory_in_use() > 0);
  const size_t n = order.size();
  // Performance-model classes of the configured devices, when recording kernel times.
  std::vector<std::string> perf_class;
  if (runtime::perf_recording())
    for (const auto& m : runtime::config().devices) perf_class.push_back(runtime::device_class(m));
  if (n == 1 && !placed) {
    run_node(order[0], release_graph, Device::cpu(), 1, false,
             perf_class.empty() ? nullptr : &perf_class[0]);
    return;
  }
  // Dependency counts and consumer lists (CSR) over tasks: nodes [0, n), then copy tasks,
  // indexing nodes by a unique mark value.
  std::vector<int>& pending = sc.pending;
  std::vector<int>& cbegin = sc.consumer_begin;
  std::vector<int>& clist = sc.consumer_list;
  std::vector<int>& edges = sc.edges;
  std::vector<int> dev;              // placed: configured device index per node
  std::vector<CopyTaskExec> copies;  // placed: task n + k copies copies[k]
  std::vector<double> slowdown;      // placed: per configured device
  size_t total = n;
  edges.clear();
  {
    const uint64_t base = g_epoch.fetch_add(n + 1) + 1;
    for (size_t i = 0; i < n; ++i) order[i]->mark = base + i;
    if (!placed) {
      for (size_t i = 0; i < n; ++i) {
        for (const auto& t : order[i]->inputs) {
          Node* in = t.node();
          if (in_graph(in, base, n)) {
            edges.push_back(static_cast<int>(in->mark - base));
            edges.push_back(static_cast<int>(i));
          }
        }
      }
    } else {
      plan_devices(order, base, dev);
      const auto& devs = runtime::config().devices;
      for (const auto& m : devs) slowdown.push_back(m.slowdown);
      // One copy task per (data, destination): consumers on the same device share it.
      std::unordered_map<uint64_t, int> copy_of;
      auto copy_task = [&](Node* p, int idx, int d, bool& fresh) {
        const uint64_t key = mix(mix(reinterpret_cast<uintptr_t>(p), static_cast<uint64_t>(idx)),
                                 static_cast<uint64_t>(d));
        auto [it, ins] = copy_of.emplace(key, static_cast<int>(n + copies.size()));
        fresh = ins;
        if (ins) copies.push_back({p, idx, d});
        return it->second;
      };
      for (size_t i = 0; i < n; ++i) {
        const int d = dev[i];
        const Device target = devs[static_cast<size_t>(d)].device;
        for (const auto& t : order[i]->inputs) {
          Node* in = t.node();
          bool fresh = false;
          if (in_graph(in, base, n)) {
            const int p = static_cast<int>(in->mark - base);
            if (dev[static_cast<size_t>(p)] == d) {
              edges.push_back(p);
              edges.push_back(static_cast<int>(i));
              continue;
            }
            const int c = copy_task(in, t.index(), d, fresh);
            if (fresh) {  // prefetch: the copy runs as soon as its producer is done
              edges.push_back(p);
              edges.push_back(c);
            }
            edges.push_back(c);
            edges.push_back(static_cast<int>(i));
          } else {
            {
              std::lock_guard<std::mutex> lk(g_replica_mu);
              if (valid_copy(in, t.index(), target)) continue;
            }
            const int c = copy_task(in, t.index(), d, fresh);
            edges.push_back(c);
            edges.push_back(static_cast<int>(i));
          }
        }
      }
      total = n + copies.size();
      g_copy_tasks += static_cast<int64_t>(copies.size());
    }
    pending.assign(total, 0);
    cbegin.assign(total + 1, 0);
    for (size_t e = 0; e < edges.size(); e += 2) {
      ++cbegin[static_cast<size_t>(edges[e]) + 1];
      ++pending[static_cast<size_t>(edges[e + 1])];
    }
    for (size_t i = 0; i < total; ++i) cbegin[i + 1] += cbegin[i];
    clist.resize(edges.size() / 2);
    // Fill in order: each consumer list keeps its consumers in graph order.
    std::vector<int>& fill = sc.ready;  // borrowed as a cursor array, cleared below
    fill.assign(cbegin.begin(), cbegin.end() - 1);
    for (size_t e = 0; e < edges.size(); e += 2)
      clist[static_cast<size_t>(fill[static_cast<size_t>(edges[e])]++)] = edges[e + 1];
  }
  std::vector<int>& ready = sc.ready;
  ready.clear();
  for (size_t i = 0; i < total; ++i)
    if (pending[i] == 0) ready.push_back(static_cast<int>(i));

  ThreadPool& pool = thread_pool();
  std::mutex mu;
  size_t remaining = total;
  int in_flight = 0;      // tasks on pool workers
  int sim_in_flight = 0;  // tasks on sim and CUDA devices' workers
  std::exception_ptr error;
  std::condition_variable done_cv;  // placed: a task finished (the main thread may sleep)
  enum Runner { kMain, kPool, kSim };
  // A task run by a pool or device worker counts as in flight until finish() (under the lock)
  // says it is done, so eval() never returns while a task still touches this frame.
  auto finish = [&](int i, Runner who) {
    std::lock_guard<std::mutex> lk(mu);
    if (who == kPool) --in_flight;
    if (who == kSim) --sim_in_flight;
    for (int k = cbegin[static_cast<size_t>(i)]; k < cbegin[static_cast<size_t>(i) + 1]; ++k) {
      const int c = clist[static_cast<size_t>(k)];
      if (--pending[static_cast<size_t>(c)] == 0) ready.push_back(c);
    }
    --remaining;
    if (placed) done_cv.notify_one();
  };
  const auto& devs = runtime::config().devices;
  auto run = [&](int i, Runner who) {
    try {
      if (!placed) {
        run_node(order[static_cast<size_t>(i)], release_graph, Device::cpu(), 1, false,
                 perf_class.empty() ? nullptr : &perf_class[0]);
      } else if (static_cast<size_t>(i) < n) {
        const size_t d = static_cast<size_t>(dev[static_cast<size_t>(i)]);
        run_node(order[static_cast<size_t>(i)], release_graph, devs[d].device, slowdown[d], true,
                 perf_class.empty() ? nullptr : &perf_class[d]);
      } else {
        const CopyTaskExec& c = copies[static_cast<size_t>(i) - n];
        run_copy(c.producer, c.index, devs[static_cast<size_t>(c.device)].device);
      }
    } catch (...) {
      std::lock_guard<std::mutex> lk(mu);
      if (!error) error = std::current_exception();
    }
    finish(i, who);
  };
  // Whether task i runs on a device worker (a node on a sim or CUDA device); the CPU's
  // workers run nodes on the CPU and all copies.
  auto on_worker = [&](int i) -> bool {
    if (!placed || static_cast<size_t>(i) >= n) return false;
    return devs[static_cast<size_t>(dev[static_cast<size_t>(i)])].device.kind != DeviceKind::cpu;
  };
  auto worker_of = [&](int i) -> DeviceWorker& {
    return device_worker(devs[static_cast<size_t>(dev[static_cast<size_t>(i)])].device);
  };
  // Under the lock: nothing left in flight and nothing more to run.
  auto all_done = [&] { return in_flight == 0 && sim_in_flight == 0 && (error || remaining == 0); };
  const int max_parallel = pool.size() - 1;
  std::vector<int> extra, to_sim;
  for (;;) {
    int mine = -1;
    extra.clear();
    to_sim.clear();
    {
      std::lock_guard<std::mutex> lk(mu);
      if (all_done()) break;
      if (!error && placed) {
        // Sim and CUDA devices' tasks go to their own workers.
        size_t keep_n = 0;
        for (int r : ready) {
          if (on_worker(r))
            to_sim.push_back(r);
          else
            ready[keep_n++] = r;
        }
        ready.resize(keep_n);
        sim_in_flight += static_cast<int>(to_sim.size());
      }
      if (!error && !ready.empty()) {
        mine = ready.back();
        ready.pop_back();
        // Independent ready nodes go to idle workers (inter-op parallelism).
        while (!ready.empty() && in_flight + static_cast<int>(extra.size()) < max_parallel) {
          extra.push_back(ready.back());
          ready.pop_back();
        }
        in_flight += static_cast<int>(extra.size());
      }
    }
    for (int e : to_sim) worker_of(e).submit([&, e] { run(e, kSim); });
    for (int e : extra) {
      pool.submit([&, e] { run(e, kPool); });
    }
    if (mine >= 0) {
      run(mine, kMain);
    } else if (!to_sim.empty()) {
      continue;
    } else if (!placed) {
      pool.help_until([&] {
        std::lock_guard<std::mutex> lk(mu);
        return (!error && !ready.empty()) || all_done();
      });
    } else {
      // Help the pool while it has work; otherwise sleep until a task finishes (the sim
      // devices' workers need the cores more than a spinning main thread does).
      int spins = 0;
      bool go = false;
      pool.help_until([&] {
        std::lock_guard<std::mutex> lk(mu);
        go = (!error && !ready.empty()) || all_done();
        return go || ++spins > 64;
      });
      if (!go) {
        std::unique_lock<std::mutex> lk(mu);
        done_cv.wait_for(lk, std::chrono::microseconds(200),
                         [&] { return (!error && !ready.empty()) || all_done(); });
      }
    }
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace hetrain
