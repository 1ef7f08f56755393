// ONNX neural-network op handlers: Gemm, Conv, pooling, normalisation, Dropout.
#include <algorithm>
#include <cmath>
#include <limits>

#include "hetrain/base/error.h"
#include "hetrain/graph/ops.h"
#include "interop/onnx_ops.h"

namespace hetrain::interop {

namespace {

using Ctx = OnnxNodeCtx;
using Outs = std::vector<Tensor>;

/// x with `before` and `after` elements of `value` added along axis.
Tensor pad_axis(const Tensor& x, int64_t axis, int64_t before, int64_t after, double value) {
  if (before == 0 && after == 0) return x;
  std::vector<Tensor> parts;
  auto block = [&](int64_t n) {
    Shape s = x.shape();
    s[static_cast<size_t>(axis)] = n;
    return full(s, value, x.dtype());
  };
  if (before) parts.push_back(block(before));
  parts.push_back(x);
  if (after) parts.push_back(block(after));
  return concat(parts, axis);
}

/// The window geometry of a 2-D Conv or pool: kernel, strides, and padding at each end of H
/// and W (explicit pads, auto_pad SAME_UPPER/SAME_LOWER/VALID, ceil_mode's extra end cells).
struct Window {
  std::vector<int64_t> k, s, begin, end, extra;  // extra: ceil_mode cells past `end`
};

/// Window attributes; a 1-D op's widened to 2-D (H of size 1 first).
struct WindowAttrs {
  std::vector<int64_t> strides, pads, dilations;
  std::string auto_pad;
};
WindowAttrs window_attrs(const Ctx& c, bool one_d) {
  WindowAttrs a{c.attr_ints("strides"), c.attr_ints("pads"), c.attr_ints("dilations"),
                c.attr_string("auto_pad", "NOTSET")};
  if (one_d) {
    if (!a.strides.empty()) a.strides.insert(a.strides.begin(), 1);
    if (a.pads.size() == 2) a.pads = {0, a.pads[0], 0, a.pads[1]};
    if (!a.dilations.empty()) a.dilations.insert(a.dilations.begin(), 1);
  }
  return a;
}

Window window_of(const Ctx& c, const WindowAttrs& at, const Tensor& x, std::vector<int64_t> k) {
  for (int64_t d : at.dilations)
    if (d != 1) fail(c.where(), "dilations other than 1 are not supported");
  Window w;
  w.k = std::move(k);
  w.s = at.strides;
  if (w.s.empty()) w.s.assign(2, 1);
  // Sizes from the file, bounded before the window arithmetic below.
  auto check = [&](const std::vector<int64_t>& v, size_t count, int64_t lo, const char* what) {
    if (v.size() != count)
      fail(c.where(), what, " must have ", count, " values, it has ", v.size());
    for (int64_t e : v)
      if (e < lo || e > kOnnxMaxElements)
        fail(c.where(), what, " value ", e, " is outside [", lo, ", 2^40]");
  };
  check(w.k, 2, 1, "kernel_shape");
  check(w.s, 2, 1, "strides");
  if (!at.pads.empty()) check(at.pads, 4, 0, "pads");
  w.begin.assign(2, 0), w.end.assign(2, 0), w.extra.assign(2, 0);
  const std::string& auto_pad = at.auto_pad;
  const std::vector<int64_t>& pads = at.pads;
  const bool ceil_mode = c.attr_int("ceil_mode", 0) != 0;
  for (size_t d = 0; d < 2; ++d) {
    const int64_t in = x.shape()[2 + d];
    if (auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
      const int64_t out = (in + w.s[d] - 1) / w.s[d];
      const int64_t total = std::max<int64_t>(0, (out - 1) * w.s[d] + w.k[d] - in);
      w.begin[d] = auto_pad == "SAME_UPPER" ? total / 2 : total - total / 2;
      w.end[d] = total - w.begin[d];
    } else if (auto_pad == "NOTSET") {
      if (!pads.empty()) {
        w.begin[d] = pads[d], w.end[d] = pads[d + 2];
      }
    } else if (auto_pad != "VALID") {
      fail(c.where(), "unknown auto_pad '", auto_pad, "'");
    }
    const int64_t span = in + w.begin[d] + w.end[d] - w.k[d];
    if (span < 0)
      fail(c.where(), "kernel ", w.k[d], " is larger than the padded input ",
           in + w.begin[d] + w.end[d]);
    if (ceil_mode) {
      int64_t out = (span + w.s[d] - 1) / w.s[d] + 1;
      if ((out - 1) * w.s[d] >= in + w.begin[d]) --out;  // the last window starts in the input
      w.extra[d] = std::max<int64_t>(0, (out - 1) * w.s[d] + w.k[d] - (in + w.begin[d] + w.end[d]));
    }
  }
  return w;
}

/// x padded by the window's explicit pads (pad_value) and ceil cells (extra_value).
Tensor pad_window(const Tensor& x, const Window& w, double pad_value, double extra_value) {
  Tensor y = x;
  for (size_t d = 0; d < 2; ++d) {
    y = pad_axis(y, static_cast<int64_t>(2 + d), w.begin[d], w.end[d], pad_value);
    y = pad_axis(y, static_cast<int64_t>(2 + d), 0, w.extra[d], extra_value);
  }
  return y;
}

bool padded(const Window& w) {
  for (size_t d = 0; d < 2; ++d)
    if (w.begin[d] || w.end[d] || w.extra[d]) return true;
  return false;
}

}  // namespace

Outs onnx_gemm(const Ctx& c) {
  Tensor a = c.in.at(0), b = c.in.at(1);
  const double alpha = c.attr_float("alpha", 1.0), beta = c.attr_float("beta", 1.0);
  if (c.attr_int("transA", 0)) a = transpose(a, 0, 1);
  const bool tb = c.attr_int("transB", 0) != 0;
  Tensor bias = c.has_input(2) ? c.in[2] : Tensor();
  // The common case is exactly nn::Linear's linear(x, W, b).
  if (tb && alpha == 1.0 && beta == 1.0 &&
      (!bias.defined() || (bias.ndim() == 1 && bias.shape()[0] == b.shape()[0])))
    return {linear(a, b, bias)};
  Tensor y = matmul(a, tb ? transpose(b, 0, 1) : b);
  if (alpha != 1.0) y = y * alpha;
  if (bias.defined()) y = y + (beta != 1.0 ? bias * beta : bias);
  return {y};
}

Outs onnx_conv(const Ctx& c) {
  const Tensor& x = c.in.at(0);
  const Tensor& wt = c.in.at(1);
  if (x.ndim() != 4)
    fail(c.where(), "only 2-D (N, C, H, W) inputs are supported, got ", shape_str(x.shape()));
  if (wt.ndim() != 4)
    fail(c.where(), "the weight must be (M, C, kH, kW), got ", shape_str(wt.shape()));
  if (c.attr_int("group", 1) != 1)
    fail(c.where(), "group ", c.attr_int("group", 1), " is not supported (1)");
  Window w = window_of(c, window_attrs(c, false), x, {wt.shape()[2], wt.shape()[3]});
  const Tensor bias = c.has_input(2) ? c.in[2] : Tensor();
  if (w.begin == w.end) return {conv2d(x, wt, bias, w.s, w.begin)};
  return {conv2d(pad_window(x, w, 0, 0), wt, bias, w.s, {0, 0})};
}

Outs onnx_pool(const Ctx& c, bool is_max) {
  Tensor x = c.in.at(0);
  if (c.node.output_size() > 1 && !c.node.output(1).empty())
    fail(c.where(), "the Indices output is not supported");
  std::vector<int64_t> k = c.attr_ints("kernel_shape");
  const bool one_d = x.ndim() == 3;
  if (one_d) {
    // (N, C, L) as (N, C, 1, L): attributes get a leading 1 / 0.
    if (k.size() != 1) fail(c.where(), "kernel_shape must have 1 value for a 1-D input");
    x = unsqueeze(x, 2);
    k.insert(k.begin(), 1);
  }
  if (x.ndim() != 4 || k.size() != 2)
    fail(c.where(), "only 1-D and 2-D inputs are supported, got ", shape_str(c.in[0].shape()));
  Window w = window_of(c, window_attrs(c, one_d), x, k);
  const Dtype dt = x.dtype();
  if (!is_floating(dt)) x = cast(x, Dtype::f32);
  Tensor y;
  if (is_max) {
    const double lowest = -std::numeric_limits<double>::infinity();
    y = padded(w) ? max_pool2d(pad_window(x, w, lowest, lowest), w.k, w.s, {0, 0})
                  : max_pool2d(x, w.k, w.s, {0, 0});
  } else if (!padded(w)) {
    y = avg_pool2d(x, w.k, w.s, {0, 0});
  } else {
    // Mean over the window's cells that count: the explicit pads with count_include_pad, never
    // the ceil_mode cells. Sum / count, both as means over the full window.
    const bool include = c.attr_int("count_include_pad", 0) != 0;
    Tensor ones_in = ones({1, 1, x.shape()[2], x.shape()[3]}, x.dtype());
    Tensor counted = pad_window(ones_in, w, include ? 1.0 : 0.0, 0.0);
    y = avg_pool2d(pad_window(x, w, 0, 0), w.k, w.s, {0, 0}) /
        avg_pool2d(counted, w.k, w.s, {0, 0});
  }
  if (!is_floating(dt)) y = cast(y, dt);
  return {one_d ? squeeze(y, 2) : y};
}

Outs onnx_global_avg_pool(const Ctx& c) {
  const Tensor& x = c.in.at(0);
  std::vector<int64_t> axes;
  for (int64_t d = 2; d < x.ndim(); ++d) axes.push_back(d);
  return {mean(x, axes, true)};
}

Outs onnx_batch_norm(const Ctx& c) {
  const Tensor& x = c.in.at(0);
  if (x.ndim() < 2) fail(c.where(), "input must be (N, C, ...), got ", shape_str(x.shape()));
  const double eps = c.attr_float("epsilon", 1e-5);
  Shape bshape(static_cast<size_t>(x.ndim()), 1);
  bshape[1] = x.shape()[1];
  if (!c.attr_int("training_mode", 0)) {
    // nn::BatchNorm2d's inference arithmetic, so an exported model imports bit for bit.
    Tensor scale = c.in.at(1) * rsqrt(c.in.at(4) + eps);
    Tensor shift = c.in.at(2) - c.in.at(3) * scale;
    return {x * reshape(scale, bshape) + reshape(shift, bshape)};
  }
  // Training mode (opset 14+): batch statistics, biased variance; running statistics updated
  // as input * momentum + batch * (1 - momentum).
  std::vector<int64_t> axes{0};
  for (int64_t d = 2; d < x.ndim(); ++d) axes.push_back(d);
  const double momentum = c.attr_float("momentum", 0.9);
  Tensor mu = mean(x, axes, true);
  Tensor centered = x - mu;
  Tensor var = mean(centered * centered, axes, true);
  Tensor y =
      centered * rsqrt(var + eps) * reshape(c.in.at(1), bshape) + reshape(c.in.at(2), bshape);
  Tensor mu_c = reshape(mu, {x.shape()[1]}), var_c = reshape(var, {x.shape()[1]});
  return {y, c.in.at(3) * momentum + mu_c * (1 - momentum),
          c.in.at(4) * momentum + var_c * (1 - momentum)};
}

Outs onnx_layer_norm(const Ctx& c) {
  const Tensor& x = c.in.at(0);
  int64_t axis = c.attr_int("axis", -1);
  if (axis < -x.ndim() || axis >= x.ndim()) fail(c.where(), "axis ", axis, " out of range");
  if (axis < 0) axis += x.ndim();
  const double eps = c.attr_float("epsilon", 1e-5);
  Shape norm(x.shape().begin() + axis, x.shape().end());
  Tensor weight = c.in.at(1), bias = c.has_input(2) ? c.in[2] : Tensor();
  // Scale and bias broadcast to the normalised shape (ONNX allows any broadcastable shape).
  if (weight.shape() != norm) weight = broadcast_to(weight, norm);
  if (bias.defined() && bias.shape() != norm) bias = broadcast_to(bias, norm);
  Outs out{layer_norm(x, norm, weight, bias, eps)};
  const bool wants_stats = c.node.output_size() > 1;
  if (wants_stats) {
    // Mean and 1/sqrt(var + eps) over the normalised axes, kept as size-1 dims (stash_type f32).
    std::vector<int64_t> axes;
    for (int64_t d = axis; d < x.ndim(); ++d) axes.push_back(d);
    Tensor xf = c.attr_int("stash_type", 1) == 1 ? cast(x, Dtype::f32) : x;
    Tensor mu = mean(xf, axes, true);
    Tensor centered = xf - mu;
    out.push_back(mu);
    out.push_back(rsqrt(mean(centered * centered, axes, true) + eps));
  }
  return out;
}

Outs onnx_dropout(const Ctx& c) {
  // Inference, or training with ratio 0: the input passes through and the mask is all true.
  const bool training = c.version >= 12 && c.has_input(2) && c.in[2].item<bool>();
  double ratio = c.version >= 12 ? (c.has_input(1) ? cast(c.in[1], Dtype::f64).item<double>() : 0.5)
                                 : c.attr_float("ratio", 0.5);
  if (training && ratio != 0)
    fail(c.where(), "training_mode with ratio ", ratio, " is not supported (random masks)");
  Outs out{c.in.at(0)};
  if (c.node.output_size() > 1) out.push_back(ones(c.in[0].shape(), Dtype::boolean));
  return out;
}

}  // namespace hetrain::interop
