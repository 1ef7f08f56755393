// Reductions over a set of axes.
#pragma once

#include "hetrain/graph/primitive.h"

namespace hetrain {

enum class ReduceKind { sum, max, min };

class Reduce final : public Primitive {
 public:
  Reduce(ReduceKind kind, std::vector<int> axes, bool keepdims)
      : kind_(kind), axes_(std::move(axes)), keepdims_(keepdims) {}
  const char* name() const override;
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override;
  Cost cost(const std::vector<TensorMeta>& in, const std::vector<TensorMeta>& out) const override;
  void eval_cpu(const std::vector<const Array*>& in, const std::vector<Array*>& out) const override;
#if HETRAIN_HAVE_CUDA
  void eval_cuda(const std::vector<const Array*>& in,
                 const std::vector<Array*>& out) const override;
  bool has_kernel(DeviceKind) const override { return true; }
#endif
  std::vector<Tensor> vjp(const std::vector<Tensor>& x, const std::vector<Tensor>& y,
                          const std::vector<Tensor>& g, const std::vector<int>&) const override;
  std::string attrs() const override;

 private:
  ReduceKind kind_;
  std::vector<int> axes_;  // sorted, unique
  bool keepdims_;
};

class ArgMax final : public Primitive {
 public:
  ArgMax(int axis, bool keepdims) : axis_(axis), keepdims_(keepdims) {}
  const char* name() const override { return "argmax"; }
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override;
  void eval_cpu(const std::vector<const Array*>& in, const std::vector<Array*>& out) const override;
#if HETRAIN_HAVE_CUDA
  void eval_cuda(const std::vector<const Array*>& in,
                 const std::vector<Array*>& out) const override;
  bool has_kernel(DeviceKind) const override { return true; }
#endif

 private:
  int axis_;
  bool keepdims_;
};

/// Shape after reducing axes (kept as 1 with keepdims).
Shape reduced_shape(const Shape& s, const std::vector<int>& axes, bool keepdims);

}  // namespace hetrain
