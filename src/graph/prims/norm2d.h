// Fused batch normalisation over (N, H, W) of NCHW tensors with batch statistics (training mode).
// Builder in ops_norm2d.cpp, CPU kernels in backends/cpu/eval_norm2d.cpp.
#pragma once

#include <cmath>

#include "hetrain/graph/primitive.h"

namespace hetrain {

/// Inputs x (N, C, H, W), weight (C), bias (C). Outputs y = (x - mean) * invstd * weight + bias
/// (x's dtype), or relu of it when `relu` (a ResNet's bn -> relu in one pass), the batch mean (C)
/// and the biased batch variance (C), both in f32 (f64 for f64 x). The variance is of squared
/// deviations from a mean (never E[x^2] - mean^2): per plane on the CPU, then merged; two passes
/// per channel on CUDA, as torch. The affine map uses invstd of the variance as stored, so
/// that the backward recomputes exactly the forward's pre-activation for the relu mask.
/// With `residual`, a fourth input r of x's shape joins before the relu: y = relu(bn(x) + r), a
/// residual block's tail in one pass (its gradient takes the relu mask from y).
class BatchNorm2d final : public Primitive {
 public:
  BatchNorm2d(double eps, bool relu, bool residual = false)
      : eps_(eps), relu_(relu), residual_(residual) {}
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
  std::string attrs() const override {
    return "eps=" + std::to_string(eps_) + (residual_ ? ",residual" : "") + (relu_ ? ",relu" : "");
  }

 private:
  double eps_;
  bool relu_, residual_;
};

/// The backward of BatchNorm2d (torch's batch_norm_backward). Inputs x, mean, var, g, weight,
/// bias; outputs dx, dweight = sum(g * xhat), dbias = sum(g), sums over (N, H, W), with dx =
/// weight * invstd * (g - dbias / M - xhat * dweight / M), M = N * H * W. With `relu`, g is first
/// zeroed where the forward's pre-activation was <= 0 (torch's threshold_backward), recomputed
/// from x: no relu output is kept or read for the mask.
class BatchNorm2dBackward final : public Primitive {
 public:
  BatchNorm2dBackward(double eps, bool relu) : eps_(eps), relu_(relu) {}
  const char* name() const override { return "batch_norm2d_backward"; }
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override;
  Cost cost(const std::vector<TensorMeta>& in, const std::vector<TensorMeta>& out) const override;
  void eval_cpu(const std::vector<const Array*>& in, const std::vector<Array*>& out) const override;
#if HETRAIN_HAVE_CUDA
  void eval_cuda(const std::vector<const Array*>& in,
                 const std::vector<Array*>& out) const override;
  bool has_kernel(DeviceKind) const override { return true; }
#endif
  std::string attrs() const override {
    return "eps=" + std::to_string(eps_) + (relu_ ? ",relu" : "");
  }

 private:
  double eps_;
  bool relu_;
};

/// Per-channel scale and shift of the batch norm's affine map, y = x * scale + shift: one
/// definition for the forward and for the backward's recomputed relu mask, so both round alike.
template <class A>
struct BnAffine {
  A scale, shift;
  BnAffine(double w, double b, A mean, A var, double eps)
      : scale(static_cast<A>(w / std::sqrt(static_cast<double>(var) + eps))),
        shift(static_cast<A>(b) - mean * scale) {}
};

}  // namespace hetrain
