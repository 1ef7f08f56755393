// eval_cuda of the fused attention forward and backward; kernels in attention.cu.
#include "graph/prims/attention.h"

#include "backends/cuda/common.h"

namespace hetrain {

namespace {
cuda::AttentionDims attention_dims(const Shape& q, const Shape& v, bool causal) {
  const size_t n = q.size();
  cuda::AttentionDims g{1, q[n - 2], v[n - 2], q[n - 1], v[n - 1], causal};
  for (size_t d = 0; d + 2 < n; ++d) g.B *= q[d];
  return g;
}
}  // namespace

void SdpaForward::eval_cuda(const std::vector<const Array*>& in,
                            const std::vector<Array*>& out) const {
  const Array q = cuda::contiguous(*in[0]), k = cuda::contiguous(*in[1]),
              v = cuda::contiguous(*in[2]);
  Array& o = *out[0];
  Array& lse = *out[1];
  o.allocate();
  lse.allocate();
  cuda::launch_attention(q.dtype, attention_dims(q.shape, v.shape, causal_), scale_, o.raw(),
                         lse.raw(), q.raw(), k.raw(), v.raw(), cuda::stream());
}

void SdpaBackward::eval_cuda(const std::vector<const Array*>& in,
                             const std::vector<Array*>& out) const {
  const Array q = cuda::contiguous(*in[0]), k = cuda::contiguous(*in[1]),
              v = cuda::contiguous(*in[2]), o = cuda::contiguous(*in[3]),
              dout = cuda::contiguous(*in[4]), lse = cuda::contiguous(*in[5]);
  for (Array* a : out) a->allocate();
  const cuda::AttentionDims g = attention_dims(q.shape, v.shape, causal_);
  Array d_rows = cuda::device_array({std::max<int64_t>(g.B * g.Lq, 1)}, lse.dtype);
  cuda::launch_attention_backward(q.dtype, g, scale_, out[0]->raw(), out[1]->raw(), out[2]->raw(),
                                  d_rows.raw(), q.raw(), k.raw(), v.raw(), o.raw(), dout.raw(),
                                  lse.raw(), cuda::stream());
}

}  // namespace hetrain
