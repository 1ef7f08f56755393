// Fused primitives, built only by the fusion pass (runtime/fusion.h), never by an op.
#pragma once

#include <memory>
#include <optional>
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

/// A producer (a matmul or a convolution) and the elementwise chain that alone consumes its
/// output, as one node: the chain is the producer's epilogue (bias, residual add, activation,
/// cast). Inputs: the producer's (num_main_inputs of them), then the chain's other inputs; the
/// producer's output takes the chain's input slot 0, seen with shape `as_shape` where given (a
/// batched matmul's rows reshaped back, a free view of the contiguous result). The CPU runs the
/// producer into the output buffer when the chain keeps its dtype and shape (else into a
/// workspace), then the chain over it in place, block by block: the intermediate never exists as a
/// tensor of its own, and the values are those of the unfused nodes, bit for bit. The vjp is the
/// composition's (the producer is rebuilt lazily, so a chain whose gradient does not read the
/// producer's output, such as a bias add, never runs it again).
class WithEpilogue final : public Primitive {
 public:
  WithEpilogue(std::shared_ptr<Primitive> main, int num_main_inputs,
               std::shared_ptr<ElementwiseChain> epilogue, std::optional<Shape> as_shape = {})
      : main_(std::move(main)),
        num_main_(num_main_inputs),
        epilogue_(std::move(epilogue)),
        as_shape_(std::move(as_shape)) {}

  const char* name() const override { return "fused_epilogue"; }
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override;
  Cost cost(const std::vector<TensorMeta>& in, const std::vector<TensorMeta>& out) const override;
  void eval_cpu(const std::vector<const Array*>& in, const std::vector<Array*>& out) const override;
  void eval_cuda(const std::vector<const Array*>& in,
                 const std::vector<Array*>& out) const override;
  bool has_kernel(DeviceKind k) const override;
  std::vector<Tensor> vjp(const std::vector<Tensor>& x, const std::vector<Tensor>& y,
                          const std::vector<Tensor>& g,
                          const std::vector<int>& argnums) const override;
  /// The producer and the chain's steps, e.g. "matmul:add,gelu_tanh".
  std::string attrs() const override;

  const Primitive& main() const { return *main_; }
  int num_main_inputs() const { return num_main_; }
  const ElementwiseChain& epilogue() const { return *epilogue_; }

 private:
  /// The chain's inputs: the producer's output, then in[num_main_ ..].
  template <class T>
  std::vector<T> chain_inputs(const T& produced, const std::vector<T>& in) const {
    std::vector<T> r = {produced};
    r.insert(r.end(), in.begin() + num_main_, in.end());
    return r;
  }
  std::shared_ptr<Primitive> main_;
  int num_main_;
  std::shared_ptr<ElementwiseChain> epilogue_;
  std::optional<Shape> as_shape_;
};

}  // namespace hetrain
