// Fused optimizer updates: one pass over a parameter and its state instead of a dozen
// elementwise nodes. Builders in ops_optim.cpp; CPU kernels in backends/cpu/eval_optim.cpp.
#pragma once

#include "hetrain/graph/ops.h"
#include "hetrain/graph/primitive.h"

namespace hetrain {

/// One AdamW step (torch.optim.AdamW, decoupled weight decay) for one parameter tensor.
/// Inputs p, g, m, v (same shape and dtype); outputs p', m', v'. Arithmetic in the
/// parameter's dtype for f32/f64, in f32 for f16/bf16. Not differentiable.
class AdamWUpdate final : public Primitive {
 public:
  explicit AdamWUpdate(const AdamWStepArgs& a) : a_(a) {}
  const char* name() const override { return "adamw_update"; }
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override;
  Cost cost(const std::vector<TensorMeta>& in, const std::vector<TensorMeta>& out) const override;
  void eval_cpu(const std::vector<const Array*>& in, const std::vector<Array*>& out) const override;
#if HETRAIN_HAVE_CUDA
  void eval_cuda(const std::vector<const Array*>& in,
                 const std::vector<Array*>& out) const override;
  bool has_kernel(DeviceKind) const override { return true; }
#endif
  std::string attrs() const override;

 private:
  AdamWStepArgs a_;
};

}  // namespace hetrain
