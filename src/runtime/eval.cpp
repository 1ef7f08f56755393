#include "hetrain/runtime/eval.h"

#include <atomic>
#include <chrono>
#include <exception>
#include <memory>
#include <mutex>

#include "hetrain/base/error.h"
#include "hetrain/base/thread_pool.h"
#include "hetrain/graph/primitive.h"

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

void run_node(Node* n, bool release_graph) {
  std::vector<const Array*> in;
  in.reserve(n->inputs.size());
  for (const auto& t : n->inputs) in.push_back(&t.node()->outs[t.index()]);
  std::vector<Array*> out;
  out.reserve(n->outs.size());
  for (auto& o : n->outs) out.push_back(&o);
  NodeObserver* obs = g_observer.load(std::memory_order_relaxed);
  int64_t t0 = obs ? now_ns() : 0;
  switch (n->device.kind) {
    case DeviceKind::cpu:
    case DeviceKind::sim: n->prim->eval_cpu(in, out); break;
    case DeviceKind::cuda: fail("[", n->prim->name(), "] no CUDA backend in this build");
  }
  if (obs) obs->on_node(*n, t0, now_ns());
  // A node that no gradient will need forgets how it was made, so its inputs can be
  // freed as soon as their last consumer has run.
  if (!n->requires_grad || release_graph) {
    n->prim.reset();
    n->inputs.clear();
  }
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

void eval(const std::vector<Tensor>& targets, bool release_graph) {
  const uint64_t mark = ++g_epoch;
  ScratchLease lease;
  EvalScratch& sc = *lease;
  // Post-order DFS over unevaluated nodes: inputs come before their consumers.
  std::vector<Node*>& order = sc.order;
  auto& stack = sc.stack;
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
        order.push_back(cur);
        stack.pop_back();
      }
    }
  }
  if (order.empty()) return;
  ++g_evals;
  g_nodes_run += static_cast<int64_t>(order.size());
  // Keep the targets' nodes alive; intermediates live as long as their consumers do.
  std::vector<std::shared_ptr<Node>> keep;
  keep.reserve(targets.size());
  for (const auto& t : targets) keep.push_back(t.node_ptr());

  const size_t n = order.size();
  if (n == 1) {
    run_node(order[0], release_graph);
    return;
  }
  // Dependency counts and consumer lists (CSR), indexing nodes by a unique mark value.
  std::vector<int>& pending = sc.pending;
  std::vector<int>& cbegin = sc.consumer_begin;
  std::vector<int>& clist = sc.consumer_list;
  std::vector<int>& edges = sc.edges;
  pending.assign(n, 0);
  cbegin.assign(n + 1, 0);
  edges.clear();
  {
    const uint64_t base = g_epoch.fetch_add(n + 1) + 1;
    for (size_t i = 0; i < n; ++i) order[i]->mark = base + i;
    for (size_t i = 0; i < n; ++i) {
      for (const auto& t : order[i]->inputs) {
        Node* in = t.node();
        if (in->mark >= base && in->mark < base + n && !in->evaluated()) {
          const int p = static_cast<int>(in->mark - base);
          edges.push_back(p);
          edges.push_back(static_cast<int>(i));
          ++cbegin[static_cast<size_t>(p) + 1];
          ++pending[i];
        }
      }
    }
    for (size_t i = 0; i < n; ++i) cbegin[i + 1] += cbegin[i];
    clist.resize(edges.size() / 2);
    // Fill in order: each consumer list keeps its consumers in graph order.
    std::vector<int>& fill = sc.ready;  // borrowed as a cursor array, cleared below
    fill.assign(cbegin.begin(), cbegin.end() - 1);
    for (size_t e = 0; e < edges.size(); e += 2)
      clist[static_cast<size_t>(fill[static_cast<size_t>(edges[e])]++)] = edges[e + 1];
  }
  std::vector<int>& ready = sc.ready;
  ready.clear();
  for (size_t i = 0; i < n; ++i)
    if (pending[i] == 0) ready.push_back(static_cast<int>(i));

  ThreadPool& pool = thread_pool();
  std::mutex mu;
  size_t remaining = n;
  int in_flight = 0;
  std::exception_ptr error;
  // A node run by a pool task counts as in flight until finish() (under the lock) says it
  // is done, so eval() never returns while a task still touches this frame.
  auto finish = [&](int i, bool task) {
    std::lock_guard<std::mutex> lk(mu);
    if (task) --in_flight;
    for (int k = cbegin[static_cast<size_t>(i)]; k < cbegin[static_cast<size_t>(i) + 1]; ++k) {
      const int c = clist[static_cast<size_t>(k)];
      if (--pending[static_cast<size_t>(c)] == 0) ready.push_back(c);
    }
    --remaining;
  };
  auto run = [&](int i, bool task) {
    try {
      run_node(order[i], release_graph);
    } catch (...) {
      std::lock_guard<std::mutex> lk(mu);
      if (!error) error = std::current_exception();
    }
    finish(i, task);
  };
  const int max_parallel = pool.size() - 1;
  for (;;) {
    int mine = -1;
    std::vector<int> extra;
    {
      std::lock_guard<std::mutex> lk(mu);
      if (in_flight == 0 && (error || remaining == 0)) break;
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
    for (int e : extra) {
      pool.submit([&, e] { run(e, true); });
    }
    if (mine >= 0) {
      run(mine, false);
    } else {
      pool.help_until([&] {
        std::lock_guard<std::mutex> lk(mu);
        return (!error && !ready.empty()) || (in_flight == 0 && (error || remaining == 0));
      });
    }
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace hetrain
