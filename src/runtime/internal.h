// Runtime internals shared by its parts: the executor (executor.cpp), the task graph
// (task_graph.cpp), the plan cache (plan_cache.cpp), replica coherence (replicas.cpp),
// simulation (simulation.cpp) and the device set (devices.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "hetrain/graph/tensor.h"
#include "hetrain/memory/device.h"
#include "hetrain/runtime/scheduler.h"

namespace hetrain::runtime {

// ---- the device set (devices.cpp)

/// Index of d in the configured devices, or -1.
int device_index(Device d);
/// "cpu, sim:0, ..." for error messages.
std::string configured_devices();
/// Drops cached placements (the device set changed).
void clear_plan_cache();

/// Hash combining for plan keys and copy-task keys.
inline uint64_t mix(uint64_t h, uint64_t v) {
  return h ^ (v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2));
}

// ---- clock (executor.cpp)

int64_t now_ns();

// ---- replicas: copies of outputs on other memory nodes (replicas.cpp)

/// A copy of one of a node's outputs on another memory node, made by the scheduler. It is
/// valid while the output still holds the data it was copied from (source); a new value
/// written to the output invalidates it.
struct Replica {
  int index = 0;
  Array array;
  std::weak_ptr<Buffer> source;  // the output's buffer when copied
  int64_t source_offset = 0;
};
/// What the runtime keeps per node (Node::runtime_state), made when first needed; it goes with
/// the node.
struct NodeState {
  std::vector<Replica> replicas;
};
/// How many replicas p holds (valid or not).
size_t replica_count(const Node* p);

/// Whether device d holds a valid copy of output idx of p (its own array or a replica).
bool has_valid_copy(const Node* p, int idx, Device d);
/// The valid copies of n's inputs on device d, by value (the scheduler made them present).
std::vector<Array> input_copies(const Node& n, Device d);
/// Copies output idx of p to device dst (from its primary array) and records the replica.
void run_copy(Node* p, int idx, Device dst);
/// Forgets p's replicas: its outputs hold a new value.
void drop_replicas(Node* p);
/// Simulation: a content-free copy of output idx of p on d (memory allocated there, no data
/// moved), recorded as a replica unless d already holds a valid copy.
Array placeholder_copy(Node* p, int idx, Device d);

// ---- the task graph of one eval (task_graph.cpp)

/// The positions of one eval's nodes in its order: a side table, so that nodes carry no
/// traversal state and two evals never see each other's marks.
class OrderIndex {
 public:
  /// Numbers order's nodes 0 .. n - 1 (forgetting what was there).
  void assign(const std::vector<Node*>& order);
  /// Marks p as seen by a traversal (position -1 until assign); false when it already was.
  bool visit(const Node* p) { return pos_.emplace(p, -1).second; }
  /// p's position in the order; -1 when p is not in it or has been evaluated since.
  int of(const Node* p) const {
    if (p->evaluated()) return -1;
    auto it = pos_.find(p);
    return it == pos_.end() ? -1 : it->second;
  }
  void clear() { pos_.clear(); }

 private:
  std::unordered_map<const Node*, int> pos_;
};

/// Post-order over the unevaluated nodes the targets need (inputs before their consumers),
/// each visited once (index: cleared first, then each node seen; call index.assign on the
/// final order before asking positions); sets *any_pinned when a node is pinned to a device.
void collect_order(const std::vector<Tensor>& targets, OrderIndex& index, std::vector<Node*>& order,
                   std::vector<std::pair<Node*, size_t>>& stack, bool* any_pinned);
/// Footprint and size (bytes in and out) of a node, for performance models.
std::pair<uint64_t, double> node_footprint(const Node* n);
/// What placement works on: per node its cost, footprint, inputs, pin and the devices
/// without a kernel for it.
std::vector<TaskNode> task_graph(const std::vector<Node*>& order, const OrderIndex& index,
                                 const std::vector<DeviceModel>& devs);
/// Bit d set when configured device d holds a valid copy of output idx of p.
uint32_t present_mask(const Node* p, int idx, const std::vector<DeviceModel>& devs);

/// A copy of one output to one device, inserted between a producer and its consumers.
struct CopyTaskExec {
  Node* producer;
  int index;
  int device;  // configured device index
};
/// The tasks of one eval, nodes [0, n) of the order then copies, with dependency counts and
/// consumer lists (CSR: consumers of task i are consumer_list[begin[i], begin[i + 1])).
struct TaskDeps {
  std::vector<CopyTaskExec> copies;
  std::vector<int> pending, consumer_begin, consumer_list;
  std::vector<int> edges, cursor;  // scratch: (producer, consumer) pairs, fill positions
  size_t total = 0;
};
/// Builds deps for order (index: its positions). With `device` (placed runs: the
/// configured device index of each node), inputs living elsewhere get one copy task per
/// (data, destination), which runs as soon as its producer is done.
void build_tasks(const std::vector<Node*>& order, const OrderIndex& index,
                 const std::vector<int>* device, TaskDeps& deps);

// ---- kernels' scratch memory (kernel_scratch.cpp)

/// What a node's CPU kernel takes from the allocator while it runs, beyond its inputs.
struct KernelScratch {
  int64_t total = 0;      // the highest bytes alive at once: outputs and scratch together
  int64_t workspace = 0;  // the highest bytes of the workspace tag alive at once
};
/// Measured by running the node's own kernel once on inputs of its shapes, dtypes and layout
/// (its evaluated inputs as they are, the others zero-filled) with a private allocator,
/// parallel loops inline; remembered per kind of node (primitive, attributes, input and output
/// shapes, thread count). A view, or a kernel that throws on the zeros, takes nothing.
KernelScratch kernel_scratch(const Node& n);

// ---- the plan cache (plan_cache.cpp)

/// The configured device of each node of order (index: its positions): the plan cached for
/// this graph structure, or a new placement.
void plan_devices(const std::vector<Node*>& order, const OrderIndex& index,
                  std::vector<int>& device);
/// Counts copy tasks for scheduler_stats().
void count_copy_tasks(int64_t n);
/// Throws naming the node when it is pinned to a device that is not configured.
void check_pin(const Node& n);

// ---- simulation (simulation.cpp)

/// Simulate mode's eval: the same placement and list scheduler as a real run, no kernels.
void simulate_eval(const std::vector<Node*>& order, bool release_graph);

}  // namespace hetrain::runtime
