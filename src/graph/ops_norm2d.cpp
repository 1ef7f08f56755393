// batch_norm2d: argument checks, shape inference, cost and vjp of the fused batch norm.
#include <tuple>

#include "graph/prims/elementwise.h"
#include "graph/prims/norm2d.h"
#include "hetrain/graph/ops.h"

namespace hetrain {

namespace {
Dtype stats_dtype(Dtype dt) { return dt == Dtype::f64 ? Dtype::f64 : Dtype::f32; }
}  // namespace

std::vector<TensorMeta> BatchNorm2d::infer(const std::vector<TensorMeta>& in) const {
  const Shape& x = in[0].shape;
  HT_ASSERT(x.size() == 4 && in[1].shape == Shape{x[1]} && in[2].shape == Shape{x[1]});
  HT_ASSERT(in.size() == (residual_ ? 4u : 3u) && (!residual_ || in[3].shape == x));
  const TensorMeta stats{{x[1]}, stats_dtype(in[0].dtype)};
  return {in[0], stats, stats};
}

Cost BatchNorm2d::cost(const std::vector<TensorMeta>& in,
                       const std::vector<TensorMeta>& out) const {
  Cost c = Primitive::cost(in, out);
  c.flops = 5.0 * static_cast<double>(numel(in[0].shape));  // sum, square-sum, scale-shift
  return c;
}

std::vector<Tensor> BatchNorm2d::vjp(const std::vector<Tensor>& x, const std::vector<Tensor>& y,
                                     const std::vector<Tensor>& g,
                                     const std::vector<int>& argnums) const {
  Tensor gy = g[0].defined() ? g[0] : zeros_like(y[0]);
  // With a residual the relu's mask is not a function of x alone: it comes from y, and the
  // masked gradient is also the residual's.
  if (residual_ && relu_) gy = relu_grad(y[0], gy);
  auto grads = make_node(std::make_shared<BatchNorm2dBackward>(eps_, relu_ && !residual_),
                         {x[0], y[1], y[2], gy, x[1], x[2]});  // dx, dweight, dbias
  std::vector<Tensor> r;
  for (int a : argnums) {
    if (a == 3) {  // the residual
      r.push_back(gy);
      continue;
    }
    Tensor d = grads[static_cast<size_t>(a)];
    if (a == 0 && (g[1].defined() || g[2].defined())) {
      // The statistics are outputs too: d mean / dx = 1 / M, d var / dx = 2 (x - mean) / M.
      const int64_t c = x[0].size(1);
      const double m = static_cast<double>(x[0].numel() / c);
      const Shape bshape{1, c, 1, 1};
      const Dtype dt = x[0].dtype();
      if (g[1].defined()) d = d + cast(reshape(g[1], bshape) * (1.0 / m), dt);
      if (g[2].defined())
        d = d +
            (x[0] - cast(reshape(y[1], bshape), dt)) * cast(reshape(g[2], bshape) * (2.0 / m), dt);
    }
    r.push_back(d);
  }
  return r;
}

std::vector<TensorMeta> BatchNorm2dBackward::infer(const std::vector<TensorMeta>& in) const {
  const Shape& x = in[0].shape;
  HT_ASSERT(x.size() == 4 && in[3].shape == x && in[4].shape == Shape{x[1]} &&
            in[5].shape == Shape{x[1]});
  const TensorMeta per_channel{{x[1]}, in[0].dtype};
  return {in[0], per_channel, per_channel};
}

Cost BatchNorm2dBackward::cost(const std::vector<TensorMeta>& in,
                               const std::vector<TensorMeta>& out) const {
  Cost c = Primitive::cost(in, out);
  c.flops = 8.0 * static_cast<double>(numel(in[0].shape));
  return c;
}

std::array<Tensor, 3> batch_norm2d(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                   double eps, bool relu, const Tensor& residual) {
  if (!x.defined() || x.ndim() != 4)
    fail("[batch_norm2d] input must be 4-D (N, C, H, W), got ",
         x.defined() ? shape_str(x.shape()) : std::string("an undefined tensor"));
  if (!is_floating(x.dtype()))
    fail("[batch_norm2d] input must be floating point, got ", dtype_name(x.dtype()));
  const int64_t c = x.size(1);
  if (x.numel() == 0 && c > 0)
    fail("[batch_norm2d] needs at least one value per channel, got input ", shape_str(x.shape()));
  if (!(eps >= 0)) fail("[batch_norm2d] eps must be >= 0, got ", eps);
  std::vector<Tensor> in{x};
  for (const auto& [t, what, fill] :
       {std::tuple{weight, "weight", 1.0}, std::tuple{bias, "bias", 0.0}}) {
    if (!t.defined()) {
      in.push_back(full({c}, fill, x.dtype()));
      continue;
    }
    if (!is_floating(t.dtype()))
      fail("[batch_norm2d] ", what, " must be floating point, got ", dtype_name(t.dtype()));
    if (t.shape() != Shape{c})
      fail("[batch_norm2d] ", what, " must have shape (", c, ") for input ", shape_str(x.shape()),
           ", got ", shape_str(t.shape()));
    in.push_back(t.dtype() == x.dtype() ? t : cast(t, x.dtype()));
  }
  if (residual.defined()) {
    if (residual.shape() != x.shape())
      fail("[batch_norm2d] residual must have the input's shape ", shape_str(x.shape()), ", got ",
           shape_str(residual.shape()));
    if (!is_floating(residual.dtype()))
      fail("[batch_norm2d] residual must be floating point, got ", dtype_name(residual.dtype()));
    in.push_back(residual.dtype() == x.dtype() ? residual : cast(residual, x.dtype()));
  }
  auto out = make_node(std::make_shared<BatchNorm2d>(eps, relu, residual.defined()), std::move(in));
  return {out[0], out[1], out[2]};
}

}  // namespace hetrain
