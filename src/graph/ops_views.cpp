// View ops, copies, casts, concat and split.
#include <algorithm>
#include <numeric>

#include "graph/prims/elementwise.h"
#include "graph/prims/views.h"
#include "hetrain/graph/ops.h"

namespace hetrain {

// ---- Reshape ------------------------------------------------------------------------------
std::vector<TensorMeta> Reshape::infer(const std::vector<TensorMeta>& in) const {
  return {{shape_, in[0].dtype}};
}
void Reshape::eval_cpu(const std::vector<const Array*>& in, const std::vector<Array*>& out) const {
  const Array& x = *in[0];
  if (x.contiguous()) {
    out[0]->view_of(x, contiguous_strides(shape_), x.offset);
  } else {
    Array c = contiguous_array(x);
    out[0]->view_of(c, contiguous_strides(shape_), c.offset);
  }
}
std::vector<Tensor> Reshape::vjp(const std::vector<Tensor>& x, const std::vector<Tensor>&,
                                 const std::vector<Tensor>& g, const std::vector<int>&) const {
  return {reshape(g[0], x[0].shape())};
}

Tensor reshape(const Tensor& x, Shape shape) {
  int64_t known = 1;
  int infer_at = -1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      if (infer_at >= 0) fail("[reshape] only one dimension can be -1 in ", shape_str(shape));
      infer_at = static_cast<int>(i);
    } else if (shape[i] < 0) {
      fail("[reshape] invalid dimension ", shape[i], " in ", shape_str(shape));
    } else {
      known *= shape[i];
    }
  }
  if (infer_at >= 0) {
    if (known == 0 || x.numel() % known != 0)
      fail("[reshape] cannot reshape ", shape_str(x.shape()), " to ", shape_str(shape));
    shape[static_cast<size_t>(infer_at)] = x.numel() / known;
  }
  if (numel(shape) != x.numel())
    fail("[reshape] cannot reshape ", shape_str(x.shape()), " to ", shape_str(shape));
  if (shape == x.shape()) return x;
  return make_node1(std::make_shared<Reshape>(std::move(shape)), {x});
}

Tensor flatten(const Tensor& x, int64_t start, int64_t end) {
  if (x.ndim() == 0) return reshape(x, {1});
  int s = normalize_axis(start, x.shape().size(), "flatten");
  int e = normalize_axis(end, x.shape().size(), "flatten");
  if (s > e) fail("[flatten] start axis ", start, " is after end axis ", end);
  Shape out(x.shape().begin(), x.shape().begin() + s);
  int64_t m = 1;
  for (int i = s; i <= e; ++i) m *= x.shape()[static_cast<size_t>(i)];
  out.push_back(m);
  out.insert(out.end(), x.shape().begin() + e + 1, x.shape().end());
  return reshape(x, out);
}

Tensor squeeze(const Tensor& x, int64_t axis) {
  int a = normalize_axis(axis, x.shape().size(), "squeeze");
  if (x.shape()[static_cast<size_t>(a)] != 1)
    fail("[squeeze] axis ", axis, " has size ", x.shape()[static_cast<size_t>(a)], ", not 1");
  Shape s = x.shape();
  s.erase(s.begin() + a);
  return reshape(x, s);
}

Tensor unsqueeze(const Tensor& x, int64_t axis) {
  int a = normalize_axis(axis, x.shape().size() + 1, "unsqueeze");
  Shape s = x.shape();
  s.insert(s.begin() + a, 1);
  return reshape(x, s);
}

// ---- Permute ------------------------------------------------------------------------------
std::vector<TensorMeta> Permute::infer(const std::vector<TensorMeta>& in) const {
  Shape s(dims_.size());
  for (size_t i = 0; i < dims_.size(); ++i) s[i] = in[0].shape[static_cast<size_t>(dims_[i])];
  return {{s, in[0].dtype}};
}
void Permute::eval_cpu(const std::vector<const Array*>& in, const std::vector<Array*>& out) const {
  Strides st(dims_.size());
  for (size_t i = 0; i < dims_.size(); ++i) st[i] = in[0]->strides[static_cast<size_t>(dims_[i])];
  out[0]->view_of(*in[0], st, in[0]->offset);
}
std::vector<Tensor> Permute::vjp(const std::vector<Tensor>&, const std::vector<Tensor>&,
                                 const std::vector<Tensor>& g, const std::vector<int>&) const {
  std::vector<int64_t> inv(dims_.size());
  for (size_t i = 0; i < dims_.size(); ++i)
    inv[static_cast<size_t>(dims_[i])] = static_cast<int64_t>(i);
  return {permute(g[0], inv)};
}

Tensor permute(const Tensor& x, std::vector<int64_t> dims) {
  if (dims.size() != x.shape().size())
    fail("[permute] got ", dims.size(), " dims for a tensor of shape ", shape_str(x.shape()));
  std::vector<int> d;
  std::vector<bool> seen(dims.size(), false);
  bool identity = true;
  for (size_t i = 0; i < dims.size(); ++i) {
    int a = normalize_axis(dims[i], dims.size(), "permute");
    if (seen[static_cast<size_t>(a)]) fail("[permute] axis ", dims[i], " repeated");
    seen[static_cast<size_t>(a)] = true;
    identity = identity && a == static_cast<int>(i);
    d.push_back(a);
  }
  if (identity) return x;
  // A permutation undoing the one x was made by gives x's source back (the transpose of a
  // transpose), rather than a view of a view: a fused epilogue can then take the source's
  // producer (a weight's gradient as (gᵀ a)ᵀ, transposed back, then cast to f32).
  if (const Node* n = x.node(); n->prim && n->inputs.size() == 1) {
    if (const auto* p = dynamic_cast<const Permute*>(n->prim.get())) {
      bool undoes = true;
      for (size_t i = 0; i < d.size(); ++i)
        undoes = undoes && p->dims()[static_cast<size_t>(d[i])] == static_cast<int>(i);
      if (undoes) return n->inputs[0];
    }
  }
  return make_node1(std::make_shared<Permute>(std::move(d)), {x});
}

Tensor transpose(const Tensor& x, int64_t a, int64_t b) {
  std::vector<int64_t> dims(x.shape().size());
  std::iota(dims.begin(), dims.end(), 0);
  int aa = normalize_axis(a, dims.size(), "transpose"),
      bb = normalize_axis(b, dims.size(), "transpose");
  std::swap(dims[static_cast<size_t>(aa)], dims[static_cast<size_t>(bb)]);
  return permute(x, dims);
}

// ---- Slice ------------------------------------------------------------------------------
std::vector<TensorMeta> Slice::infer(const std::vector<TensorMeta>& in) const {
  Shape s = in[0].shape;
  s[static_cast<size_t>(axis_)] = len_;
  return {{s, in[0].dtype}};
}
void Slice::eval_cpu(const std::vector<const Array*>& in, const std::vector<Array*>& out) const {
  Strides st = in[0]->strides;
  int64_t off = in[0]->offset + start_ * st[static_cast<size_t>(axis_)];
  st[static_cast<size_t>(axis_)] *= step_;
  out[0]->view_of(*in[0], st, off);
}
std::vector<Tensor> Slice::vjp(const std::vector<Tensor>& x, const std::vector<Tensor>&,
                               const std::vector<Tensor>& g, const std::vector<int>&) const {
  return {make_node1(std::make_shared<SliceScatter>(x[0].shape(), axis_, start_, step_), {g[0]})};
}
std::vector<Tensor> SliceScatter::vjp(const std::vector<Tensor>& x, const std::vector<Tensor>&,
                                      const std::vector<Tensor>& g, const std::vector<int>&) const {
  int64_t len = x[0].shape()[static_cast<size_t>(axis_)];
  return {make_node1(std::make_shared<Slice>(axis_, start_, len, step_), {g[0]})};
}

Tensor slice(const Tensor& x, int64_t axis, int64_t start, int64_t stop, int64_t step) {
  int a = normalize_axis(axis, x.shape().size(), "slice");
  if (step <= 0) fail("[slice] step must be positive, got ", step);
  int64_t n = x.shape()[static_cast<size_t>(a)];
  auto clampi = [n](int64_t i) {
    if (i < 0) i += n;
    return std::clamp<int64_t>(i, 0, n);
  };
  start = clampi(start);
  stop = clampi(stop);
  int64_t len = stop > start ? (stop - start + step - 1) / step : 0;
  if (start == 0 && len == n && step == 1) return x;
  return make_node1(std::make_shared<Slice>(a, start, len, step), {x});
}

// ---- BroadcastTo --------------------------------------------------------------------------
std::vector<TensorMeta> BroadcastTo::infer(const std::vector<TensorMeta>& in) const {
  const Shape& s = in[0].shape;
  if (s.size() > shape_.size())
    fail("[broadcast_to] cannot broadcast ", shape_str(s), " to ", shape_str(shape_));
  size_t lead = shape_.size() - s.size();
  for (size_t i = 0; i < s.size(); ++i)
    if (s[i] != 1 && s[i] != shape_[lead + i])
      fail("[broadcast_to] cannot broadcast ", shape_str(s), " to ", shape_str(shape_));
  return {{shape_, in[0].dtype}};
}
void BroadcastTo::eval_cpu(const std::vector<const Array*>& in,
                           const std::vector<Array*>& out) const {
  const Array& x = *in[0];
  size_t lead = shape_.size() - x.shape.size();
  Strides st(shape_.size(), 0);
  for (size_t i = 0; i < x.shape.size(); ++i)
    st[lead + i] = (x.shape[i] == 1 && shape_[lead + i] != 1) ? 0 : x.strides[i];
  out[0]->view_of(x, st, x.offset);
}
std::vector<Tensor> BroadcastTo::vjp(const std::vector<Tensor>& x, const std::vector<Tensor>&,
                                     const std::vector<Tensor>& g, const std::vector<int>&) const {
  return {sum_to(g[0], x[0].shape())};
}

Tensor broadcast_to(const Tensor& x, const Shape& shape) {
  if (x.shape() == shape) return x;
  return make_node1(std::make_shared<BroadcastTo>(shape), {x});
}

Tensor expand(const Tensor& x, const Shape& shape) {
  Shape s = shape;
  size_t lead = s.size() >= x.shape().size() ? s.size() - x.shape().size() : 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == -1) {
      if (i < lead) fail("[expand] -1 is not allowed for a new leading dimension");
      s[i] = x.shape()[i - lead];
    }
  }
  return broadcast_to(x, s);
}

// ---- copies -------------------------------------------------------------------------------
Tensor cast(const Tensor& x, Dtype dtype) {
  if (x.dtype() == dtype) return x;
  return make_node1(std::make_shared<Cast>(dtype), {x});
}
Tensor copy(const Tensor& x) { return make_node1(std::make_shared<Cast>(x.dtype()), {x}); }

// ---- Concat ------------------------------------------------------------------------------
std::vector<TensorMeta> Concat::infer(const std::vector<TensorMeta>& in) const {
  Shape s = in[0].shape;
  int64_t total = 0;
  for (size_t k = 0; k < in.size(); ++k) {
    const Shape& t = in[k].shape;
    if (t.size() != s.size() || in[k].dtype != in[0].dtype)
      fail("[concat] input ", k, " ", shape_str(t), " ", dtype_name(in[k].dtype),
           " does not match input 0 ", shape_str(s), " ", dtype_name(in[0].dtype));
    for (size_t i = 0; i < s.size(); ++i)
      if (static_cast<int>(i) != axis_ && t[i] != s[i])
        fail("[concat] input ", k, " has shape ", shape_str(t), " but input 0 has ", shape_str(s),
             "; only axis ", axis_, " may differ");
    total += t[static_cast<size_t>(axis_)];
  }
  s[static_cast<size_t>(axis_)] = total;
  return {{s, in[0].dtype}};
}
std::vector<Tensor> Concat::vjp(const std::vector<Tensor>& x, const std::vector<Tensor>&,
                                const std::vector<Tensor>& g,
                                const std::vector<int>& argnums) const {
  std::vector<int64_t> starts{0};
  for (const auto& t : x) starts.push_back(starts.back() + t.shape()[static_cast<size_t>(axis_)]);
  std::vector<Tensor> r;
  for (int a : argnums)
    r.push_back(
        slice(g[0], axis_, starts[static_cast<size_t>(a)], starts[static_cast<size_t>(a) + 1]));
  return r;
}

Tensor concat(const std::vector<Tensor>& xs, int64_t axis) {
  if (xs.empty()) fail("[concat] needs at least one tensor");
  if (xs.size() == 1) return xs[0];
  int a = normalize_axis(axis, xs[0].shape().size(), "concat");
  Dtype dt = xs[0].dtype();
  for (const auto& t : xs) dt = promote_types(dt, t.dtype());
  std::vector<Tensor> in;
  for (const auto& t : xs) in.push_back(cast(t, dt));
  return make_node1(std::make_shared<Concat>(a), std::move(in));
}

std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t axis) {
  int a = normalize_axis(axis, x.shape().size(), "split");
  int64_t total = 0;
  for (auto s : sizes) {
    if (s < 0) fail("[split] negative size ", s);
    total += s;
  }
  if (total != x.shape()[static_cast<size_t>(a)])
    fail("[split] sizes add up to ", total, " but axis ", axis, " of ", shape_str(x.shape()),
         " has ", x.shape()[static_cast<size_t>(a)]);
  std::vector<Tensor> r;
  int64_t start = 0;
  for (auto s : sizes) {
    r.push_back(slice(x, a, start, start + s));
    start += s;
  }
  return r;
}

}  // namespace hetrain
