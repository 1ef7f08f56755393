// Reduction op builders and vjps.
#include <algorithm>
#include <numeric>

#include "graph/prims/reduce.h"
#include "hetrain/graph/ops.h"

namespace hetrain {

Shape reduced_shape(const Shape& s, const std::vector<int>& axes, bool keepdims) {
  Shape out;
  for (size_t i = 0; i < s.size(); ++i) {
    bool r = std::find(axes.begin(), axes.end(), static_cast<int>(i)) != axes.end();
    if (!r)
      out.push_back(s[i]);
    else if (keepdims)
      out.push_back(1);
  }
  return out;
}

const char* Reduce::name() const {
  switch (kind_) {
    case ReduceKind::sum:
      return "sum";
    case ReduceKind::max:
      return "max";
    case ReduceKind::min:
      return "min";
  }
  return "reduce";
}

std::vector<TensorMeta> Reduce::infer(const std::vector<TensorMeta>& in) const {
  if (in[0].dtype == Dtype::boolean) fail("[", name(), "] does not support bool; cast first");
  if (kind_ != ReduceKind::sum)
    for (int a : axes_)
      if (in[0].shape[static_cast<size_t>(a)] == 0)
        fail("[", name(), "] cannot reduce an empty axis of ", shape_str(in[0].shape));
  return {{reduced_shape(in[0].shape, axes_, keepdims_), in[0].dtype}};
}

Cost Reduce::cost(const std::vector<TensorMeta>& in, const std::vector<TensorMeta>& out) const {
  Cost c = Primitive::cost(in, out);
  c.flops = static_cast<double>(numel(in[0].shape));
  return c;
}

std::string Reduce::attrs() const {
  std::string s = "axes=(";
  for (size_t i = 0; i < axes_.size(); ++i) s += (i ? ", " : "") + std::to_string(axes_[i]);
  return s + ")" + (keepdims_ ? " keepdims" : "");
}

std::vector<Tensor> Reduce::vjp(const std::vector<Tensor>& x, const std::vector<Tensor>& y,
                                const std::vector<Tensor>& g, const std::vector<int>&) const {
  const Shape& xs = x[0].shape();
  Shape kept = reduced_shape(xs, axes_, true);
  Tensor gk = reshape(g[0], kept);
  if (kind_ == ReduceKind::sum) return {broadcast_to(gk, xs)};
  // max/min: ties share the gradient evenly (torch.amax/amin semantics).
  Tensor yk = reshape(y[0], kept);
  Tensor mask = cast(equal(x[0], broadcast_to(yk, xs)), x[0].dtype());
  Tensor count = sum(mask, std::vector<int64_t>(axes_.begin(), axes_.end()), true);
  return {mask * broadcast_to(gk / count, xs)};
}

std::vector<TensorMeta> ArgMax::infer(const std::vector<TensorMeta>& in) const {
  if (in[0].shape[static_cast<size_t>(axis_)] == 0)
    fail("[argmax] cannot reduce an empty axis of ", shape_str(in[0].shape));
  return {{reduced_shape(in[0].shape, {axis_}, keepdims_), Dtype::i64}};
}

namespace {
std::vector<int> all_axes(size_t n) {
  std::vector<int> a(n);
  std::iota(a.begin(), a.end(), 0);
  return a;
}
Tensor reduce(ReduceKind k, const Tensor& x, const std::vector<int64_t>& axes, bool keepdims,
              const char* op) {
  std::vector<int> ax =
      axes.empty() ? all_axes(x.shape().size()) : normalize_axes(axes, x.shape().size(), op);
  if (ax.empty()) return x;  // a scalar: nothing to reduce
  return make_node1(std::make_shared<Reduce>(k, std::move(ax), keepdims), {x});
}
}  // namespace

Tensor sum(const Tensor& x, std::vector<int64_t> axes, bool keepdims) {
  Tensor xx = x.dtype() == Dtype::boolean ? cast(x, Dtype::i64) : x;
  return reduce(ReduceKind::sum, xx, axes, keepdims, "sum");
}
Tensor max(const Tensor& x, std::vector<int64_t> axes, bool keepdims) {
  return reduce(ReduceKind::max, x, axes, keepdims, "max");
}
Tensor min(const Tensor& x, std::vector<int64_t> axes, bool keepdims) {
  return reduce(ReduceKind::min, x, axes, keepdims, "min");
}

Tensor mean(const Tensor& x, std::vector<int64_t> axes, bool keepdims) {
  if (!is_floating(x.dtype()))
    fail("[mean] needs a floating-point tensor, got ", dtype_name(x.dtype()));
  std::vector<int> ax =
      axes.empty() ? all_axes(x.shape().size()) : normalize_axes(axes, x.shape().size(), "mean");
  int64_t n = 1;
  for (int a : ax) n *= x.shape()[static_cast<size_t>(a)];
  return sum(x, axes, keepdims) * (1.0 / static_cast<double>(n));
}

Tensor var(const Tensor& x, std::vector<int64_t> axes, int64_t correction, bool keepdims) {
  if (!is_floating(x.dtype()))
    fail("[var] needs a floating-point tensor, got ", dtype_name(x.dtype()));
  std::vector<int> ax =
      axes.empty() ? all_axes(x.shape().size()) : normalize_axes(axes, x.shape().size(), "var");
  int64_t n = 1;
  for (int a : ax) n *= x.shape()[static_cast<size_t>(a)];
  Tensor mu = mean(x, axes, true);
  Tensor d = x - mu;
  double denom = static_cast<double>(n - correction);
  if (denom <= 0) denom = 0;  // gives inf/nan as PyTorch does
  return sum(square(d), axes, keepdims) * (1.0 / denom);
}

Tensor argmax(const Tensor& x, int64_t axis, bool keepdims) {
  int a = normalize_axis(axis, x.shape().size(), "argmax");
  return make_node1(std::make_shared<ArgMax>(a, keepdims), {x});
}

Tensor sum_to(const Tensor& x, const Shape& shape) {
  if (x.shape() == shape) return x;
  const Shape& xs = x.shape();
  if (shape.size() > xs.size())
    fail("[sum_to] cannot sum ", shape_str(xs), " down to ", shape_str(shape));
  size_t lead = xs.size() - shape.size();
  std::vector<int64_t> axes;
  for (size_t i = 0; i < xs.size(); ++i) {
    if (i < lead)
      axes.push_back(static_cast<int64_t>(i));
    else if (shape[i - lead] == 1 && xs[i] != 1)
      axes.push_back(static_cast<int64_t>(i));
    else if (shape[i - lead] != xs[i])
      fail("[sum_to] cannot sum ", shape_str(xs), " down to ", shape_str(shape));
  }
  Tensor s = axes.empty() ? x : sum(x, axes, true);
  return reshape(s, shape);
}

}  // namespace hetrain
