// matmul and linear.

#include "graph/prims/linalg.h"
#include "graph/prims/views.h"
#include "hetrain/graph/ops.h"

namespace hetrain {

std::vector<TensorMeta> Matmul::infer(const std::vector<TensorMeta>& in) const {
  const Shape &a = in[0].shape, &b = in[1].shape;
  if (a.size() < 2 || a.size() != b.size() || in[0].dtype != in[1].dtype)
    fail("[matmul] internal: operands not prepared");
  Shape out = a;
  out.back() = b.back();
  return {{out, in[0].dtype}};
}

Cost Matmul::cost(const std::vector<TensorMeta>& in, const std::vector<TensorMeta>& out) const {
  Cost c = Primitive::cost(in, out);
  const Shape& a = in[0].shape;
  double k = static_cast<double>(a.back());
  c.flops = 2.0 * k * static_cast<double>(numel(out[0].shape));
  return c;
}

std::vector<Tensor> Matmul::vjp(const std::vector<Tensor>& x, const std::vector<Tensor>&,
                                const std::vector<Tensor>& g,
                                const std::vector<int>& argnums) const {
  std::vector<Tensor> r;
  for (int i : argnums) {
    if (i == 0)
      r.push_back(matmul(g[0], transpose(x[1], -1, -2)));
    else if (x[1].ndim() == 2 && x[0].ndim() == 2 &&
             dynamic_cast<const Permute*>(x[1].node()->prim.get()))
      // b is a transposed weight (linear): produce its gradient as (gᵀ a)ᵀ, so that the
      // transpose's own vjp yields the weight's gradient contiguous (no copy at the leaf).
      r.push_back(transpose(matmul(transpose(g[0], -1, -2), x[0]), -1, -2));
    else
      r.push_back(matmul(transpose(x[0], -1, -2), g[0]));
  }
  return r;
}

Tensor matmul(const Tensor& a_in, const Tensor& b_in) {
  if (a_in.ndim() == 0 || b_in.ndim() == 0)
    fail("[matmul] operands must have at least 1 dimension");
  if (!is_floating(a_in.dtype()) || !is_floating(b_in.dtype()))
    fail("[matmul] needs floating-point operands, got ", dtype_name(a_in.dtype()), " and ",
         dtype_name(b_in.dtype()));
  Tensor a = a_in.ndim() == 1 ? unsqueeze(a_in, 0) : a_in;
  Tensor b = b_in.ndim() == 1 ? unsqueeze(b_in, -1) : b_in;
  const Shape &as = a.shape(), &bs = b.shape();
  if (as.back() != bs[bs.size() - 2])
    fail("[matmul] inner dimensions differ: ", shape_str(a_in.shape()), " @ ",
         shape_str(b_in.shape()));
  if (bs.size() == 2 && as.size() > 2) {
    // A batch of matrices times one matrix is one GEMM with the batch folded into the rows,
    // as PyTorch does. Besides one larger GEMM, b's gradient is then a single GEMM that
    // accumulates over the batch in f32, instead of per-batch products rounded to f16/bf16
    // and summed afterwards.
    int64_t rows = 1;
    for (size_t i = 0; i + 1 < as.size(); ++i) rows *= as[i];
    Shape out_shape(as.begin(), as.end() - 1);
    out_shape.push_back(bs.back());
    Tensor out = reshape(matmul(reshape(a, {rows, as.back()}), b), out_shape);
    if (a_in.ndim() == 1) out = squeeze(out, -2);
    if (b_in.ndim() == 1) out = squeeze(out, -1);
    return out;
  }
  Shape abatch(as.begin(), as.end() - 2), bbatch(bs.begin(), bs.end() - 2);
  Shape batch = broadcast_shapes(abatch, bbatch, "matmul");
  Dtype dt = promote_types(a.dtype(), b.dtype());
  Shape at = batch, bt = batch;
  at.insert(at.end(), as.end() - 2, as.end());
  bt.insert(bt.end(), bs.end() - 2, bs.end());
  Tensor aa = broadcast_to(cast(a, dt), at), bb = broadcast_to(cast(b, dt), bt);
  static const std::shared_ptr<Primitive> prim = std::make_shared<Matmul>();
  Tensor out = make_node1(prim, {aa, bb});
  if (a_in.ndim() == 1) out = squeeze(out, -2);
  if (b_in.ndim() == 1) out = squeeze(out, -1);
  return out;
}

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b) {
  if (w.ndim() != 2) fail("[linear] weight must be 2-D (out, in), got ", shape_str(w.shape()));
  if (x.shape().empty() || x.shape().back() != w.shape()[1])
    fail("[linear] input ", shape_str(x.shape()), " does not match weight ", shape_str(w.shape()),
         ": last dimension must be ", w.shape()[1]);
  Tensor y = matmul(x, transpose(w, 0, 1));
  if (b.defined()) {
    if (b.shape() != Shape{w.shape()[0]})
      fail("[linear] bias must have shape (", w.shape()[0], "), got ", shape_str(b.shape()));
    // The bias joins in the product's dtype (bf16 under bf16 autocast), as one addmm would.
    y = y + (b.dtype() == y.dtype() ? b : cast(b, y.dtype()));
  }
  return y;
}

}  // namespace hetrain
