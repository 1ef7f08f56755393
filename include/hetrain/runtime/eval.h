// The executor: evaluates the nodes the targets depend on, in dependency order, running
// independent nodes concurrently on the thread pool and freeing each intermediate buffer
// after its last use.
#pragma once

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

}  // namespace hetrain
