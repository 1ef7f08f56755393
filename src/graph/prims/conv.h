// Convolution and pooling primitives (NCHW, groups = 1).
#pragma once

#include <array>
#include <optional>

#include "hetrain/graph/primitive.h"

namespace hetrain {

/// Spatial geometry shared by the conv and pool primitives.
struct Window2d {
  std::array<int64_t, 2> kernel{1, 1};
  std::array<int64_t, 2> stride{1, 1};
  std::array<int64_t, 2> padding{0, 0};
  /// Output extent along axis a (0: H, 1: W) for an input extent n.
  int64_t out_size(int a, int64_t n) const {
    return (n + 2 * padding[static_cast<size_t>(a)] - kernel[static_cast<size_t>(a)]) /
               stride[static_cast<size_t>(a)] +
           1;
  }
  std::string str() const;
};

/// Whether one pass can take convolutions a and b of the same input (H, W): stride 2 both ways,
/// the same output size, and b's window inside a's (its taps are some of a's taps). A ResNet
/// downsampling block's 3x3 and 1x1 shortcut; the stride-2 direct kernels split the input into
/// phase planes once for both.
bool one_pass_pair(const Window2d& a, const Window2d& b, std::array<int64_t, 2> in_hw);

/// y (N, O, Ho, Wo) = conv(x (N, C, H, W), w (O, C, kh, kw)) [+ bias (O)]. With a second window
/// (the fusion pass's pair of two convolutions of x): inputs x, w, w2 (no bias), outputs y and
/// y2 = conv(x, w2) with that window.
class Conv2d final : public Primitive {
 public:
  explicit Conv2d(Window2d win, std::optional<Window2d> second = std::nullopt)
      : win_(win), second_(second) {}
  const char* name() const override { return "conv2d"; }
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
  const Window2d& window() const { return win_; }
  const std::optional<Window2d>& second() const { return second_; }

 private:
  Window2d win_;
  std::optional<Window2d> second_;
};

/// dx (N, C, H, W) from g (N, O, Ho, Wo) and w (O, C, kh, kw): the transposed convolution
/// (GEMM into columns, then col2im). With `addend`, a third input r of dx's shape and dtype is
/// added as dx is written: a ResNet block input's gradient, this convolution's plus the other
/// branch's, without a separate add over the tensor (f32 and f64). With a second window, two
/// more inputs g2 and w2 of a second convolution of the same input come before the addend, and
/// dx is the sum of both input gradients: a ResNet downsampling block's 1x1 shortcut and 3x3
/// convolution, which the stride-2 direct kernel computes in one pass (the shortcut's taps join
/// the 3x3's phase planes). With a relu mask, a last input m of dx's shape: dx is zero where m
/// is not > 0, written so by the stride-2 direct kernel (a downsampling block's input is the
/// previous block's relu output). The fusion pass (runtime/fusion.h) builds these forms from
/// the adds and relu gradients that autodiff writes.
class Conv2dBackwardInput final : public Primitive {
 public:
  Conv2dBackwardInput(Window2d win, std::array<int64_t, 2> in_hw, bool addend = false,
                      std::optional<Window2d> second = std::nullopt, bool mask = false)
      : win_(win), in_hw_(in_hw), addend_(addend), second_(second), mask_(mask) {}
  const char* name() const override { return "conv2d_backward_input"; }
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override;
  Cost cost(const std::vector<TensorMeta>& in, const std::vector<TensorMeta>& out) const override;
  void eval_cpu(const std::vector<const Array*>& in, const std::vector<Array*>& out) const override;
#if HETRAIN_HAVE_CUDA
  void eval_cuda(const std::vector<const Array*>& in,
                 const std::vector<Array*>& out) const override;
  bool has_kernel(DeviceKind) const override { return true; }
  /// dx without the second convolution and the addend.
  void backward_input_cuda(const std::vector<const Array*>& in, Array& dx) const;
#endif
  std::vector<Tensor> vjp(const std::vector<Tensor>& x, const std::vector<Tensor>& y,
                          const std::vector<Tensor>& g, const std::vector<int>&) const override;
  std::string attrs() const override;
  const Window2d& window() const { return win_; }
  std::array<int64_t, 2> in_hw() const { return in_hw_; }
  bool addend() const { return addend_; }
  const std::optional<Window2d>& second() const { return second_; }
  bool relu_mask() const { return mask_; }

 private:
  Window2d win_;
  std::array<int64_t, 2> in_hw_;
  bool addend_;
  /// With a second convolution: inputs g, w, g2, w2 [, addend], and dx is the sum
  /// of both convolutions' input gradients.
  std::optional<Window2d> second_;
  bool mask_;  // a last input m: dx = relu_grad(m, dx)
};

/// dw (O, C, kh, kw) from x (N, C, H, W) and g (N, O, Ho, Wo). With a second window (the
/// weight gradients of a pair of convolutions of x): inputs x, g, g2, outputs dw and the
/// second's dw2.
class Conv2dBackwardWeight final : public Primitive {
 public:
  explicit Conv2dBackwardWeight(Window2d win, std::optional<Window2d> second = std::nullopt)
      : win_(win), second_(second) {}
  const char* name() const override { return "conv2d_backward_weight"; }
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
  const Window2d& window() const { return win_; }
  const std::optional<Window2d>& second() const { return second_; }

 private:
  Window2d win_;
  std::optional<Window2d> second_;
};

/// Max pooling with -inf padding: outputs y and the flat index (h * W + w, i64) of each
/// maximum within its (n, c) plane; the first maximum in window order wins, NaN beats all.
class MaxPool2d final : public Primitive {
 public:
  explicit MaxPool2d(Window2d win) : win_(win) {}
  const char* name() const override { return "max_pool2d"; }
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override;
  void eval_cpu(const std::vector<const Array*>& in, const std::vector<Array*>& out) const override;
#if HETRAIN_HAVE_CUDA
  void eval_cuda(const std::vector<const Array*>& in,
                 const std::vector<Array*>& out) const override;
  bool has_kernel(DeviceKind) const override { return true; }
#endif
  std::vector<Tensor> vjp(const std::vector<Tensor>& x, const std::vector<Tensor>& y,
                          const std::vector<Tensor>& g, const std::vector<int>&) const override;
  std::string attrs() const override { return win_.str(); }

 private:
  Window2d win_;
};

/// dx (N, C, H, W): g (N, C, Ho, Wo) added at the saved argmax indices. The window tells the
/// CUDA kernel which outputs can point at an input pixel (it gathers rather than scatters).
class MaxPool2dBackward final : public Primitive {
 public:
  MaxPool2dBackward(Window2d win, std::array<int64_t, 2> in_hw) : win_(win), in_hw_(in_hw) {}
  const char* name() const override { return "max_pool2d_backward"; }
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override;
  void eval_cpu(const std::vector<const Array*>& in, const std::vector<Array*>& out) const override;
#if HETRAIN_HAVE_CUDA
  void eval_cuda(const std::vector<const Array*>& in,
                 const std::vector<Array*>& out) const override;
  bool has_kernel(DeviceKind) const override { return true; }
#endif
  std::string attrs() const override { return win_.str(); }

 private:
  Window2d win_;
  std::array<int64_t, 2> in_hw_;
};

/// Average pooling with zero padding counted in the divisor (count_include_pad=True).
class AvgPool2d final : public Primitive {
 public:
  explicit AvgPool2d(Window2d win) : win_(win) {}
  const char* name() const override { return "avg_pool2d"; }
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override;
  void eval_cpu(const std::vector<const Array*>& in, const std::vector<Array*>& out) const override;
#if HETRAIN_HAVE_CUDA
  void eval_cuda(const std::vector<const Array*>& in,
                 const std::vector<Array*>& out) const override;
  bool has_kernel(DeviceKind) const override { return true; }
#endif
  std::vector<Tensor> vjp(const std::vector<Tensor>& x, const std::vector<Tensor>& y,
                          const std::vector<Tensor>& g, const std::vector<int>&) const override;
  std::string attrs() const override { return win_.str(); }

 private:
  Window2d win_;
};

/// dx (N, C, H, W): each g (N, C, Ho, Wo) spread evenly over its window; linear in g.
class AvgPool2dBackward final : public Primitive {
 public:
  AvgPool2dBackward(Window2d win, std::array<int64_t, 2> in_hw) : win_(win), in_hw_(in_hw) {}
  const char* name() const override { return "avg_pool2d_backward"; }
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override;
  void eval_cpu(const std::vector<const Array*>& in, const std::vector<Array*>& out) const override;
#if HETRAIN_HAVE_CUDA
  void eval_cuda(const std::vector<const Array*>& in,
                 const std::vector<Array*>& out) const override;
  bool has_kernel(DeviceKind) const override { return true; }
#endif
  std::vector<Tensor> vjp(const std::vector<Tensor>& x, const std::vector<Tensor>& y,
                          const std::vector<Tensor>& g, const std::vector<int>&) const override;
  std::string attrs() const override { return win_.str(); }

 private:
  Window2d win_;
  std::array<int64_t, 2> in_hw_;
};

}  // namespace hetrain
