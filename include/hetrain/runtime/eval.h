// The executor: evaluates the nodes the targets depend on, in dependency order, running
// independent nodes concurrently on the thread pool and freeing each intermediate buffer
// after its last use.
#pragma once

#include <memory>
#include <vector>

#include "hetrain/graph/tensor.h"

namespace hetrain {

// eval(targets, release_graph), the executor's entry point, is declared with Tensor
// (hetrain/graph/tensor.h): a tensor asks for its value there, and the runtime defines it.

struct ExecutorStats {
  int64_t nodes_run = 0;
  int64_t evals = 0;
};
ExecutorStats executor_stats();

/// Observes each executed node (the profiler's hook). Called on the worker thread right
/// after the node's kernel returns, with start and end in steady-clock nanoseconds.
class NodeObserver {
 public:
  virtual ~NodeObserver() = default;
  virtual void on_node(const Node& node, int64_t start_ns, int64_t end_ns) = 0;
};
/// Adds an observer (not owned; at most 4 at a time: the profiler, data parallelism's gradient
/// buckets, tests); remove it before it dies. Throws when 4 are installed.
void add_node_observer(NodeObserver* obs);
void remove_node_observer(NodeObserver* obs);

/// t's value was written in place (a parameter view into a flat buffer that an optimizer
/// updates, a collective's output): the copies of it that the executor made on other devices
/// are stale and forgotten, so the next reader there copies it again. (A copy is otherwise
/// valid for as long as t keeps the same buffer.)
void values_changed(const Tensor& t);

/// Work that must follow the plan, not the execution: ZeRO stage 3 gathers each sharded
/// parameter (Node::sharded) before the nodes that read it, issuing its collectives in plan
/// order on every rank (distributed/param_gatherer.h). begin() sees each top-level eval's
/// nodes in plan order (after fusion; the same order on every process for the same graph) and
/// returns the eval's run, or null when it has nothing to do there.
class EvalRun {
 public:
  /// Ends the run: waits for what it started (also after an error).
  virtual ~EvalRun() = default;
  /// Before order[i] runs and after it ran, on the thread that runs it.
  virtual void before_node(size_t i) = 0;
  virtual void after_node(size_t i) = 0;
};
class EvalHook {
 public:
  virtual ~EvalHook() = default;
  virtual std::unique_ptr<EvalRun> begin(const std::vector<Node*>& order) = 0;
};
/// Installs the hook (not owned; one at a time; null removes it). Throws when another is set.
void set_eval_hook(EvalHook* hook);

}  // namespace hetrain
