// Autodiff as a transform over the graph.
#pragma once

#include <functional>
#include <utility>
#include <vector>

#include "hetrain/graph/tensor.h"

namespace hetrain {

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

}  // namespace hetrain
