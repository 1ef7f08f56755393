// conv2d, max_pool2d, avg_pool2d: argument checks, shape inference, costs and vjps.
#include <functional>

#include "graph/prims/conv.h"
#include "graph/prims/elementwise.h"
#include "hetrain/graph/ops.h"

namespace hetrain {

std::string Window2d::str() const {
  return "kernel=(" + std::to_string(kernel[0]) + ", " + std::to_string(kernel[1]) + ") stride=(" +
         std::to_string(stride[0]) + ", " + std::to_string(stride[1]) + ") padding=(" +
         std::to_string(padding[0]) + ", " + std::to_string(padding[1]) + ")";
}

namespace {

/// 2 * N * O * Ho * Wo * C * kh * kw, the same for each of the three conv GEMMs.
double flops_conv(const Shape& w, const Shape& small) {
  return 2.0 * static_cast<double>(numel(small)) * static_cast<double>(w[1] * w[2] * w[3]);
}

Tensor conv_node(const Tensor& x, const Tensor& w, const Tensor& b, const Window2d& win) {
  std::vector<Tensor> in{x, w};
  if (b.defined()) in.push_back(b);
  return make_node1(std::make_shared<Conv2d>(win), std::move(in));
}
Tensor conv_backward_input(const Tensor& g, const Tensor& w, const Window2d& win,
                           std::array<int64_t, 2> hw) {
  return make_node1(std::make_shared<Conv2dBackwardInput>(win, hw), {g, w});
}
Tensor conv_backward_weight(const Tensor& x, const Tensor& g, const Window2d& win) {
  return make_node1(std::make_shared<Conv2dBackwardWeight>(win), {x, g});
}
/// backward_input(g, w, win) + backward_input(g2, w2, win2), a term with an undefined factor (an
/// output without a cotangent) counting as zero: one node where one pass computes both
/// (one_pass_pair), else two and their sum.
Tensor pair_backward_input(const Tensor& g, const Tensor& w, const Window2d& win, const Tensor& g2,
                           const Tensor& w2, const Window2d& win2, std::array<int64_t, 2> hw) {
  if (!g2.defined() || !w2.defined()) return conv_backward_input(g, w, win, hw);
  if (!g.defined() || !w.defined()) return conv_backward_input(g2, w2, win2, hw);
  if (one_pass_pair(win, win2, hw))
    return make_node1(std::make_shared<Conv2dBackwardInput>(win, hw, false, win2), {g, w, g2, w2});
  return add(conv_backward_input(g, w, win, hw), conv_backward_input(g2, w2, win2, hw));
}

std::array<int64_t, 2> pair_arg(const std::vector<int64_t>& v, const char* op, const char* what,
                                std::array<int64_t, 2> dflt) {
  if (v.empty()) return dflt;
  if (v.size() == 1) return {v[0], v[0]};
  if (v.size() == 2) return {v[0], v[1]};
  fail("[", op, "] ", what, " must have 1 or 2 values, got ", v.size());
}

/// Checks stride/padding and that the window fits; returns the window.
Window2d make_window(const char* op, const Shape& xs, std::array<int64_t, 2> kernel,
                     const std::vector<int64_t>& stride, const std::vector<int64_t>& padding) {
  Window2d win;
  win.kernel = kernel;
  win.stride = pair_arg(stride, op, "stride", kernel);
  win.padding = pair_arg(padding, op, "padding", {0, 0});
  for (int a = 0; a < 2; ++a) {
    const size_t i = static_cast<size_t>(a);
    if (win.kernel[i] <= 0)
      fail("[", op, "] kernel size must be positive, got (", win.kernel[0], ", ", win.kernel[1],
           ")");
    if (win.stride[i] <= 0)
      fail("[", op, "] stride must be positive, got (", win.stride[0], ", ", win.stride[1], ")");
    if (win.padding[i] < 0)
      fail("[", op, "] padding must be non-negative, got (", win.padding[0], ", ", win.padding[1],
           ")");
    if (xs[2 + i] + 2 * win.padding[i] < win.kernel[i])
      fail("[", op, "] kernel (", win.kernel[0], ", ", win.kernel[1],
           ") is larger than the padded input (", xs[2] + 2 * win.padding[0], ", ",
           xs[3] + 2 * win.padding[1], ") of input ", shape_str(xs));
  }
  return win;
}

Shape out_shape(const Shape& xs, int64_t channels, const Window2d& win) {
  return {xs[0], channels, win.out_size(0, xs[2]), win.out_size(1, xs[3])};
}

}  // namespace

// ---- conv2d ---------------------------------------------------------------------------------

bool one_pass_pair(const Window2d& a, const Window2d& b, std::array<int64_t, 2> in_hw) {
  for (size_t i = 0; i < 2; ++i) {
    const int64_t first = a.padding[i] - b.padding[i];  // b's tap 0 as a tap of a
    if (a.stride[i] != 2 || b.stride[i] != 2 || first < 0 || first + b.kernel[i] > a.kernel[i] ||
        a.out_size(static_cast<int>(i), in_hw[i]) != b.out_size(static_cast<int>(i), in_hw[i]))
      return false;
  }
  return true;
}

std::vector<TensorMeta> Conv2d::infer(const std::vector<TensorMeta>& in) const {
  const Shape &x = in[0].shape, &w = in[1].shape;
  HT_ASSERT(x.size() == 4 && w.size() == 4 && x[1] == w[1] && in[0].dtype == in[1].dtype);
  std::vector<TensorMeta> out{{out_shape(x, w[0], win_), in[0].dtype}};
  if (second_) {
    const Shape& w2 = in[2].shape;
    HT_ASSERT(in.size() == 3 && w2.size() == 4 && x[1] == w2[1] && in[2].dtype == in[0].dtype);
    out.push_back({out_shape(x, w2[0], *second_), in[0].dtype});
  }
  return out;
}

Cost Conv2d::cost(const std::vector<TensorMeta>& in, const std::vector<TensorMeta>& out) const {
  Cost c = Primitive::cost(in, out);
  c.flops = flops_conv(in[1].shape, out[0].shape);
  if (second_) c.flops += flops_conv(in[2].shape, out[1].shape);
  return c;
}

std::string Conv2d::attrs() const {
  return win_.str() + (second_ ? " + " + second_->str() : std::string());
}

std::vector<Tensor> Conv2d::vjp(const std::vector<Tensor>& x, const std::vector<Tensor>&,
                                const std::vector<Tensor>& g,
                                const std::vector<int>& argnums) const {
  const std::array<int64_t, 2> hw{x[0].size(2), x[0].size(3)};
  std::vector<Tensor> r;
  if (second_) {
    // Outputs without a cotangent count as zero. Both weight gradients come from one node.
    const bool both = g[0].defined() && g[1].defined() &&
                      std::count(argnums.begin(), argnums.end(), 1) &&
                      std::count(argnums.begin(), argnums.end(), 2);
    std::vector<Tensor> dw;
    if (both)
      dw = make_node(std::make_shared<Conv2dBackwardWeight>(win_, *second_), {x[0], g[0], g[1]});
    for (int i : argnums) {
      const size_t k = static_cast<size_t>(i - 1);  // the output of weight i
      if (i == 0)
        r.push_back(pair_backward_input(g[0], x[1], win_, g[1], x[2], *second_, hw));
      else if (both)
        r.push_back(dw[k]);
      else if (g[k].defined())
        r.push_back(conv_backward_weight(x[0], g[k], i == 1 ? win_ : *second_));
      else
        r.emplace_back();
    }
    return r;
  }
  for (int i : argnums) {
    if (i == 0)
      r.push_back(conv_backward_input(g[0], x[1], win_, hw));
    else if (i == 1)
      r.push_back(conv_backward_weight(x[0], g[0], win_));
    else
      r.push_back(sum(g[0], {0, 2, 3}));
  }
  return r;
}

std::vector<TensorMeta> Conv2dBackwardInput::infer(const std::vector<TensorMeta>& in) const {
  const size_t n = (second_ ? 4u : 2u) + (addend_ ? 1u : 0u) + (mask_ ? 1u : 0u);
  HT_ASSERT(in.size() == n);
  auto check = [&](const TensorMeta& gm, const TensorMeta& wm, const Window2d& win) {
    const Shape &g = gm.shape, &w = wm.shape;
    HT_ASSERT(g.size() == 4 && w.size() == 4 && g[1] == w[0] && gm.dtype == wm.dtype);
    HT_ASSERT(win.out_size(0, in_hw_[0]) == g[2] && win.out_size(1, in_hw_[1]) == g[3]);
  };
  check(in[0], in[1], win_);
  const Shape& g = in[0].shape;
  const TensorMeta dx{{g[0], in[1].shape[1], in_hw_[0], in_hw_[1]}, in[0].dtype};
  if (second_) {
    check(in[2], in[3], *second_);
    HT_ASSERT(in[2].shape[0] == g[0] && in[3].shape[1] == dx.shape[1] && in[2].dtype == dx.dtype);
  }
  for (size_t k = n - (addend_ ? 1 : 0) - (mask_ ? 1 : 0); k < n; ++k)  // addend, mask
    HT_ASSERT(in[k].shape == dx.shape && in[k].dtype == dx.dtype);
  return {dx};
}

std::string Conv2dBackwardInput::attrs() const {
  return win_.str() + (second_ ? " + " + second_->str() : std::string()) +
         (addend_ ? " addend" : "") + (mask_ ? " relu-mask" : "");
}

Cost Conv2dBackwardInput::cost(const std::vector<TensorMeta>& in,
                               const std::vector<TensorMeta>& out) const {
  Cost c = Primitive::cost(in, out);
  c.flops = flops_conv(in[1].shape, in[0].shape);
  if (second_) c.flops += flops_conv(in[3].shape, in[2].shape);
  return c;
}

std::vector<Tensor> Conv2dBackwardInput::vjp(const std::vector<Tensor>& x,
                                             const std::vector<Tensor>&,
                                             const std::vector<Tensor>& g,
                                             const std::vector<int>& argnums) const {
  // dx = convT(g, w) (+ convT(g2, w2)) (+ r) is bilinear in each (g, w) pair: d/dg = conv(c, w),
  // d/dw = backward_weight(c, g); d/dr = c. With a mask m, c is first masked as dx was; m itself
  // gets no gradient (relu_grad's derivative in its mask is zero almost everywhere).
  const int r_at = second_ ? 4 : 2, m_at = r_at + (addend_ ? 1 : 0);
  const Tensor c = mask_ ? relu_grad(x[static_cast<size_t>(m_at)], g[0]) : g[0];
  std::vector<Tensor> r;
  for (int i : argnums) {
    const Window2d& win = i >= 2 && i < r_at ? *second_ : win_;
    if (mask_ && i == m_at)
      r.emplace_back();
    else if (i == r_at)
      r.push_back(c);
    else if (i % 2 == 0)
      r.push_back(conv_node(c, x[static_cast<size_t>(i + 1)], {}, win));
    else
      r.push_back(conv_backward_weight(c, x[static_cast<size_t>(i - 1)], win));
  }
  return r;
}

std::vector<TensorMeta> Conv2dBackwardWeight::infer(const std::vector<TensorMeta>& in) const {
  HT_ASSERT(in.size() == (second_ ? 3u : 2u));
  const Shape& x = in[0].shape;
  std::vector<TensorMeta> out;
  for (size_t k = 1; k < in.size(); ++k) {
    const Shape& g = in[k].shape;
    const Window2d& win = k == 1 ? win_ : *second_;
    HT_ASSERT(x.size() == 4 && g.size() == 4 && x[0] == g[0] && in[0].dtype == in[k].dtype);
    HT_ASSERT(win.out_size(0, x[2]) == g[2] && win.out_size(1, x[3]) == g[3]);
    out.push_back({{g[1], x[1], win.kernel[0], win.kernel[1]}, in[0].dtype});
  }
  return out;
}

Cost Conv2dBackwardWeight::cost(const std::vector<TensorMeta>& in,
                                const std::vector<TensorMeta>& out) const {
  Cost c = Primitive::cost(in, out);
  c.flops = flops_conv(out[0].shape, in[1].shape);
  if (second_) c.flops += flops_conv(out[1].shape, in[2].shape);
  return c;
}

std::string Conv2dBackwardWeight::attrs() const {
  return win_.str() + (second_ ? " + " + second_->str() : std::string());
}

std::vector<Tensor> Conv2dBackwardWeight::vjp(const std::vector<Tensor>& x,
                                              const std::vector<Tensor>&,
                                              const std::vector<Tensor>& g,
                                              const std::vector<int>& argnums) const {
  // dw = corr(x, g) is bilinear: d/dx = backward_input(g, c), d/dg = conv(x, c). With a second
  // window, (dw, dw2) = (corr(x, g), corr(x, g2)): d/dx is the sum of both, an undefined
  // cotangent counting as zero.
  const std::array<int64_t, 2> hw{x[0].size(2), x[0].size(3)};
  std::vector<Tensor> r;
  for (int i : argnums) {
    const size_t k = static_cast<size_t>(i - 1);  // the output of g input i
    if (i == 0 && second_)
      r.push_back(pair_backward_input(x[1], g[0], win_, x[2], g[1], *second_, hw));
    else if (i == 0)
      r.push_back(conv_backward_input(x[1], g[0], win_, hw));
    else if (g[k].defined())
      r.push_back(conv_node(x[0], g[k], {}, i == 1 ? win_ : *second_));
    else
      r.emplace_back();
  }
  return r;
}

namespace {

/// Checks conv2d's arguments; returns the window and the dtype the convolution runs in.
std::pair<Window2d, Dtype> conv_args(const Tensor& x, const Tensor& w, const Tensor& bias,
                                     const std::vector<int64_t>& stride,
                                     const std::vector<int64_t>& padding) {
  if (x.ndim() != 4) fail("[conv2d] input must be 4-D (N, C, H, W), got ", shape_str(x.shape()));
  if (w.ndim() != 4) fail("[conv2d] weight must be 4-D (O, C, kh, kw), got ", shape_str(w.shape()));
  if (!is_floating(x.dtype()) || !is_floating(w.dtype()))
    fail("[conv2d] needs floating-point input and weight, got ", dtype_name(x.dtype()), " and ",
         dtype_name(w.dtype()));
  const Shape &xs = x.shape(), &ws = w.shape();
  if (xs[1] != ws[1])
    fail("[conv2d] input has ", xs[1], " channels but weight expects ", ws[1], ": x ",
         shape_str(xs), ", w ", shape_str(ws));
  Dtype dt = promote_types(x.dtype(), w.dtype());
  if (bias.defined()) {
    if (bias.shape() != Shape{ws[0]})
      fail("[conv2d] bias must have shape (", ws[0], ") for weight ", shape_str(ws), ", got ",
           shape_str(bias.shape()));
    if (!is_floating(bias.dtype()))
      fail("[conv2d] bias must be floating point, got ", dtype_name(bias.dtype()));
    dt = promote_types(dt, bias.dtype());
  }
  if (stride.empty()) fail("[conv2d] stride must have 1 or 2 values, got 0");
  return {make_window("conv2d", xs, {ws[2], ws[3]}, stride, padding), dt};
}

}  // namespace

Tensor conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, std::vector<int64_t> stride,
              std::vector<int64_t> padding) {
  const auto [win, dt] = conv_args(x, w, bias, stride, padding);
  return conv_node(cast(x, dt), cast(w, dt), bias.defined() ? cast(bias, dt) : Tensor(), win);
}

// ---- pooling --------------------------------------------------------------------------------

namespace {

std::vector<TensorMeta> pool_infer(const char* op, const std::vector<TensorMeta>& in,
                                   const Window2d& win) {
  const Shape& x = in[0].shape;
  if (!is_floating(in[0].dtype))
    fail("[", op, "] needs a floating-point tensor, got ", dtype_name(in[0].dtype));
  HT_ASSERT(x.size() == 4);
  return {{out_shape(x, x[1], win), in[0].dtype}};
}

/// Checks the arguments of a pooling op; 3-D (C, H, W) inputs get a batch axis of 1.
Tensor pool(const char* op, const Tensor& x, const std::vector<int64_t>& kernel,
            const std::vector<int64_t>& stride, const std::vector<int64_t>& padding,
            const std::function<Tensor(const Tensor&, const Window2d&)>& make) {
  if (x.ndim() != 3 && x.ndim() != 4)
    fail("[", op, "] input must be 3-D (C, H, W) or 4-D (N, C, H, W), got ", shape_str(x.shape()));
  Tensor x4 = x.ndim() == 3 ? unsqueeze(x, 0) : x;
  if (kernel.empty()) fail("[", op, "] kernel must have 1 or 2 values, got 0");
  std::array<int64_t, 2> k = pair_arg(kernel, op, "kernel", {1, 1});
  Window2d win = make_window(op, x4.shape(), k, stride, padding);
  for (size_t a = 0; a < 2; ++a)
    if (win.padding[a] > win.kernel[a] / 2)
      fail("[", op, "] padding (", win.padding[0], ", ", win.padding[1],
           ") must be at most half the kernel (", win.kernel[0], ", ", win.kernel[1], ")");
  Tensor y = make(x4, win);
  return x.ndim() == 3 ? squeeze(y, 0) : y;
}

}  // namespace

std::vector<TensorMeta> MaxPool2d::infer(const std::vector<TensorMeta>& in) const {
  auto out = pool_infer("max_pool2d", in, win_);
  out.push_back({out[0].shape, Dtype::i64});
  return out;
}

std::vector<Tensor> MaxPool2d::vjp(const std::vector<Tensor>& x, const std::vector<Tensor>& y,
                                   const std::vector<Tensor>& g, const std::vector<int>&) const {
  return {make_node1(
      std::make_shared<MaxPool2dBackward>(win_, std::array<int64_t, 2>{x[0].size(2), x[0].size(3)}),
      {g[0], y[1]})};
}

std::vector<TensorMeta> MaxPool2dBackward::infer(const std::vector<TensorMeta>& in) const {
  const Shape& g = in[0].shape;
  HT_ASSERT(g.size() == 4 && in[1].shape == g && in[1].dtype == Dtype::i64);
  return {{{g[0], g[1], in_hw_[0], in_hw_[1]}, in[0].dtype}};
}

std::vector<TensorMeta> AvgPool2d::infer(const std::vector<TensorMeta>& in) const {
  return pool_infer("avg_pool2d", in, win_);
}

std::vector<Tensor> AvgPool2d::vjp(const std::vector<Tensor>& x, const std::vector<Tensor>&,
                                   const std::vector<Tensor>& g, const std::vector<int>&) const {
  return {make_node1(
      std::make_shared<AvgPool2dBackward>(win_, std::array<int64_t, 2>{x[0].size(2), x[0].size(3)}),
      {g[0]})};
}

std::vector<TensorMeta> AvgPool2dBackward::infer(const std::vector<TensorMeta>& in) const {
  const Shape& g = in[0].shape;
  HT_ASSERT(g.size() == 4);
  return {{{g[0], g[1], in_hw_[0], in_hw_[1]}, in[0].dtype}};
}

std::vector<Tensor> AvgPool2dBackward::vjp(const std::vector<Tensor>&, const std::vector<Tensor>&,
                                           const std::vector<Tensor>& g,
                                           const std::vector<int>&) const {
  // Linear in g; its adjoint is the forward average pool.
  return {make_node1(std::make_shared<AvgPool2d>(win_), {g[0]})};
}

Tensor max_pool2d(const Tensor& x, std::vector<int64_t> kernel, std::vector<int64_t> stride,
                  std::vector<int64_t> padding) {
  return pool("max_pool2d", x, kernel, stride, padding, [](const Tensor& x4, const Window2d& w) {
    return make_node(std::make_shared<MaxPool2d>(w), {x4})[0];
  });
}

Tensor avg_pool2d(const Tensor& x, std::vector<int64_t> kernel, std::vector<int64_t> stride,
                  std::vector<int64_t> padding) {
  return pool("avg_pool2d", x, kernel, stride, padding, [](const Tensor& x4, const Window2d& w) {
    return make_node1(std::make_shared<AvgPool2d>(w), {x4});
  });
}

}  // namespace hetrain
