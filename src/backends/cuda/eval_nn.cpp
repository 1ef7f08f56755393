// eval_cuda of reductions, softmax, layer/rms norm, take/index_add (embedding),
// cross-entropy and the fused AdamW step; kernels in reduce.cu and nn.cu.
#include <algorithm>
#include <cmath>

#include "backends/cuda/common.h"
#include "graph/prims/nn.h"
#include "graph/prims/optim.h"
#include "graph/prims/reduce.h"

namespace hetrain {

// ---- reductions ---------------------------------------------------------------------------

void Reduce::eval_cuda(const std::vector<const Array*>& in, const std::vector<Array*>& out) const {
  const Array& x = *in[0];
  Array& y = *out[0];
  y.allocate();
  cuda::ReduceDims d;
  int last = -1;  // the group of the previous axis of size > 1: 0 kept, 1 reduced
  for (size_t i = 0; i < x.shape.size(); ++i) {
    if (x.shape[i] == 1) continue;  // contributes nothing either way
    const bool reduced = std::find(axes_.begin(), axes_.end(), static_cast<int>(i)) != axes_.end();
    int& nd = reduced ? d.red_ndim : d.kept_ndim;
    int64_t* shape = reduced ? d.red_shape : d.kept_shape;
    int64_t* strides = reduced ? d.red_strides : d.kept_strides;
    // An axis that continues the previous one of its group in memory merges into it (the
    // kernels see [B, T, C] summed over B and T as one reduced axis of B * T rows).
    const bool merges =
        last == static_cast<int>(reduced) && nd > 0 && strides[nd - 1] == x.strides[i] * x.shape[i];
    last = static_cast<int>(reduced);
    if (merges) {
      shape[nd - 1] *= x.shape[i];
      strides[nd - 1] = x.strides[i];
      (reduced ? d.reduced : d.outputs) *= x.shape[i];
      continue;
    }
    if (nd == cuda::kMaxDims)
      fail("[", name(), "] the CUDA kernel handles up to ", cuda::kMaxDims,
           " kept and reduced dims of size > 1, got shape ", shape_str(x.shape));
    shape[nd] = x.shape[i];
    strides[nd] = x.strides[i];
    (reduced ? d.reduced : d.outputs) *= x.shape[i];
    ++nd;
  }
  const cuda::ReduceOp op = kind_ == ReduceKind::sum   ? cuda::ReduceOp::sum
                            : kind_ == ReduceKind::max ? cuda::ReduceOp::max
                                                       : cuda::ReduceOp::min;
  const size_t ws_bytes = cuda::reduce_workspace_bytes(d);
  Array ws;
  if (ws_bytes > 0) ws = cuda::device_array({static_cast<int64_t>((ws_bytes + 7) / 8)}, Dtype::f64);
  cuda::launch_reduce(op, x.dtype, d, y.raw(), x.raw(), ws_bytes > 0 ? ws.raw() : nullptr,
                      cuda::stream());
}

void ArgMax::eval_cuda(const std::vector<const Array*>& in, const std::vector<Array*>& out) const {
  const Array x = cuda::contiguous(*in[0]);
  Array& y = *out[0];
  y.allocate();
  const ORI d = split_at(x.shape, axis_);
  cuda::launch_argmax(x.dtype, d.O, d.R, d.I, y.data<int64_t>(), x.raw(), cuda::stream());
}

// ---- softmax, norms -----------------------------------------------------------------------

void Softmax::eval_cuda(const std::vector<const Array*>& in, const std::vector<Array*>& out) const {
  const Array x = cuda::contiguous(*in[0]);
  Array& y = *out[0];
  y.allocate();
  const ORI d = split_at(x.shape, axis_);
  cuda::launch_softmax(x.dtype, log_, d.O, d.R, d.I, y.raw(), x.raw(), cuda::stream());
}

void Norm::eval_cuda(const std::vector<const Array*>& in, const std::vector<Array*>& out) const {
  const Array x = cuda::contiguous(*in[0]);
  Array w, bias;
  size_t k = 1;
  if (has_w_) w = cuda::contiguous(*in[k++]);
  if (has_b_) bias = cuda::contiguous(*in[k++]);
  Array& y = *out[0];
  Array& stats = *out[1];
  y.allocate();
  stats.allocate();
  cuda::launch_norm(x.dtype, center_, stats.shape[0], cols_, eps_, y.raw(), stats.raw(), x.raw(),
                    has_w_ ? w.raw() : nullptr, has_b_ ? bias.raw() : nullptr, cuda::stream());
}

void NormBackward::eval_cuda(const std::vector<const Array*>& in,
                             const std::vector<Array*>& out) const {
  const Array x = cuda::contiguous(*in[0]);
  const Array stats = cuda::contiguous(*in[1]);
  const Array g = cuda::contiguous(*in[2]);
  Array w;
  if (has_w_) w = cuda::contiguous(*in[3]);
  Array& dx = *out[0];
  dx.allocate();
  Array* dw = has_w_ ? out[1] : nullptr;
  Array* db = has_b_ ? out[has_w_ ? 2 : 1] : nullptr;
  if (dw) dw->allocate();
  if (db) db->allocate();
  const int64_t rows = stats.shape[0], n = cols_;
  Array partial;
  if (dw || db)
    partial = cuda::device_array({2 * cuda::norm_backward_chunks(rows) * std::max<int64_t>(n, 1)},
                                 stats.dtype);
  cuda::launch_norm_backward(x.dtype, center_, rows, n, dx.raw(), dw ? dw->raw() : nullptr,
                             db ? db->raw() : nullptr, partial.has_data() ? partial.raw() : nullptr,
                             x.raw(), stats.raw(), g.raw(), has_w_ ? w.raw() : nullptr,
                             cuda::stream());
}

// ---- take / index_add (embedding) ---------------------------------------------------------

void Take::eval_cuda(const std::vector<const Array*>& in, const std::vector<Array*>& out) const {
  const Array x = cuda::contiguous(*in[0]);
  const Array idx = cuda::contiguous(*in[1]);
  const size_t a = static_cast<size_t>(axis_);
  const int64_t O = numel(x.shape, 0, a), V = x.shape[a], I = numel(x.shape, a + 1, x.shape.size());
  // Bounds are checked on a host copy of the indices (a sync), so the error reaches the
  // caller as on the CPU (find_bad_index copies device arrays).
  if (auto bad = find_bad_index(idx, V)) fail_bad_index(op_, *bad, V, axis_);
  Array& y = *out[0];
  y.allocate();
  cuda::launch_take(x.dtype, idx.dtype, O, V, I, idx.numel(), y.raw(), x.raw(), idx.raw(),
                    cuda::stream());
}

void IndexAdd::eval_cuda(const std::vector<const Array*>& in,
                         const std::vector<Array*>& out) const {
  const Array g = cuda::contiguous(*in[0]);
  const Array idx = cuda::contiguous(*in[1]);
  const size_t a = static_cast<size_t>(axis_);
  const int64_t O = numel(full_, 0, a), V = full_[a], I = numel(full_, a + 1, full_.size());
  if (auto bad = find_bad_index(idx, V)) fail_bad_index("index_add", *bad, V, axis_);
  Array& y = *out[0];
  y.allocate();
  if (!is_floating(g.dtype))
    fail("[index_add] does not support dtype ", dtype_name(g.dtype), " (floating point only)");
  // f32/f64 accumulate in y itself; f16/bf16 in an f32 workspace rounded at the end.
  const bool wide = g.dtype == Dtype::f32 || g.dtype == Dtype::f64;
  Array acc = wide ? y : cuda::device_array(full_, Dtype::f32);
  cuda::zero(acc);
  cuda::launch_index_add(g.dtype, idx.dtype, O, V, I, idx.numel(), y.raw(), acc.raw(), g.raw(),
                         idx.raw(), cuda::stream());
}

// ---- cross_entropy ------------------------------------------------------------------------

void CrossEntropy::eval_cuda(const std::vector<const Array*>& in,
                             const std::vector<Array*>& out) const {
  const Array x = cuda::contiguous(*in[0]);
  const Array tg = cuda::contiguous(*in[1]);
  const ORI d = split_at(x.shape, 1);
  if (auto bad = find_bad_index(tg, d.R, ignore_)) fail_bad_index(name(), *bad, d.R, 1, ignore_);
  out[0]->allocate();
  out[1]->allocate();
  cuda::launch_cross_entropy(x.dtype, tg.dtype, d.O, d.R, d.I, ignore_, out[0]->raw(),
                             out[1]->raw(), x.raw(), tg.raw(), cuda::stream());
}

void CrossEntropyBackward::eval_cuda(const std::vector<const Array*>& in,
                                     const std::vector<Array*>& out) const {
  const Array x = cuda::contiguous(*in[0]);
  const Array tg = cuda::contiguous(*in[1]);
  const Array lse = cuda::contiguous(*in[2]);
  const Array g = cuda::contiguous(*in[3]);
  const ORI d = split_at(x.shape, 1);
  out[0]->allocate();
  cuda::launch_cross_entropy_backward(x.dtype, tg.dtype, d.O, d.R, d.I, ignore_, out[0]->raw(),
                                      x.raw(), tg.raw(), lse.raw(), g.raw(), cuda::stream());
}

// ---- adamw --------------------------------------------------------------------------------

void AdamWUpdate::eval_cuda(const std::vector<const Array*>& in,
                            const std::vector<Array*>& out) const {
  Array x[4];
  for (size_t i = 0; i < 4; ++i) x[i] = cuda::contiguous(*in[i]);
  for (Array* o : out) o->allocate();
  // The CPU kernel's scalars, computed in double and rounded to the compute type.
  cuda::AdamWScalars s;
  s.b1 = a_.beta1;
  s.b2 = a_.beta2;
  s.one_b1 = 1.0 - a_.beta1;
  s.one_b2 = 1.0 - a_.beta2;
  s.keep = 1.0 - a_.lr * a_.weight_decay;
  s.inv_sqrt_bc2 = 1.0 / std::sqrt(a_.bias_correction2);
  s.eps = a_.eps;
  s.step = a_.lr / a_.bias_correction1;
  s.decay = a_.weight_decay != 0;
  cuda::launch_adamw(x[0].dtype, x[0].numel(), s, out[0]->raw(), out[1]->raw(), out[2]->raw(),
                     x[0].raw(), x[1].raw(), x[2].raw(), x[3].raw(), cuda::stream());
}

}  // namespace hetrain
