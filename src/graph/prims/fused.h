// Fused primitives, built only by the fusion pass (runtime/fusion.h), never by an op.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "hetrain/graph/primitive.h"

namespace hetrain {

/// A chain of elementwise primitives run as one node: step k applies steps[k].prim to
/// operands that are the chain's inputs (slots 0 .. num_inputs-1) or earlier steps' results
/// (slot num_inputs + j for step j); the node's output is the last step's. Every operand has
/// the output's shape. The CPU runs the chain block by block (each block small enough that
/// the intermediates stay in cache), calling each step's own kernel on the block: the values
/// are those of the unfused nodes, bit for bit. The vjp is the composition's.
class ElementwiseChain final : public Primitive {
 public:
  struct Step {
    std::shared_ptr<Primitive> prim;
    std::vector<int> args;  // operand slots
    TensorMeta out;
  };
  ElementwiseChain(int num_inputs, std::vector<Step> steps)
      : num_inputs_(num_inputs), steps_(std::move(steps)) {}

  const char* name() const override { return "fused_elementwise"; }
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override;
  Cost cost(const std::vector<TensorMeta>& in, const std::vector<TensorMeta>& out) const override;
  void eval_cpu(const std::vector<const Array*>& in, const std::vector<Array*>& out) const override;
  /// Elsewhere the steps run one after another over whole tensors, each with its kernel.
  void eval_cuda(const std::vector<const Array*>& in,
                 const std::vector<Array*>& out) const override;
  bool has_kernel(DeviceKind k) const override;
  std::vector<Tensor> vjp(const std::vector<Tensor>& x, const std::vector<Tensor>& y,
                          const std::vector<Tensor>& g,
                          const std::vector<int>& argnums) const override;
  bool is_elementwise() const override { return true; }
  /// The steps in order, e.g. "add,gelu_tanh".
  std::string attrs() const override;

  int num_inputs() const { return num_inputs_; }
  const std::vector<Step>& steps() const { return steps_; }

 private:
  int num_inputs_;
  std::vector<Step> steps_;
};

}  // namespace hetrain
