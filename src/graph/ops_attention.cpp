// scaled_dot_product_attention: argument checks, shape inference, cost, vjp, and the unfused
// reference composition.
#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

#include "graph/prims/attention.h"
#include "hetrain/graph/ops.h"

namespace hetrain {

namespace {

constexpr const char* kOp = "scaled_dot_product_attention";

Dtype lse_dtype(Dtype dt) { return dt == Dtype::f64 ? Dtype::f64 : Dtype::f32; }

std::string fmt_scale(bool causal, double scale, int64_t heads) {
  std::ostringstream os;
  os << "scale=" << scale << (causal ? " causal" : "");
  if (heads > 0) os << " packed heads=" << heads;
  return os.str();
}

/// Flops of the forward: two GEMMs (q k^T and p v) over the visible (i, j) pairs.
double attention_flops(const Shape& q, const Shape& v, bool causal) {
  const double lq = static_cast<double>(q[q.size() - 2]), lk = static_cast<double>(v[v.size() - 2]);
  const double e = static_cast<double>(q.back()), ev = static_cast<double>(v.back());
  const double batch = static_cast<double>(numel(q)) / std::max(1.0, lq * e);
  double pairs = lq * lk;
  if (causal) {
    const double m = std::min(lq, lk);  // rows i < lk see i + 1 keys, later rows all lk
    pairs = m * (m + 1) / 2 + (lq - m) * lk;
  }
  return batch * pairs * (2 * e + 2 * ev + 4);
}

/// The (batch-heads, L, d) shape of each of q, k and v in a packed (N, L, 3D) projection.
Shape packed_head_shape(const Shape& qkv, int64_t heads) {
  return {qkv[0] * heads, qkv[1], qkv[2] / 3 / heads};
}

}  // namespace

std::vector<TensorMeta> SdpaForward::infer(const std::vector<TensorMeta>& in) const {
  if (heads_ > 0) {
    const Shape& x = in[0].shape;
    HT_ASSERT(in.size() == 1 && x.size() == 3 && x[2] % (3 * heads_) == 0);
    return {{{x[0], x[1], x[2] / 3}, in[0].dtype}, {{x[0], heads_, x[1]}, lse_dtype(in[0].dtype)}};
  }
  const Shape &q = in[0].shape, &k = in[1].shape, &v = in[2].shape;
  HT_ASSERT(q.size() >= 2 && q.size() == k.size() && k.size() == v.size());
  HT_ASSERT(in[0].dtype == in[1].dtype && in[1].dtype == in[2].dtype);
  Shape o = q;
  o.back() = v.back();
  Shape lse(q.begin(), q.end() - 1);
  return {{o, in[0].dtype}, {lse, lse_dtype(in[0].dtype)}};
}

Cost SdpaForward::cost(const std::vector<TensorMeta>& in,
                       const std::vector<TensorMeta>& out) const {
  Cost c = Primitive::cost(in, out);
  if (heads_ > 0) {
    const Shape h = packed_head_shape(in[0].shape, heads_);
    c.flops = attention_flops(h, h, causal_);
  } else {
    c.flops = attention_flops(in[0].shape, in[2].shape, causal_);
  }
  return c;
}

std::string SdpaForward::attrs() const { return fmt_scale(causal_, scale_, heads_); }
std::string SdpaBackward::attrs() const { return fmt_scale(causal_, scale_, heads_); }

std::vector<Tensor> SdpaForward::vjp(const std::vector<Tensor>& x, const std::vector<Tensor>& y,
                                     const std::vector<Tensor>& g,
                                     const std::vector<int>& argnums) const {
  std::vector<Tensor> r;
  if (!g[0].defined()) {  // only lse received a cotangent; it is internal and unused
    for (int i : argnums) r.push_back(zeros_like(x[static_cast<size_t>(i)]));
    return r;
  }
  auto grads = heads_ > 0 ? make_node(std::make_shared<SdpaBackward>(causal_, scale_, heads_),
                                      {x[0], y[0], cast(g[0], y[0].dtype()), y[1]})
                          : make_node(std::make_shared<SdpaBackward>(causal_, scale_),
                                      {x[0], x[1], x[2], y[0], cast(g[0], y[0].dtype()), y[1]});
  for (int i : argnums) r.push_back(grads[static_cast<size_t>(i)]);
  return r;
}

std::vector<TensorMeta> SdpaBackward::infer(const std::vector<TensorMeta>& in) const {
  if (heads_ > 0) {
    HT_ASSERT(in.size() == 4 && in[2].shape == in[1].shape);
    return {in[0]};
  }
  HT_ASSERT(in.size() == 6 && in[4].shape == in[3].shape);
  return {in[0], in[1], in[2]};
}

Cost SdpaBackward::cost(const std::vector<TensorMeta>& in,
                        const std::vector<TensorMeta>& out) const {
  Cost c = Primitive::cost(in, out);
  // Recomputing q k^T plus four GEMMs: 2.5x the forward.
  if (heads_ > 0) {
    const Shape h = packed_head_shape(in[0].shape, heads_);
    c.flops = 2.5 * attention_flops(h, h, causal_);
  } else {
    c.flops = 2.5 * attention_flops(in[0].shape, in[2].shape, causal_);
  }
  return c;
}

namespace {

struct Prepared {
  Tensor q, k, v;
  double scale;
};

Prepared check_and_prepare(const Tensor& q, const Tensor& k, const Tensor& v,
                           std::optional<double> scale) {
  if (q.ndim() < 2 || k.ndim() < 2 || v.ndim() < 2)
    fail("[", kOp, "] q, k and v need at least 2 dimensions (..., L, E), got q ",
         shape_str(q.shape()), ", k ", shape_str(k.shape()), ", v ", shape_str(v.shape()));
  if (!is_floating(q.dtype()) || !is_floating(k.dtype()) || !is_floating(v.dtype()))
    fail("[", kOp, "] needs floating-point q, k and v, got ", dtype_name(q.dtype()), ", ",
         dtype_name(k.dtype()), " and ", dtype_name(v.dtype()));
  const Shape &qs = q.shape(), &ks = k.shape(), &vs = v.shape();
  if (qs.back() != ks.back())
    fail("[", kOp, "] q and k differ in embedding size: q ", shape_str(qs), ", k ", shape_str(ks));
  if (ks[ks.size() - 2] != vs[vs.size() - 2])
    fail("[", kOp, "] k and v differ in sequence length: k ", shape_str(ks), ", v ", shape_str(vs));
  if (ks[ks.size() - 2] == 0) fail("[", kOp, "] k and v are empty: k ", shape_str(ks));
  Shape qb(qs.begin(), qs.end() - 2), kb(ks.begin(), ks.end() - 2), vb(vs.begin(), vs.end() - 2);
  Shape batch;
  try {
    batch = broadcast_shapes(broadcast_shapes(qb, kb, kOp), vb, kOp);
  } catch (const Error&) {
    fail("[", kOp, "] batch dimensions do not broadcast: q ", shape_str(qs), ", k ", shape_str(ks),
         ", v ", shape_str(vs));
  }
  Dtype dt = promote_types(promote_types(q.dtype(), k.dtype()), v.dtype());
  auto full_shape = [&](const Shape& s) {
    Shape r = batch;
    r.insert(r.end(), s.end() - 2, s.end());
    return r;
  };
  Prepared p;
  p.q = broadcast_to(cast(q, dt), full_shape(qs));
  p.k = broadcast_to(cast(k, dt), full_shape(ks));
  p.v = broadcast_to(cast(v, dt), full_shape(vs));
  p.scale = scale ? *scale : 1.0 / std::sqrt(static_cast<double>(qs.back()));
  return p;
}

}  // namespace

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                                    std::optional<double> scale) {
  Prepared p = check_and_prepare(q, k, v, scale);
  return make_node(std::make_shared<SdpaForward>(causal, p.scale), {p.q, p.k, p.v})[0];
}

Tensor scaled_dot_product_attention_packed(const Tensor& qkv, int64_t heads, bool causal,
                                           std::optional<double> scale) {
  constexpr const char* op = "scaled_dot_product_attention_packed";
  const Shape& s = qkv.shape();
  if (heads <= 0) fail("[", op, "] heads must be positive, got ", heads);
  if (s.size() != 3 || s[2] % (3 * heads) != 0 || s[1] == 0)
    fail("[", op, "] expected qkv (N, L, 3 * D) with L > 0 and D a multiple of ", heads,
         " heads, got ", shape_str(s));
  if (!is_floating(qkv.dtype()))
    fail("[", op, "] needs a floating-point qkv, got ", dtype_name(qkv.dtype()));
  const double d = static_cast<double>(s[2] / 3 / heads);
  return make_node(
      std::make_shared<SdpaForward>(causal, scale ? *scale : 1.0 / std::sqrt(d), heads), {qkv})[0];
}

Tensor scaled_dot_product_attention_reference(const Tensor& q, const Tensor& k, const Tensor& v,
                                              bool causal, std::optional<double> scale) {
  Prepared p = check_and_prepare(q, k, v, scale);
  Tensor s = matmul(p.q, transpose(p.k, -1, -2)) * p.scale;
  if (causal) {
    const int64_t lq = p.q.size(-2), lk = p.k.size(-2);
    Tensor i = reshape(arange(0, static_cast<double>(lq), 1, Dtype::i64), {lq, 1});
    Tensor j = reshape(arange(0, static_cast<double>(lk), 1, Dtype::i64), {1, lk});
    Tensor ninf = full({}, -std::numeric_limits<double>::infinity(), s.dtype());
    s = where(less_equal(j, i), s, ninf);
  }
  // Softmax from simple ops; the shift by the row max does not change the value or gradient.
  Tensor m = max(s, {-1}, true);
  Tensor e = exp(s - m);
  Tensor pr = e / sum(e, {-1}, true);
  return matmul(pr, p.v);
}

}  // namespace hetrain
