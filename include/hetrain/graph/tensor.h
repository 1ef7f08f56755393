// Tensor: a handle to one output of a node in a lazily built graph.
//
//   using namespace hetrain;
//   Tensor w = randn({64, 10}, Dtype::f32, /*seed=*/1).requires_grad_();
//   Tensor x = ones({32, 64});
//   Tensor loss = mean(relu(matmul(x, w)));
//   loss.backward();              // evaluates loss and fills w.grad()
//   float l = loss.item<float>();
//
// Ops only build nodes; eval(), item() and reading data run the runtime.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "hetrain/base/dtype.h"
#include "hetrain/base/shape.h"
#include "hetrain/memory/array.h"
#include "hetrain/memory/device.h"

namespace hetrain {

class Primitive;
struct Node;
namespace runtime {
struct NodeState;  // what the runtime keeps per node (src/runtime/internal.h)
}

struct TensorMeta {
  Shape shape;
  Dtype dtype = Dtype::f32;
};

class Tensor {
 public:
  Tensor() = default;
  Tensor(std::shared_ptr<Node> node, int index) : node_(std::move(node)), index_(index) {}

  bool defined() const { return node_ != nullptr; }
  const Shape& shape() const;
  Dtype dtype() const;
  int ndim() const { return static_cast<int>(shape().size()); }
  int64_t numel() const { return hetrain::numel(shape()); }
  /// Size of one axis; negative axes count from the end.
  int64_t size(int64_t axis) const;

  /// Evaluates this tensor (and what it depends on) if it is not yet evaluated.
  const Tensor& eval() const;
  bool evaluated() const;
  /// The evaluated array (shape, strides, buffer).
  const Array& array() const;
  /// The single value of a one-element tensor, converted to T.
  template <class T>
  T item() const;
  /// All values in logical (row-major) order, converted to T.
  template <class T>
  std::vector<T> to_vector() const;

  bool requires_grad() const;
  /// Marks a leaf as requiring gradients; throws for non-leaves or integer tensors.
  Tensor& requires_grad_(bool on = true);
  bool is_leaf() const;
  /// The accumulated gradient of a leaf (undefined before backward()).
  Tensor grad() const;
  void set_grad(const Tensor& g) const;
  void zero_grad() const;
  /// Backpropagates from this tensor (a scalar unless a cotangent is given) into the .grad
  /// of every leaf that requires grad, evaluates those gradients, and frees the graph.
  void backward() const;
  void backward(const Tensor& cotangent) const;
  /// A new leaf that shares this tensor's data; evaluates it.
  Tensor detach() const;

  Node* node() const { return node_.get(); }
  const std::shared_ptr<Node>& node_ptr() const { return node_; }
  int index() const { return index_; }
  std::string str() const;  // "Tensor(f32, (2, 3))"

 private:
  std::shared_ptr<Node> node_;
  int index_ = 0;
};

/// A graph node: one primitive applied to inputs, with one or more outputs. A leaf has no
/// primitive. After evaluation a node that no gradient needs drops its primitive and
/// inputs ("detached"), which frees intermediate buffers at their last use.
struct Node : std::enable_shared_from_this<Node> {
  std::shared_ptr<Primitive> prim;
  std::vector<Tensor> inputs;
  std::vector<Array> outs;
  Device device = Device::cpu();  // the pin, or where the scheduler ran the node
  bool pinned = false;            // device fixed by the user (DeviceScope)
  bool requires_grad = false;
  bool leaf_requires_grad = false;  // set by requires_grad_() on a leaf
  Tensor grad;                      // leaves only
  /// The runtime's own state of this node (copies of its outputs on other devices), opaque
  /// here; null until the runtime needs it. Traversals keep their marks in side tables.
  std::shared_ptr<runtime::NodeState> runtime_state;
  // A leaf whose data exists only while gathered (ZeRO stage 3's parameters): it counts as
  // evaluated, and an EvalHook gives it data before the nodes that read it run.
  bool sharded = false;
  bool evaluated() const { return !outs.empty() && (outs[0].has_data() || sharded); }
};

/// Pins the nodes built on this thread inside the scope to a device: the scheduler runs them
/// there whatever the placement policy (MLX's StreamOrDevice).
///
///   { DeviceScope on(Device::parse("sim:0")); y = matmul(a, b); }  // y's node runs on sim:0
class DeviceScope {
 public:
  explicit DeviceScope(Device d);
  ~DeviceScope();
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  Device prev_;
  bool prev_active_;
};

/// Evaluates all targets (one traversal, shared subgraphs run once). Nodes that no gradient
/// needs forget their producers once run; with release_graph every node does (backward(),
/// which frees the graph anyway, uses it so activations go at their last use). Declared here,
/// where tensors ask for their values; defined by the runtime (its executor).
void eval(const std::vector<Tensor>& targets, bool release_graph = false);

/// Builds a node of prim over inputs; infers output shapes (which checks the arguments).
std::vector<Tensor> make_node(std::shared_ptr<Primitive> prim, std::vector<Tensor> inputs);
Tensor make_node1(std::shared_ptr<Primitive> prim, std::vector<Tensor> inputs);
/// A leaf over an existing array (data already there).
Tensor make_leaf(Array a);

/// Whether new nodes record the graph for gradients on this thread.
bool grad_enabled();
class NoGradScope {
 public:
  NoGradScope();
  ~NoGradScope();

 private:
  bool prev_;
};

}  // namespace hetrain
