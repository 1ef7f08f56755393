// Autodiff as a transform over the graph.
#pragma once

#include <functional>
#include <utility>
#include <vector>

#include "hetrain/graph/tensor.h"

namespace hetrain {

/// Post-order of the nodes reachable from roots through their inputs (inputs first): the order
/// backward() sweeps, and that graph/recompute.h cuts into units.
std::vector<std::shared_ptr<Node>> graph_order(const std::vector<Tensor>& roots);

/// Gradients of outputs (weighted by cotangents; ones for a scalar output when omitted) with
/// respect to each tensor in wrt. Builds graph nodes; nothing is evaluated. A wrt tensor the
/// outputs do not depend on gets zeros.
std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& wrt,
                         const std::vector<Tensor>& cotangents = {});

using TensorFn = std::function<Tensor(const std::vector<Tensor>&)>;
/// f's value at args and its gradient with respect to every arg (lazy).
std::pair<Tensor, std::vector<Tensor>> value_and_grad(const TensorFn& f,
                                                      const std::vector<Tensor>& args);

/// PyTorch's loss.backward(): accumulates into .grad of leaves that require grad, evaluates
/// the gradients together with output, then frees the graph behind output.
void backward(const Tensor& output, const Tensor& cotangent = {});
/// The same, evaluating `with` (values the step needs anyway: BatchNorm's running statistics)
/// in the same eval, so what they read is let go as soon as they have run instead of being held
/// through the backward.
void backward(const Tensor& output, const Tensor& cotangent, const std::vector<Tensor>& with);

/// What backward(output) evaluates, built and not run, with no .grad touched: output, then for
/// each leaf that requires grad its .grad plus the new gradient, under this thread's
/// RecomputeScope. For the memory model (runtime/memory_model.h) and recompute planning; the
/// forward graph is left as backward() would find it.
std::vector<Tensor> gradient_graph(const Tensor& output, const Tensor& cotangent = {},
                                   const std::vector<Tensor>& with = {});

}  // namespace hetrain
