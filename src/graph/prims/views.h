// View primitives: the output shares the input's buffer with new shape/strides/offset.
#pragma once

#include "hetrain/graph/primitive.h"

namespace hetrain {

class ViewPrimitive : public Primitive {
 public:
  bool is_view() const override { return true; }
  Cost cost(const std::vector<TensorMeta>&, const std::vector<TensorMeta>&) const override {
    return {};
  }
};

/// Reshape: a view when the strides allow, else a contiguous copy.
class Reshape final : public ViewPrimitive {
 public:
  explicit Reshape(Shape shape) : shape_(std::move(shape)) {}
  const char* name() const override { return "reshape"; }
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override;
  void eval_cpu(const std::vector<const Array*>& in, const std::vector<Array*>& out) const override;
#if HETRAIN_HAVE_CUDA
  void eval_cuda(const std::vector<const Array*>& in,
                 const std::vector<Array*>& out) const override;
  bool has_kernel(DeviceKind) const override { return true; }
#endif
  std::vector<Tensor> vjp(const std::vector<Tensor>& x, const std::vector<Tensor>& y,
                          const std::vector<Tensor>& g, const std::vector<int>&) const override;
  std::string attrs() const override { return "shape=" + shape_str(shape_); }

 private:
  Shape shape_;
};

class Permute final : public ViewPrimitive {
 public:
  explicit Permute(std::vector<int> dims) : dims_(std::move(dims)) {}
  const char* name() const override { return "permute"; }
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override;
  void eval_cpu(const std::vector<const Array*>& in, const std::vector<Array*>& out) const override;
  std::vector<Tensor> vjp(const std::vector<Tensor>& x, const std::vector<Tensor>& y,
                          const std::vector<Tensor>& g, const std::vector<int>&) const override;
  const std::vector<int>& dims() const { return dims_; }

 private:
  std::vector<int> dims_;
};

/// Elements [start, start + step * len) along axis.
class Slice final : public ViewPrimitive {
 public:
  Slice(int axis, int64_t start, int64_t len, int64_t step)
      : axis_(axis), start_(start), len_(len), step_(step) {}
  const char* name() const override { return "slice"; }
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override;
  void eval_cpu(const std::vector<const Array*>& in, const std::vector<Array*>& out) const override;
  std::vector<Tensor> vjp(const std::vector<Tensor>& x, const std::vector<Tensor>& y,
                          const std::vector<Tensor>& g, const std::vector<int>&) const override;

 private:
  int axis_;
  int64_t start_, len_, step_;
};

/// The adjoint of Slice: zeros of in_shape with the input written at the slice.
class SliceScatter final : public Primitive {
 public:
  SliceScatter(Shape full, int axis, int64_t start, int64_t step)
      : full_(std::move(full)), axis_(axis), start_(start), step_(step) {}
  const char* name() const override { return "slice_scatter"; }
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override {
    return {{full_, in[0].dtype}};
  }
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
  int64_t start_, step_;
};

class BroadcastTo final : public ViewPrimitive {
 public:
  explicit BroadcastTo(Shape shape) : shape_(std::move(shape)) {}
  const char* name() const override { return "broadcast_to"; }
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override;
  void eval_cpu(const std::vector<const Array*>& in, const std::vector<Array*>& out) const override;
  std::vector<Tensor> vjp(const std::vector<Tensor>& x, const std::vector<Tensor>& y,
                          const std::vector<Tensor>& g, const std::vector<int>&) const override;

 private:
  Shape shape_;
};

/// Joins inputs along axis.
class Concat final : public Primitive {
 public:
  explicit Concat(int axis) : axis_(axis) {}
  const char* name() const override { return "concat"; }
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override;
  Cost cost(const std::vector<TensorMeta>& in, const std::vector<TensorMeta>& out) const override {
    Cost c = Primitive::cost(in, out);
    c.flops = 0;
    return c;
  }
  void eval_cpu(const std::vector<const Array*>& in, const std::vector<Array*>& out) const override;
#if HETRAIN_HAVE_CUDA
  void eval_cuda(const std::vector<const Array*>& in,
                 const std::vector<Array*>& out) const override;
  bool has_kernel(DeviceKind) const override { return true; }
#endif
  std::vector<Tensor> vjp(const std::vector<Tensor>& x, const std::vector<Tensor>& y,
                          const std::vector<Tensor>& g,
                          const std::vector<int>& argnums) const override;

 private:
  int axis_;
};

}  // namespace hetrain
