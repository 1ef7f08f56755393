// eval_cuda of the fused batch norm forward and backward; kernels in norm2d.cu.
#include <algorithm>

#include "backends/cuda/common.h"
#include "graph/prims/norm2d.h"

namespace hetrain {

namespace {
cuda::BatchNormDims bn_dims(const Shape& x) { return {x[0], x[1], x[2] * x[3]}; }

/// Workspace of the batch-norm launchers, in the stats dtype.
Array bn_workspace(const cuda::BatchNormDims& d, Dtype stats) {
  return cuda::device_array({std::max<int64_t>(cuda::batch_norm_workspace(d), 1)}, stats);
}
}  // namespace

void BatchNorm2d::eval_cuda(const std::vector<const Array*>& in,
                            const std::vector<Array*>& out) const {
  const Array x = cuda::contiguous(*in[0]), w = cuda::contiguous(*in[1]),
              b = cuda::contiguous(*in[2]);
  Array &y = *out[0], &mean = *out[1], &var = *out[2];
  y.allocate();
  mean.allocate();
  var.allocate();
  const cuda::BatchNormDims d = bn_dims(x.shape);
  Array ws = bn_workspace(d, mean.dtype);
  // A residual joins after the kernel (then the relu): two elementwise passes more than a
  // fused kernel would take.
  cuda::launch_batch_norm(x.dtype, d, eps_, relu_ && !residual_, y.raw(), mean.raw(), var.raw(),
                          ws.raw(), x.raw(), w.raw(), b.raw(), cuda::stream());
  if (residual_) {
    const Array r = cuda::contiguous(*in[3]);
    cuda::launch_binary(cuda::BinaryOp::add, y.dtype, cuda::make_iter(y.shape, {&y, &y, &r}),
                        y.raw(), y.raw(), r.raw(), cuda::stream());
    if (relu_)
      cuda::launch_unary(cuda::UnaryOp::relu, y.dtype, cuda::make_iter(y.shape, {&y, &y}), y.raw(),
                         y.raw(), cuda::stream());
  }
}

void BatchNorm2dBackward::eval_cuda(const std::vector<const Array*>& in,
                                    const std::vector<Array*>& out) const {
  const Array x = cuda::contiguous(*in[0]), mean = cuda::contiguous(*in[1]),
              var = cuda::contiguous(*in[2]), g = cuda::contiguous(*in[3]),
              w = cuda::contiguous(*in[4]), b = cuda::contiguous(*in[5]);
  Array &dx = *out[0], &dw = *out[1], &db = *out[2];
  dx.allocate();
  dw.allocate();
  db.allocate();
  const cuda::BatchNormDims d = bn_dims(x.shape);
  Array ws = bn_workspace(d, mean.dtype);
  cuda::launch_batch_norm_backward(x.dtype, d, eps_, relu_, dx.raw(), dw.raw(), db.raw(), ws.raw(),
                                   x.raw(), mean.raw(), var.raw(), g.raw(), w.raw(), b.raw(),
                                   cuda::stream());
}

}  // namespace hetrain
