// softmax, log_softmax, layer_norm, rms_norm, cross_entropy and dropout: builders, shape
// inference and vjps.
#include <algorithm>

#include "graph/prims/nn.h"
#include "hetrain/graph/ops.h"

namespace hetrain {

namespace {

/// The dtype kernels accumulate in for a floating dtype.
Dtype acc_dtype(Dtype dt) { return dt == Dtype::f64 ? Dtype::f64 : Dtype::f32; }

void require_float(const Tensor& x, const char* op, const char* what) {
  if (!x.defined()) fail("[", op, "] ", what, " is undefined");
  if (!is_floating(x.dtype()))
    fail("[", op, "] ", what, " must be floating point, got ", dtype_name(x.dtype()));
}

}  // namespace

// ---- softmax / log_softmax ------------------------------------------------------------------

std::vector<TensorMeta> Softmax::infer(const std::vector<TensorMeta>& in) const { return {in[0]}; }

Cost Softmax::cost(const std::vector<TensorMeta>& in, const std::vector<TensorMeta>& out) const {
  Cost c = Primitive::cost(in, out);
  c.flops *= 5;  // max, sub, exp, sum, scale
  return c;
}

std::vector<Tensor> Softmax::vjp(const std::vector<Tensor>&, const std::vector<Tensor>& y,
                                 const std::vector<Tensor>& g, const std::vector<int>&) const {
  const std::vector<int64_t> ax{axis_};
  if (log_) return {g[0] - exp(y[0]) * sum(g[0], ax, true)};
  return {y[0] * (g[0] - sum(g[0] * y[0], ax, true))};
}

namespace {
Tensor softmax_impl(const Tensor& x, int64_t axis, bool log, const char* op) {
  require_float(x, op, "input");
  if (x.ndim() == 0) {
    // A 0-d tensor is a single row of one element.
    return reshape(softmax_impl(reshape(x, {1}), 0, log, op), {});
  }
  int a = normalize_axis(axis, x.shape().size(), op);
  return make_node1(std::make_shared<Softmax>(a, log), {x});
}
}  // namespace

Tensor softmax(const Tensor& x, int64_t axis) { return softmax_impl(x, axis, false, "softmax"); }
Tensor log_softmax(const Tensor& x, int64_t axis) {
  return softmax_impl(x, axis, true, "log_softmax");
}

// ---- layer_norm / rms_norm --------------------------------------------------------------------

std::vector<TensorMeta> Norm::infer(const std::vector<TensorMeta>& in) const {
  int64_t rows = cols_ > 0 ? numel(in[0].shape) / cols_ : 0;
  return {in[0], {{rows, 2}, acc_dtype(in[0].dtype)}};
}

Cost Norm::cost(const std::vector<TensorMeta>& in, const std::vector<TensorMeta>& out) const {
  Cost c = Primitive::cost(in, out);
  c.flops = 8.0 * static_cast<double>(numel(in[0].shape));
  return c;
}

std::vector<Tensor> Norm::vjp(const std::vector<Tensor>& x, const std::vector<Tensor>& y,
                              const std::vector<Tensor>& g, const std::vector<int>& argnums) const {
  Tensor gy = g[0].defined() ? g[0] : zeros_like(y[0]);
  std::vector<Tensor> in{x[0], y[1], gy};
  if (has_w_) in.push_back(x[1]);
  auto grads = make_node(std::make_shared<NormBackward>(center_, cols_, has_w_, has_b_), in);
  // grads: dx, [dw], [db] -- the same order as this primitive's inputs. dw and db come out
  // flat (cols); a multi-dimensional normalized_shape gives them back their input's shape.
  std::vector<Tensor> r;
  for (int a : argnums) {
    const Tensor& d = grads[static_cast<size_t>(a)];
    r.push_back(a == 0 ? d : reshape(d, x[static_cast<size_t>(a)].shape()));
  }
  return r;
}

std::vector<TensorMeta> NormBackward::infer(const std::vector<TensorMeta>& in) const {
  std::vector<TensorMeta> out{in[0]};
  if (has_w_) out.push_back({{cols_}, in[0].dtype});
  if (has_b_) out.push_back({{cols_}, in[0].dtype});
  return out;
}

Cost NormBackward::cost(const std::vector<TensorMeta>& in,
                        const std::vector<TensorMeta>& out) const {
  Cost c = Primitive::cost(in, out);
  c.flops = 12.0 * static_cast<double>(numel(in[0].shape));
  return c;
}

namespace {
Tensor norm_impl(bool center, const Tensor& x, const Shape& normalized_shape, const Tensor& weight,
                 const Tensor& bias, double eps, const char* op) {
  require_float(x, op, "input");
  const Shape& xs = x.shape();
  const size_t k = normalized_shape.size();
  bool suffix = k <= xs.size() && std::equal(normalized_shape.begin(), normalized_shape.end(),
                                             xs.end() - static_cast<std::ptrdiff_t>(k));
  if (!suffix)
    fail("[", op, "] normalized_shape ", shape_str(normalized_shape),
         " does not match the trailing dimensions of input ", shape_str(xs));
  if (!(eps >= 0)) fail("[", op, "] eps must be >= 0, got ", eps);
  std::vector<Tensor> in{x};
  for (const auto& [t, what] : {std::pair{weight, "weight"}, std::pair{bias, "bias"}}) {
    if (!t.defined()) continue;
    require_float(t, op, what);
    if (t.shape() != normalized_shape)
      fail("[", op, "] ", what, " has shape ", shape_str(t.shape()), ", expected ",
           shape_str(normalized_shape));
    in.push_back(t.dtype() == x.dtype() ? t : cast(t, x.dtype()));
  }
  auto prim = std::make_shared<Norm>(center, numel(normalized_shape), weight.defined(),
                                     bias.defined(), eps);
  return make_node(prim, std::move(in))[0];
}
}  // namespace

Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight,
                  const Tensor& bias, double eps) {
  return norm_impl(true, x, normalized_shape, weight, bias, eps, "layer_norm");
}

Tensor rms_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight, double eps) {
  return norm_impl(false, x, normalized_shape, weight, Tensor(), eps, "rms_norm");
}

// ---- cross_entropy ------------------------------------------------------------------------

std::vector<TensorMeta> CrossEntropy::infer(const std::vector<TensorMeta>& in) const {
  Dtype acc = acc_dtype(in[0].dtype);
  return {{in[1].shape, acc}, {in[1].shape, acc}};
}

Cost CrossEntropy::cost(const std::vector<TensorMeta>& in,
                        const std::vector<TensorMeta>& out) const {
  Cost c = Primitive::cost(in, out);
  c.flops = 4.0 * static_cast<double>(numel(in[0].shape));
  return c;
}

std::vector<Tensor> CrossEntropy::vjp(const std::vector<Tensor>& x, const std::vector<Tensor>& y,
                                      const std::vector<Tensor>& g,
                                      const std::vector<int>& argnums) const {
  std::vector<Tensor> r;
  for (int a : argnums) {
    if (a != 0) {
      r.push_back({});
      continue;
    }
    Tensor gl = g[0].defined() ? g[0] : zeros_like(y[0]);
    r.push_back(
        make_node1(std::make_shared<CrossEntropyBackward>(ignore_), {x[0], x[1], y[1], gl}));
  }
  return r;
}

std::vector<TensorMeta> CrossEntropyBackward::infer(const std::vector<TensorMeta>& in) const {
  return {in[0]};
}

Cost CrossEntropyBackward::cost(const std::vector<TensorMeta>& in,
                                const std::vector<TensorMeta>& out) const {
  Cost c = Primitive::cost(in, out);
  c.flops = 4.0 * static_cast<double>(numel(in[0].shape));
  return c;
}

Tensor cross_entropy(const Tensor& logits_in, const Tensor& targets_in, int64_t ignore_index,
                     const std::string& reduction) {
  require_float(logits_in, "cross_entropy", "logits");
  if (!targets_in.defined()) fail("[cross_entropy] targets are undefined");
  if (targets_in.dtype() != Dtype::i32 && targets_in.dtype() != Dtype::i64)
    fail("[cross_entropy] targets must be integer class indices (i32 or i64), got ",
         dtype_name(targets_in.dtype()));
  if (reduction != "mean" && reduction != "sum" && reduction != "none")
    fail("[cross_entropy] reduction must be 'mean', 'sum' or 'none', got '", reduction, "'");
  if (logits_in.ndim() == 0)
    fail("[cross_entropy] logits must have a class dimension, got a scalar");
  // Unbatched (C) logits with a () target are a batch of one.
  const bool unbatched = logits_in.ndim() == 1;
  Tensor logits = unbatched ? unsqueeze(logits_in, 0) : logits_in;
  Tensor targets = unbatched && targets_in.ndim() == 0 ? unsqueeze(targets_in, 0) : targets_in;
  const Shape& ls = logits.shape();
  Shape want{ls[0]};
  want.insert(want.end(), ls.begin() + 2, ls.end());
  if (targets.shape() != want)
    fail("[cross_entropy] targets of shape ", shape_str(targets_in.shape()),
         " do not match logits of shape ", shape_str(logits_in.shape()), ": expected targets ",
         shape_str(unbatched ? Shape{} : want));
  if (ls[1] == 0) fail("[cross_entropy] logits have no classes: ", shape_str(logits_in.shape()));
  if (targets.evaluated())
    if (auto bad = find_bad_index(targets.array(), ls[1], ignore_index))
      fail_bad_index("cross_entropy", *bad, ls[1], 1, ignore_index);
  auto outs = make_node(std::make_shared<CrossEntropy>(ignore_index), {logits, targets});
  Tensor loss = outs[0];  // f32 (f64 for f64 logits)
  Tensor result;
  if (reduction == "none") {
    result = unbatched ? reshape(loss, {}) : loss;
  } else if (reduction == "sum") {
    result = sum(loss);
  } else {
    // PyTorch divides by the number of targets that are not ignore_index (0/0 = nan).
    Tensor keep = not_equal(targets, scalar(static_cast<double>(ignore_index), targets.dtype()));
    result = sum(loss) / sum(cast(keep, loss.dtype()));
  }
  // The loss comes back in the dtype the primitive computed from: the logits' dtype, or f32
  // where autocast gave it f32 logits.
  const Dtype logits_dt = outs[0].node()->inputs[0].dtype();
  return result.dtype() == logits_dt ? result : cast(result, logits_dt);
}

// ---- dropout ---------------------------------------------------------------------------------

Tensor dropout(const Tensor& x, double p, bool training, Generator& gen) {
  require_float(x, "dropout", "input");
  if (!(p >= 0 && p <= 1)) fail("[dropout] p must be in [0, 1], got ", p);
  if (p == 0 || !training) return x;
  if (p == 1) return x * 0.0;  // everything dropped, as PyTorch
  // The mask comes from the generator at build time, so a seed reproduces it exactly.
  Tensor keep = bernoulli(x.shape(), 1.0 - p, x.dtype(), gen);
  return x * (keep * (1.0 / (1.0 - p)));
}

}  // namespace hetrain
