// eval_cuda of the fused attention forward and backward; kernels in attention.cu.
#include "backends/cuda/common.h"
#include "graph/prims/attention.h"

namespace hetrain {

namespace {
cuda::AttentionDims attention_dims(const Shape& q, const Shape& v, bool causal) {
  const size_t n = q.size();
  cuda::AttentionDims g{1, q[n - 2], v[n - 2], q[n - 1], v[n - 1], causal};
  for (size_t d = 0; d + 2 < n; ++d) g.B *= q[d];
  return g;
}

/// Part `part` of a packed (N, L, parts * D) array (contiguous), heads of D / heads columns, as
/// an (N, heads, L, D / heads) view.
Array head_view(const Array& a, int64_t heads, int64_t parts, int64_t part) {
  const int64_t N = a.shape[0], L = a.shape[1], W = a.shape[2], D = W / parts, d = D / heads;
  Array v;
  v.shape = {N, heads, L, d};
  v.dtype = a.dtype;
  v.tag = a.tag;
  v.view_of(a, {L * W, d, W, 1}, a.offset + part * D);
  return v;
}
}  // namespace

// The packed layout (heads_ > 0) gathers q, k and v into (N, H, L, d) arrays and scatters the
// results back: the CUDA kernels take contiguous heads.
void SdpaForward::eval_cuda(const std::vector<const Array*>& in,
                            const std::vector<Array*>& out) const {
  if (heads_ > 0) {
    const Array qkv = cuda::contiguous(*in[0]);
    const Array q = cuda::contiguous(head_view(qkv, heads_, 3, 0)),
                k = cuda::contiguous(head_view(qkv, heads_, 3, 1)),
                v = cuda::contiguous(head_view(qkv, heads_, 3, 2));
    Array o = cuda::device_array(q.shape, q.dtype);
    Array& lse = *out[1];
    lse.allocate();
    cuda::launch_attention(q.dtype, attention_dims(q.shape, v.shape, causal_), scale_, o.raw(),
                           lse.raw(), q.raw(), k.raw(), v.raw(), cuda::stream());
    out[0]->allocate();
    Array dst = head_view(*out[0], heads_, 1, 0);
    cuda::copy_strided(o, dst);
    return;
  }
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
  if (heads_ > 0) {  // inputs qkv, o, do, lse; output dqkv
    const Array qkv = cuda::contiguous(*in[0]), o2 = cuda::contiguous(*in[1]),
                do2 = cuda::contiguous(*in[2]), lse = cuda::contiguous(*in[3]);
    Array parts[3], grads[3];
    for (int64_t p = 0; p < 3; ++p) {
      parts[p] = cuda::contiguous(head_view(qkv, heads_, 3, p));
      grads[p] = cuda::device_array(parts[p].shape, parts[p].dtype);
    }
    const Array o = cuda::contiguous(head_view(o2, heads_, 1, 0)),
                dout = cuda::contiguous(head_view(do2, heads_, 1, 0));
    const cuda::AttentionDims g = attention_dims(parts[0].shape, parts[2].shape, causal_);
    Array d_rows = cuda::device_array({std::max<int64_t>(g.B * g.Lq, 1)}, lse.dtype);
    cuda::launch_attention_backward(parts[0].dtype, g, scale_, grads[0].raw(), grads[1].raw(),
                                    grads[2].raw(), d_rows.raw(), parts[0].raw(), parts[1].raw(),
                                    parts[2].raw(), o.raw(), dout.raw(), lse.raw(), cuda::stream());
    out[0]->allocate();
    for (int64_t p = 0; p < 3; ++p) {
      Array dst = head_view(*out[0], heads_, 3, p);
      cuda::copy_strided(grads[p], dst);
    }
    return;
  }
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
