// The executor: eval() collects the nodes its targets need, runs the fusion pass, and runs the
// nodes as tasks, in dependency order: the CPU's one at a time, each kernel on the thread
// pool's team, and, in placed runs, the others on the sim and CUDA devices' workers, with
// copies between memory nodes.
#include <algorithm>
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

#include "hetrain/base/error.h"
#include "hetrain/base/thread_pool.h"
#include "hetrain/graph/primitive.h"
#include "hetrain/runtime/eval.h"
#include "hetrain/runtime/fusion.h"
#include "hetrain/runtime/perf_model.h"
#include "hetrain/runtime/scheduler.h"
#include "runtime/internal.h"
#if HETRAIN_HAVE_CUDA
#include "backends/cuda/api.h"
#endif

namespace hetrain {

namespace runtime {

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace runtime

namespace {
using runtime::now_ns;

std::atomic<int64_t> g_nodes_run{0};
std::atomic<int64_t> g_evals{0};
constexpr size_t kMaxObservers = 4;
using Observers = std::array<NodeObserver*, kMaxObservers>;
std::array<std::atomic<NodeObserver*>, kMaxObservers> g_observers{};
std::mutex g_observers_mu;  // add/remove; node runs read the slots without it
std::atomic<EvalHook*> g_eval_hook{nullptr};

// Nesting depth of node runs on this thread: an eval() inside a kernel runs inline.
thread_local int g_in_node = 0;

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

/// After a node ran: its time to the observer and the performance models.
void record_node(Node* n, int64_t t0, const Observers& obs, const std::string* perf_class) {
  const int64_t t1 = now_ns();
  for (NodeObserver* o : obs)
    if (o) o->on_node(*n, t0, t1);
  if (perf_class && !n->prim->is_view()) {
    const auto [fp, size] = runtime::node_footprint(n);
    runtime::perf_models().record(n->prim->name(), *perf_class, n->outs[0].dtype, fp, size,
                                  1e-9 * static_cast<double>(t1 - t0));
  }
}

/// Runs n's kernel on device dev (the executor already made its inputs present there). With
/// perf_class set, the kernel's time goes into the performance models under that class.
void run_node(Node* n, bool release_graph, Device dev = Device::cpu(), double slowdown = 1,
              bool placed = false, const std::string* perf_class = nullptr) {
  std::vector<const Array*> in;
  in.reserve(n->inputs.size());
  std::vector<Array> held;  // placed: the input copies, by value (replica lists may grow)
  if (!placed) {
    for (const auto& t : n->inputs) {
      const Node* p = t.node();
      if (p->sharded && !p->outs[0].has_data())
        fail("[", n->prim->name(), "] reads a sharded parameter ", shape_str(t.shape()),
             " that no gather gave data (an eval inside a kernel, or no ZeRO-3 hook installed)");
      in.push_back(&p->outs[t.index()]);
    }
  } else {
    held = runtime::input_copies(*n, dev);
    for (const Array& a : held) in.push_back(&a);
  }
  std::vector<Array*> out;
  out.reserve(n->outs.size());
  for (auto& o : n->outs) out.push_back(&o);
  Observers obs{};
  bool observed = false;
  for (size_t i = 0; i < kMaxObservers; ++i) {
    obs[i] = g_observers[i].load(std::memory_order_acquire);
    observed = observed || obs[i];
  }
  const bool timed = observed || slowdown > 1 || perf_class;
  int64_t t0 = timed ? now_ns() : 0;
  ++g_in_node;
  try {
    AllocationSiteScope site(n->prim->name());  // names the op in an out-of-memory error
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
  if (placed) runtime::drop_replicas(n);
  if (slowdown > 1) {
    // A sim device's declared speed: the kernel takes slowdown times as long.
    const int64_t ran = now_ns() - t0;
    std::this_thread::sleep_for(
        std::chrono::nanoseconds(static_cast<int64_t>(static_cast<double>(ran) * (slowdown - 1))));
  }
  if (observed || perf_class) record_node(n, t0, obs, perf_class);
  // A node that no gradient will need forgets how it was made, so its inputs can be
  // freed as soon as their last consumer has run.
  if (!n->requires_grad || release_graph) {
    n->prim.reset();
    n->inputs.clear();
  }
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

/// Per-call working memory of eval(), reused across calls: building it afresh for every
/// call cost more than running a small node (large vectors freed each call also made glibc
/// consolidate its free lists). eval() may nest (a kernel evaluating a subgraph), so each
/// level takes its own scratch from a per-thread free list.
struct EvalScratch {
  std::vector<Node*> order;
  std::vector<std::pair<Node*, size_t>> stack;
  runtime::OrderIndex index;
  runtime::TaskDeps deps;
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
    if (s_->order.capacity() > kKeep || s_->deps.edges.capacity() > 2 * kKeep) return;
    s_->order.clear();
    s_->stack.clear();
    s_->index.clear();
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

/// One eval's tasks run to completion: the calling thread runs the CPU's ready tasks one at a
/// time, each kernel on the pool's whole team (base/thread_pool.h: nodes side by side on pool
/// threads of their own spun against the team of oneDNN's calls), and, in placed runs, hands
/// the sim and CUDA devices' tasks to their workers. The first error is rethrown once nothing is
/// in flight.
class TaskRun {
 public:
  /// device: the configured device of each node (placed runs), else null.
  TaskRun(const std::vector<Node*>& order, runtime::TaskDeps& deps, std::vector<int>& ready,
          const std::vector<int>* device, bool release_graph,
          const std::vector<std::string>& perf_class, EvalRun* hook)
      : order_(order),
        deps_(deps),
        ready_(ready),
        device_(device),
        release_graph_(release_graph),
        perf_class_(perf_class),
        hook_(hook),
        devs_(runtime::config().devices),
        remaining_(deps.total) {
    for (const auto& m : devs_) slowdown_.push_back(m.slowdown);
    device_busy_.assign(devs_.size(), 0);
    ready_.clear();
    for (size_t i = 0; i < deps.total; ++i)
      if (deps.pending[i] == 0) ready_.push_back(static_cast<int>(i));
  }

  void run_all();

 private:
  enum Runner { kMain, kDeviceWorker };

  bool placed() const { return device_ != nullptr; }
  size_t nodes() const { return order_.size(); }
  int device_of(int i) const { return (*device_)[static_cast<size_t>(i)]; }
  // Whether task i runs on a device worker (a node on a sim or CUDA device); the CPU's
  // workers run nodes on the CPU and all copies.
  bool on_device_worker(int i) const {
    if (!placed() || static_cast<size_t>(i) >= nodes()) return false;
    return devs_[static_cast<size_t>(device_of(i))].device.kind != DeviceKind::cpu;
  }
  // Under the lock: nothing left in flight and nothing more to run.
  bool all_done() const { return on_devices_ == 0 && (error_ || remaining_ == 0); }
  bool can_go() const { return (!error_ && !ready_.empty()) || all_done(); }
  void run(int i, Runner who);
  void finish(int i, Runner who);
  void wait_for_work();
  // Under the lock: moves the ready device tasks to to_devices (under a hook, one per device
  // at a time, the earliest in plan order; the others wait in held_).
  void take_device_tasks(std::vector<int>& to_devices);

  const std::vector<Node*>& order_;
  runtime::TaskDeps& deps_;
  std::vector<int>& ready_;
  const std::vector<int>* device_;
  const bool release_graph_;
  const std::vector<std::string>& perf_class_;
  EvalRun* hook_;  // the eval hook's run (ZeRO-3 gathers), or null
  const std::vector<runtime::DeviceModel>& devs_;
  std::vector<double> slowdown_;  // per configured device
  std::mutex mu_;
  std::condition_variable done_cv_;  // a device's task finished (the main thread may sleep)
  size_t remaining_;
  int on_devices_ = 0;            // tasks on sim and CUDA devices' workers
  std::vector<int> device_busy_;  // under a hook: per configured device, tasks on its worker
  std::vector<int> held_;         // under a hook: ready device tasks waiting for their device
  std::exception_ptr error_;
};

void TaskRun::take_device_tasks(std::vector<int>& to_devices) {
  // Under an eval hook (ZeRO-3 gathers) a device's worker gets one task at a time, the earliest
  // ready one in plan order, as the CPU's ready nodes below: a queue filled with every ready
  // node (a parameter's transpose is ready early) would pull their gathers ahead and hold
  // more gathered buckets on the device.
  if (hook_) std::sort(ready_.begin(), ready_.end());
  size_t keep_n = 0;
  for (int r : ready_) {
    if (!on_device_worker(r)) {
      ready_[keep_n++] = r;
    } else if (hook_ && device_busy_[static_cast<size_t>(device_of(r))] > 0) {
      held_.push_back(r);
    } else {
      if (hook_) ++device_busy_[static_cast<size_t>(device_of(r))];
      to_devices.push_back(r);
    }
  }
  ready_.resize(keep_n);
  on_devices_ += static_cast<int>(to_devices.size());
}

// A task run by a device worker counts as in flight until finish() (under the lock)
// says it is done, so eval() never returns while a task still touches this frame.
void TaskRun::finish(int i, Runner who) {
  std::lock_guard<std::mutex> lk(mu_);
  if (who == kDeviceWorker) --on_devices_;
  if (who == kDeviceWorker && hook_) {
    // The device is free: its earliest held task is ready again.
    const int d = device_of(i);
    --device_busy_[static_cast<size_t>(d)];
    auto next = held_.end();
    for (auto it = held_.begin(); it != held_.end(); ++it)
      if (device_of(*it) == d && (next == held_.end() || *it < *next)) next = it;
    if (next != held_.end()) {
      ready_.push_back(*next);
      held_.erase(next);
    }
  }
  const auto& begin = deps_.consumer_begin;
  for (int k = begin[static_cast<size_t>(i)]; k < begin[static_cast<size_t>(i) + 1]; ++k) {
    const int c = deps_.consumer_list[static_cast<size_t>(k)];
    if (--deps_.pending[static_cast<size_t>(c)] == 0) ready_.push_back(c);
  }
  --remaining_;
  if (who == kDeviceWorker) done_cv_.notify_one();
}

void TaskRun::run(int i, Runner who) {
  try {
    const auto ui = static_cast<size_t>(i);
    if (hook_ && ui < nodes()) hook_->before_node(ui);
    if (!placed()) {
      run_node(order_[ui], release_graph_, Device::cpu(), 1, false,
               perf_class_.empty() ? nullptr : &perf_class_[0]);
    } else if (static_cast<size_t>(i) < nodes()) {
      const size_t d = static_cast<size_t>(device_of(i));
      run_node(order_[static_cast<size_t>(i)], release_graph_, devs_[d].device, slowdown_[d], true,
               perf_class_.empty() ? nullptr : &perf_class_[d]);
    } else {
      const runtime::CopyTaskExec& c = deps_.copies[static_cast<size_t>(i) - nodes()];
      runtime::run_copy(c.producer, c.index, devs_[static_cast<size_t>(c.device)].device);
    }
    if (hook_ && ui < nodes()) hook_->after_node(ui);
  } catch (...) {
    std::lock_guard<std::mutex> lk(mu_);
    if (!error_) error_ = std::current_exception();
  }
  finish(i, who);
}

// Nothing ready for the calling thread: the devices' workers are running. Spin briefly (their
// tasks are often short), then sleep until one finishes.
void TaskRun::wait_for_work() {
  for (int spins = 0; spins < 64; ++spins) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (can_go()) return;
    }
    std::this_thread::yield();
  }
  std::unique_lock<std::mutex> lk(mu_);
  done_cv_.wait(lk, [&] { return can_go(); });
}

void TaskRun::run_all() {
  std::vector<int> to_devices;
  for (;;) {
    int mine = -1;
    to_devices.clear();
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (all_done()) break;
      // Sim and CUDA devices' tasks go to their own workers.
      if (!error_ && placed()) take_device_tasks(to_devices);
      if (!error_ && !ready_.empty()) {
        // Under an eval hook (ZeRO-3 gathers) the ready nodes run in plan order, earliest
        // first: a node ready early (a parameter's transpose) must not pull every gather ahead.
        if (hook_) std::sort(ready_.begin(), ready_.end(), std::greater<int>());
        mine = ready_.back();
        ready_.pop_back();
      }
    }
    for (int e : to_devices)
      device_worker(devs_[static_cast<size_t>(device_of(e))].device).submit([this, e] {
        run(e, kDeviceWorker);
      });
    if (mine >= 0)
      run(mine, kMain);
    else if (to_devices.empty())
      wait_for_work();
  }
  if (error_) std::rethrow_exception(error_);
}

}  // namespace

void add_node_observer(NodeObserver* obs) {
  std::lock_guard<std::mutex> lk(g_observers_mu);
  for (auto& slot : g_observers)
    if (slot.load() == nullptr) {
      slot.store(obs, std::memory_order_release);
      return;
    }
  fail("[eval] more than ", kMaxObservers, " node observers");
}

void remove_node_observer(NodeObserver* obs) {
  std::lock_guard<std::mutex> lk(g_observers_mu);
  for (auto& slot : g_observers)
    if (slot.load() == obs) slot.store(nullptr, std::memory_order_release);
}

void set_eval_hook(EvalHook* hook) {
  EvalHook* expected = nullptr;
  if (hook && !g_eval_hook.compare_exchange_strong(expected, hook))
    fail("[eval] an eval hook is already installed");
  if (!hook) g_eval_hook.store(nullptr);
}

ExecutorStats executor_stats() { return {g_nodes_run.load(), g_evals.load()}; }

void eval(const std::vector<Tensor>& targets, bool release_graph) {
  ScratchLease lease;
  EvalScratch& sc = *lease;
  std::vector<Node*>& order = sc.order;
  bool any_pinned = false;
  runtime::collect_order(targets, sc.index, order, sc.stack, &any_pinned);
  if (order.empty()) return;
  if (runtime::fusion_enabled()) runtime::fuse_nodes(order);
  ++g_evals;
  g_nodes_run += static_cast<int64_t>(order.size());
  // Keep the targets' nodes alive; intermediates live as long as their consumers do.
  std::vector<std::shared_ptr<Node>> keep;
  keep.reserve(targets.size());
  for (const auto& t : targets) keep.push_back(t.node_ptr());

  if (runtime::simulating() && g_in_node == 0) {
    runtime::simulate_eval(order, release_graph);
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
  // The hook's run ends (waiting for what it started) before the scratch goes back.
  EvalHook* hook = g_in_node == 0 ? g_eval_hook.load() : nullptr;
  const std::unique_ptr<EvalRun> hook_run = hook ? hook->begin(order) : nullptr;
  if (n == 1 && !placed) {
    if (hook_run) hook_run->before_node(0);
    run_node(order[0], release_graph, Device::cpu(), 1, false,
             perf_class.empty() ? nullptr : &perf_class[0]);
    if (hook_run) hook_run->after_node(0);
    return;
  }
  // Tasks: nodes [0, n) by their position in the order, then copy tasks.
  sc.index.assign(order);
  std::vector<int> device;  // placed: configured device index per node
  if (placed) runtime::plan_devices(order, sc.index, device);
  runtime::build_tasks(order, sc.index, placed ? &device : nullptr, sc.deps);
  TaskRun(order, sc.deps, sc.ready, placed ? &device : nullptr, release_graph, perf_class,
          hook_run.get())
      .run_all();
}

}  // namespace hetrain
