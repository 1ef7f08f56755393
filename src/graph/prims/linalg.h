// Matrix multiplication.
#pragma once

#include "hetrain/graph/primitive.h"

namespace hetrain {

/// a (..., M, K) @ b (..., K, N) with equal batch dims (the op broadcasts them).
class Matmul final : public Primitive {
 public:
  const char* name() const override { return "matmul"; }
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override;
  Cost cost(const std::vector<TensorMeta>& in, const std::vector<TensorMeta>& out) const override;
  void eval_cpu(const std::vector<const Array*>& in, const std::vector<Array*>& out) const override;
#if HETRAIN_HAVE_CUDA
  void eval_cuda(const std::vector<const Array*>& in,
                 const std::vector<Array*>& out) const override;
  bool has_kernel(DeviceKind) const override { return true; }
#endif
  std::vector<Tensor> vjp(const std::vector<Tensor>& x, const std::vector<Tensor>& y,
                          const std::vector<Tensor>& g,
                          const std::vector<int>& argnums) const override;
};

}  // namespace hetrain
