// eval_cuda of the elementwise primitives (unary, binary, where, cast, concat,
// slice_scatter) and of reshape's copying case; kernels in elementwise.cu.
#include "backends/cuda/common.h"
#include "graph/prims/elementwise.h"
#include "graph/prims/views.h"

namespace hetrain {

template <class Op>
void Unary<Op>::eval_cuda(const std::vector<const Array*>& in,
                          const std::vector<Array*>& out) const {
  const Array& x = *in[0];
  Array& y = *out[0];
  // The CPU kernel's dtype rules: float-only ops on floats, the rest on any numeric type.
  if (Op::float_only && !is_floating(x.dtype))
    fail("[", Op::name, "] does not support dtype ", dtype_name(x.dtype), " (floating point only)");
  if (x.dtype == Dtype::boolean) fail("[", Op::name, "] does not support dtype bool");
  y.allocate();
  cuda::launch_unary(formulas::unary_id<Op>(), x.dtype, cuda::make_iter(x.shape, {&y, &x}), y.raw(),
                     x.raw(), cuda::stream());
}

template <class Op>
void Binary<Op>::eval_cuda(const std::vector<const Array*>& in,
                           const std::vector<Array*>& out) const {
  const Array &a = *in[0], &b = *in[1];
  Array& y = *out[0];
  if (Op::float_only && !is_floating(a.dtype))
    fail("[", Op::name, "] does not support dtype ", dtype_name(a.dtype), " (floating point only)");
  if (!Op::is_compare && a.dtype == Dtype::boolean)
    fail("[", Op::name, "] does not support dtype bool");
  y.allocate();
  cuda::launch_binary(formulas::binary_id<Op>(), a.dtype, cuda::make_iter(a.shape, {&y, &a, &b}),
                      y.raw(), a.raw(), b.raw(), cuda::stream());
}

#define HETRAIN_CUDA_UNARY(Op)                                                                     \
  template void Unary<Op>::eval_cuda(const std::vector<const Array*>&, const std::vector<Array*>&) \
      const;
HETRAIN_CUDA_UNARY(NegOp)
HETRAIN_CUDA_UNARY(AbsOp)
HETRAIN_CUDA_UNARY(ExpOp)
HETRAIN_CUDA_UNARY(LogOp)
HETRAIN_CUDA_UNARY(SqrtOp)
HETRAIN_CUDA_UNARY(RsqrtOp)
HETRAIN_CUDA_UNARY(SquareOp)
HETRAIN_CUDA_UNARY(TanhOp)
HETRAIN_CUDA_UNARY(SigmoidOp)
HETRAIN_CUDA_UNARY(ReluOp)
HETRAIN_CUDA_UNARY(GeluErfOp)
HETRAIN_CUDA_UNARY(GeluTanhOp)
HETRAIN_CUDA_UNARY(ErfOp)
HETRAIN_CUDA_UNARY(SiluOp)
#undef HETRAIN_CUDA_UNARY

#define HETRAIN_CUDA_BINARY(Op)                                         \
  template void Binary<Op>::eval_cuda(const std::vector<const Array*>&, \
                                      const std::vector<Array*>&) const;
HETRAIN_CUDA_BINARY(AddOp)
HETRAIN_CUDA_BINARY(SubOp)
HETRAIN_CUDA_BINARY(MulOp)
HETRAIN_CUDA_BINARY(DivOp)
HETRAIN_CUDA_BINARY(PowOp)
HETRAIN_CUDA_BINARY(MaximumOp)
HETRAIN_CUDA_BINARY(MinimumOp)
HETRAIN_CUDA_BINARY(ReluGradOp)
HETRAIN_CUDA_BINARY(GeluTanhGradOp)
HETRAIN_CUDA_BINARY(EqualOp)
HETRAIN_CUDA_BINARY(NotEqualOp)
HETRAIN_CUDA_BINARY(LessOp)
HETRAIN_CUDA_BINARY(LessEqualOp)
HETRAIN_CUDA_BINARY(GreaterOp)
HETRAIN_CUDA_BINARY(GreaterEqualOp)
#undef HETRAIN_CUDA_BINARY

void Where::eval_cuda(const std::vector<const Array*>& in, const std::vector<Array*>& out) const {
  const Array &c = *in[0], &a = *in[1], &b = *in[2];
  Array& y = *out[0];
  y.allocate();
  cuda::launch_where(a.dtype, cuda::make_iter(a.shape, {&y, &c, &a, &b}), y.raw(), c.raw(), a.raw(),
                     b.raw(), cuda::stream());
}

void Cast::eval_cuda(const std::vector<const Array*>& in, const std::vector<Array*>& out) const {
  out[0]->allocate();
  cuda::copy_strided(*in[0], *out[0]);
}

void Concat::eval_cuda(const std::vector<const Array*>& in, const std::vector<Array*>& out) const {
  Array& y = *out[0];
  y.allocate();
  int64_t start = 0;
  for (const Array* x : in) {
    // Write x into the matching slab of y through a strided view, as the CPU kernel.
    Array dst;
    dst.shape = x->shape;
    dst.dtype = y.dtype;
    dst.view_of(y, y.strides, y.offset + start * y.strides[static_cast<size_t>(axis_)]);
    cuda::copy_strided(*x, dst);
    start += x->shape[static_cast<size_t>(axis_)];
  }
}

void SliceScatter::eval_cuda(const std::vector<const Array*>& in,
                             const std::vector<Array*>& out) const {
  Array& y = *out[0];
  y.allocate();
  cuda::zero(y);
  Array dst;
  dst.shape = in[0]->shape;
  dst.dtype = y.dtype;
  Strides st = y.strides;
  const int64_t off = y.offset + start_ * st[static_cast<size_t>(axis_)];
  st[static_cast<size_t>(axis_)] *= step_;
  dst.view_of(y, st, off);
  cuda::copy_strided(*in[0], dst);
}

void Reshape::eval_cuda(const std::vector<const Array*>& in, const std::vector<Array*>& out) const {
  const Array& x = *in[0];
  // A view when the data is contiguous, else a contiguous copy on the device (as eval_cpu).
  const Array c = cuda::contiguous(x);
  out[0]->view_of(c, contiguous_strides(shape_), c.offset);
}

}  // namespace hetrain
