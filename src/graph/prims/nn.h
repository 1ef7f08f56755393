// Neural-network primitives: softmax, normalisation, indexing (take/gather and their
// scatter-add adjoints) and the fused cross-entropy. Builders live in ops_nn.cpp and
// ops_index.cpp; CPU kernels in backends/cpu/eval_nn.cpp and backends/cpu/eval_index.cpp.
#pragma once

#include <optional>

#include "hetrain/base/dispatch.h"
#include "hetrain/graph/primitive.h"

namespace hetrain {

/// softmax or log_softmax along one axis (numerically stable: the row max is subtracted).
class Softmax final : public Primitive {
 public:
  Softmax(int axis, bool log) : axis_(axis), log_(log) {}
  const char* name() const override { return log_ ? "log_softmax" : "softmax"; }
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
  std::string attrs() const override { return "axis=" + std::to_string(axis_); }

 private:
  int axis_;
  bool log_;
};

/// layer_norm (center = true) or rms_norm (center = false) over the trailing `cols`
/// elements of each row. Inputs x, [weight], [bias] (weight and bias of cols elements).
/// Outputs y and stats (rows, 2) = (mean, rstd) in f32 (f64 for f64 x); rms_norm's mean is 0.
class Norm final : public Primitive {
 public:
  Norm(bool center, int64_t cols, bool has_weight, bool has_bias, double eps)
      : center_(center), cols_(cols), has_w_(has_weight), has_b_(has_bias), eps_(eps) {}
  const char* name() const override { return center_ ? "layer_norm" : "rms_norm"; }
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
  bool center_;
  int64_t cols_;
  bool has_w_, has_b_;
  double eps_;
};

/// The backward of Norm. Inputs x, stats, g, [weight]; outputs dx, [dweight], [dbias]
/// (dweight/dbias summed over rows; deterministic for any thread count).
class NormBackward final : public Primitive {
 public:
  NormBackward(bool center, int64_t cols, bool has_weight, bool has_bias)
      : center_(center), cols_(cols), has_w_(has_weight), has_b_(has_bias) {}
  const char* name() const override {
    return center_ ? "layer_norm_backward" : "rms_norm_backward";
  }
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override;
  Cost cost(const std::vector<TensorMeta>& in, const std::vector<TensorMeta>& out) const override;
  void eval_cpu(const std::vector<const Array*>& in, const std::vector<Array*>& out) const override;
#if HETRAIN_HAVE_CUDA
  void eval_cuda(const std::vector<const Array*>& in,
                 const std::vector<Array*>& out) const override;
  bool has_kernel(DeviceKind) const override { return true; }
#endif

 private:
  bool center_;
  int64_t cols_;
  bool has_w_, has_b_;
};

/// numpy.take along axis: out = x.shape[:axis] + index.shape + x.shape[axis+1:]. Backs
/// index_select and embedding; op names the caller in bounds errors.
class Take final : public Primitive {
 public:
  Take(int axis, const char* op) : axis_(axis), op_(op) {}
  const char* name() const override { return op_; }
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
  std::string attrs() const override { return "axis=" + std::to_string(axis_); }

 private:
  int axis_;
  const char* op_;
};

/// The adjoint of Take: zeros(full) with out[.., index[j], ..] += g[.., j, ..].
class IndexAdd final : public Primitive {
 public:
  IndexAdd(Shape full, int axis) : full_(std::move(full)), axis_(axis) {}
  const char* name() const override { return "index_add"; }
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override;
  void eval_cpu(const std::vector<const Array*>& in, const std::vector<Array*>& out) const override;
#if HETRAIN_HAVE_CUDA
  void eval_cuda(const std::vector<const Array*>& in,
                 const std::vector<Array*>& out) const override;
  bool has_kernel(DeviceKind) const override { return true; }
#endif
  std::vector<Tensor> vjp(const std::vector<Tensor>& x, const std::vector<Tensor>& y,
                          const std::vector<Tensor>& g, const std::vector<int>&) const override;

 private:
  Shape full_;
  int axis_;
};

/// torch.gather: out (index.shape) [.., j, ..] = x[.., index[.., j, ..], ..] along axis.
class Gather final : public Primitive {
 public:
  explicit Gather(int axis) : axis_(axis) {}
  const char* name() const override { return "gather"; }
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override;
  void eval_cpu(const std::vector<const Array*>& in, const std::vector<Array*>& out) const override;
  std::vector<Tensor> vjp(const std::vector<Tensor>& x, const std::vector<Tensor>& y,
                          const std::vector<Tensor>& g, const std::vector<int>&) const override;
  std::string attrs() const override { return "axis=" + std::to_string(axis_); }

 private:
  int axis_;
};

/// The adjoint of Gather: zeros(full) with out[.., index[.., j, ..], ..] += g[.., j, ..].
class ScatterAdd final : public Primitive {
 public:
  ScatterAdd(Shape full, int axis) : full_(std::move(full)), axis_(axis) {}
  const char* name() const override { return "scatter_add"; }
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override;
  void eval_cpu(const std::vector<const Array*>& in, const std::vector<Array*>& out) const override;
  std::vector<Tensor> vjp(const std::vector<Tensor>& x, const std::vector<Tensor>& y,
                          const std::vector<Tensor>& g, const std::vector<int>&) const override;

 private:
  Shape full_;
  int axis_;
};

/// Fused log-softmax + negative log-likelihood. Inputs logits (N, C, S...) and integer
/// targets (N, S...). Outputs the per-element loss (N, S...) (0 where
/// the target is ignore_index) and the log-sum-exp over classes, both in f32 (f64 for f64
/// logits).
class CrossEntropy final : public Primitive {
 public:
  explicit CrossEntropy(int64_t ignore_index) : ignore_(ignore_index) {}
  const char* name() const override { return "cross_entropy"; }
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
  std::string attrs() const override { return "ignore_index=" + std::to_string(ignore_); }

 private:
  int64_t ignore_;
};

/// dlogits = (softmax(logits) - onehot(target)) * g per element; 0 where ignored.
/// Inputs logits, targets, lse, g (the per-element loss cotangent).
class CrossEntropyBackward final : public Primitive {
 public:
  explicit CrossEntropyBackward(int64_t ignore_index) : ignore_(ignore_index) {}
  const char* name() const override { return "cross_entropy_backward"; }
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override;
  Cost cost(const std::vector<TensorMeta>& in, const std::vector<TensorMeta>& out) const override;
  void eval_cpu(const std::vector<const Array*>& in, const std::vector<Array*>& out) const override;
#if HETRAIN_HAVE_CUDA
  void eval_cuda(const std::vector<const Array*>& in,
                 const std::vector<Array*>& out) const override;
  bool has_kernel(DeviceKind) const override { return true; }
#endif

 private:
  int64_t ignore_;
};

/// The first value of an integer index array outside [0, bound), other than skip (an array
/// in a GPU's memory is read through a host copy).
std::optional<int64_t> find_bad_index(const Array& index, int64_t bound,
                                      std::optional<int64_t> skip = {});
/// Throws the bounds error of op ("[embedding] id 7 is out of range ... V=5 ...").
[[noreturn]] void fail_bad_index(const char* op, int64_t bad, int64_t bound, int axis,
                                 int64_t ignore_index = 0);

}  // namespace hetrain
