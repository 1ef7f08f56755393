#include "hetrain/runtime/eval.h"

#include <atomic>
#include <chrono>
#include <exception>
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

void eval(const std::vector<Tensor>& targets, bool release_graph) {
  const uint64_t mark = ++g_epoch;
  // Post-order DFS over unevaluated nodes: inputs come before their consumers.
  std::vector<Node*> order;
  std::vector<std::pair<Node*, size_t>> stack;
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
          if (!in->prim) fail("[eval] a tensor has neither data nor a producer (was it moved from?)");
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
  // Position of each node in order (stored in mark's place would clash; use a side table).
  std::vector<int> pending(n, 0);
  std::vector<std::vector<int>> consumers(n);
  {
    // Index nodes by reusing mark: give each node a unique mark value above the epoch.
    const uint64_t base = g_epoch.fetch_add(n + 1) + 1;
    for (size_t i = 0; i < n; ++i) order[i]->mark = base + i;
    for (size_t i = 0; i < n; ++i) {
      for (const auto& t : order[i]->inputs) {
        Node* in = t.node();
        if (in->mark >= base && in->mark < base + n && !in->evaluated()) {
          consumers[in->mark - base].push_back(static_cast<int>(i));
          ++pending[i];
        }
      }
    }
  }
  std::vector<int> ready;
  for (size_t i = 0; i < n; ++i)
    if (pending[i] == 0) ready.push_back(static_cast<int>(i));

  ThreadPool& pool = thread_pool();
  std::mutex mu;
  size_t remaining = n;
  int in_flight = 0;
  std::exception_ptr error;
  auto finish = [&](int i) {
    std::lock_guard<std::mutex> lk(mu);
    for (int c : consumers[i])
      if (--pending[c] == 0) ready.push_back(c);
    --remaining;
  };
  auto run = [&](int i) {
    try {
      run_node(order[i], release_graph);
    } catch (...) {
      std::lock_guard<std::mutex> lk(mu);
      if (!error) error = std::current_exception();
    }
    finish(i);
  };
  const int max_parallel = pool.size() - 1;
  for (;;) {
    int mine = -1;
    std::vector<int> extra;
    {
      std::lock_guard<std::mutex> lk(mu);
      if (error) {
        if (in_flight == 0) break;
      } else if (remaining == 0) {
        break;
      } else if (!ready.empty()) {
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
      pool.submit([&, e] {
        run(e);
        std::lock_guard<std::mutex> lk(mu);
        --in_flight;
      });
    }
    if (mine >= 0) {
      run(mine);
    } else {
      pool.help_until([&] {
        std::lock_guard<std::mutex> lk(mu);
        return !ready.empty() || remaining == 0 || (error && in_flight == 0);
      });
    }
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace hetrain
