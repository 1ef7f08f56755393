#include "hetrain/graph/primitive.h"

#include "hetrain/base/error.h"

namespace hetrain {

Cost Primitive::cost(const std::vector<TensorMeta>& in, const std::vector<TensorMeta>& out) const {
  Cost c;
  for (const auto& m : in)
    c.bytes_read += static_cast<double>(numel(m.shape) * dtype_size(m.dtype));
  for (const auto& m : out) {
    c.bytes_written += static_cast<double>(numel(m.shape) * dtype_size(m.dtype));
    c.flops += static_cast<double>(numel(m.shape));
  }
  return c;
}

void Primitive::eval_cuda(const std::vector<const Array*>& in,
                          const std::vector<Array*>& out) const {
  // A view only sets shape, strides and offset: the same on any memory node.
  if (is_view()) return eval_cpu(in, out);
  fail("[", name(), "] no CUDA kernel for ", name(),
       " (run it on the CPU: pin it there or leave placement to the scheduler)");
}

std::vector<Tensor> Primitive::vjp(const std::vector<Tensor>&, const std::vector<Tensor>&,
                                   const std::vector<Tensor>&, const std::vector<int>&) const {
  fail("[", name(), "] has no gradient");
}

}  // namespace hetrain
