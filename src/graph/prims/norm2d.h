// Fused batch normalisation over (N, H, W) of NCHW tensors with batch statistics (training mode).
// Builder in ops_norm2d.cpp, CPU kernels in backends/cpu/norm2d.cpp.
#pragma once

#include "hetrain/graph/primitive.h"

namespace hetrain {

/// Inputs x (N, C, H, W), weight (C), bias (C). Outputs y = (x - mean) * invstd * weight + bias
/// (x's dtype), the batch mean (C) and the biased batch variance (C), both in f32 (f64 for f64 x).
/// Two passes per channel (mean, then squared deviations), as torch.
class BatchNorm2d final : public Primitive {
 public:
  explicit BatchNorm2d(double eps) : eps_(eps) {}
  const char* name() const override { return "batch_norm2d"; }
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
  std::string attrs() const override { return "eps=" + std::to_string(eps_); }

 private:
  double eps_;
};

/// The backward of BatchNorm2d (torch's batch_norm_backward). Inputs x, mean, var, g, weight;
/// outputs dx, dweight = sum(g * xhat), dbias = sum(g), sums over (N, H, W), with dx = weight *
/// invstd * (g - dbias / M - xhat * dweight / M), M = N * H * W.
class BatchNorm2dBackward final : public Primitive {
 public:
  explicit BatchNorm2dBackward(double eps) : eps_(eps) {}
  const char* name() const override { return "batch_norm2d_backward"; }
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override;
  Cost cost(const std::vector<TensorMeta>& in, const std::vector<TensorMeta>& out) const override;
  void eval_cpu(const std::vector<const Array*>& in, const std::vector<Array*>& out) const override;
#if HETRAIN_HAVE_CUDA
  void eval_cuda(const std::vector<const Array*>& in,
                 const std::vector<Array*>& out) const override;
  bool has_kernel(DeviceKind) const override { return true; }
#endif
  std::string attrs() const override { return "eps=" + std::to_string(eps_); }

 private:
  double eps_;
};

}  // namespace hetrain
