// ONNX op handlers: each builds Hetrain ops for one node. Versions follow ONNX's
// Operators.md up to opset 22; an op bumped only to add types keeps its handler.
#include "interop/onnx_ops.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "hetrain/base/error.h"
#include "hetrain/graph/ops.h"
#include "hetrain/interop/onnx.h"
#include "hetrain/runtime/scheduler.h"

namespace hetrain::interop {

// ---- node context ---------------------------------------------------------------------------

const onnx::AttributeProto* OnnxNodeCtx::attr(const std::string& name) const {
  for (const auto& a : node.attribute())
    if (a.name() == name) return &a;
  return nullptr;
}
int64_t OnnxNodeCtx::attr_int(const std::string& name, int64_t def) const {
  const auto* a = attr(name);
  return a ? a->i() : def;
}
double OnnxNodeCtx::attr_float(const std::string& name, double def) const {
  const auto* a = attr(name);
  return a ? static_cast<double>(a->f()) : def;
}
std::string OnnxNodeCtx::attr_string(const std::string& name, const std::string& def) const {
  const auto* a = attr(name);
  return a ? a->s() : def;
}
std::vector<int64_t> OnnxNodeCtx::attr_ints(const std::string& name) const {
  const auto* a = attr(name);
  if (!a) return {};
  return {a->ints().begin(), a->ints().end()};
}
std::vector<int64_t> OnnxNodeCtx::ints(size_t i) const {
  if (!has_input(i)) return {};
  if (!is_integral(in[i].dtype()) || in[i].dtype() == Dtype::boolean)
    fail(where(), "input ", i, " must be integers, got ", dtype_name(in[i].dtype()));
  check_known(i);
  return in[i].to_vector<int64_t>();
}
void OnnxNodeCtx::check_known(size_t i) const {
  // Constants are folded to leaves; anything else is computed from the model's inputs, whose
  // values a simulated run does not have.
  if (runtime::simulating() && in.at(i).node()->prim != nullptr)
    fail(where(), "input ", i,
         " is computed from the model's input values (a data-dependent shape), which a "
         "simulated run does not know");
}
Shape onnx_reshape_target(const OnnxNodeCtx& c, const Shape& in, std::vector<int64_t> shape,
                          bool allow_zero) {
  for (size_t i = 0; i < shape.size(); ++i)
    if (shape[i] == 0 && !allow_zero) {
      if (i >= in.size()) fail(c.where(), "0 at position ", i, " beyond the input's rank");
      shape[i] = in[i];
    }
  // Bounded before the core's arithmetic: dims in [0, 2^40] (one -1 inferred), product too.
  std::vector<int64_t> known = shape;
  if (std::count(known.begin(), known.end(), -1) > 1)
    fail(c.where(), "the shape has more than one -1");
  std::replace(known.begin(), known.end(), int64_t{-1}, int64_t{1});
  onnx_checked_shape(known, c.where() + "shape");
  return {shape.begin(), shape.end()};
}
std::string OnnxNodeCtx::where() const {
  return "[" + node.op_type() + (node.name().empty() ? "" : " '" + node.name() + "'") + "] ";
}

namespace {

using Ctx = OnnxNodeCtx;
using Outs = std::vector<Tensor>;

int64_t axis_of(int64_t axis, int64_t rank, const Ctx& c) {
  if (axis < -rank || axis >= std::max<int64_t>(rank, 1))
    fail(c.where(), "axis ", axis, " is out of range for rank ", rank);
  return axis < 0 ? axis + rank : axis;
}

Tensor scalar_like(double v, const Tensor& t) { return scalar(v, t.dtype()); }

// ---- elementwise ----------------------------------------------------------------------------

OnnxOpDef binary(std::vector<int> versions, std::vector<int> supported,
                 Tensor (*f)(const Tensor&, const Tensor&)) {
  return {std::move(versions), std::move(supported),
          [f](const Ctx& c) { return Outs{f(c.in.at(0), c.in.at(1))}; }};
}
OnnxOpDef unary(std::vector<int> versions, std::vector<int> supported, Tensor (*f)(const Tensor&)) {
  return {std::move(versions), std::move(supported),
          [f](const Ctx& c) { return Outs{f(c.in.at(0))}; }};
}

Tensor onnx_div(const Tensor& a, const Tensor& b) {
  if (is_floating(a.dtype())) return div(a, b);
  // Integer division truncates toward zero (a cast from f64 truncates).
  return cast(div(cast(a, Dtype::f64), cast(b, Dtype::f64)), a.dtype());
}

Outs op_pow(const Ctx& c) {
  const Tensor& x = c.in.at(0);
  Tensor e = c.in.at(1);
  // An integer base: x^e in double, truncated to the base's type (as the reference,
  // np.power(x, e).astype(x.dtype)); 2^-0.5 is 0, not 2^0, and the output stays an integer.
  if (!is_floating(x.dtype()))
    return {cast(pow(cast(x, Dtype::f64), cast(e, Dtype::f64)), x.dtype())};
  if (e.dtype() != x.dtype()) e = cast(e, x.dtype());
  return {pow(x, e)};
}

Outs op_gelu(const Ctx& c) {
  const std::string approx = c.attr_string("approximate", "none");
  if (approx != "none" && approx != "tanh") fail(c.where(), "approximate must be none or tanh");
  return {gelu(c.in.at(0), approx)};
}

Outs op_softmax(const Ctx& c, bool log) {
  const Tensor& x = c.in.at(0);
  auto f = log ? log_softmax : softmax;
  if (c.version >= 13) return {f(x, c.attr_int("axis", -1))};
  // Before opset 13: the input coerced to 2-D at axis (default 1), normalised per row.
  const int64_t axis = axis_of(c.attr_int("axis", 1), x.ndim(), c);
  return {reshape(f(flatten(flatten(x, 0, axis - 1 < 0 ? 0 : axis - 1), axis > 0 ? 1 : 0), -1),
                  x.shape())};
}

Outs op_where(const Ctx& c) {
  Tensor cond = c.in.at(0);
  if (cond.dtype() != Dtype::boolean) cond = cast(cond, Dtype::boolean);
  Tensor a = c.in.at(1), b = c.in.at(2);
  return {where(cond, a, b.dtype() == a.dtype() ? b : cast(b, a.dtype()))};
}

Outs op_cast(const Ctx& c) {
  return {cast(c.in.at(0), dtype_from_onnx(static_cast<int>(c.attr_int("to", 1)), c.where()))};
}

Outs op_max_min(const Ctx& c, bool is_max) {
  Tensor r = c.in.at(0);
  for (size_t i = 1; i < c.in.size(); ++i) r = is_max ? maximum(r, c.in[i]) : minimum(r, c.in[i]);
  return {r};
}

// ---- shapes and indexing ----------------------------------------------------------------------

Outs op_flatten(const Ctx& c) {
  const Tensor& x = c.in.at(0);
  int64_t axis = c.attr_int("axis", 1);
  if (axis < -x.ndim() || axis > x.ndim()) fail(c.where(), "axis ", axis, " out of range");
  if (axis < 0) axis += x.ndim();
  int64_t outer = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= x.shape()[static_cast<size_t>(d)];
  return {reshape(x, {outer, outer ? x.numel() / outer : 0})};
}

Outs op_reshape(const Ctx& c) {
  const Tensor& x = c.in.at(0);
  std::vector<int64_t> shape = c.version >= 5 ? c.ints(1) : c.attr_ints("shape");
  return {reshape(x, onnx_reshape_target(c, x.shape(), shape, c.attr_int("allowzero", 0) != 0))};
}

Outs op_transpose(const Ctx& c) {
  const Tensor& x = c.in.at(0);
  std::vector<int64_t> perm = c.attr_ints("perm");
  if (perm.empty())
    for (int64_t d = x.ndim() - 1; d >= 0; --d) perm.push_back(d);
  return {permute(x, perm)};
}

Outs op_concat(const Ctx& c) {
  std::vector<Tensor> xs;
  for (const auto& t : c.in)
    if (t.defined()) xs.push_back(t);
  return {concat(xs, c.attr_int("axis", 0))};
}

Outs op_split(const Ctx& c) {
  const Tensor& x = c.in.at(0);
  const int64_t axis = axis_of(c.attr_int("axis", 0), x.ndim(), c);
  const int64_t n = x.shape()[static_cast<size_t>(axis)];
  std::vector<int64_t> sizes = c.version >= 13 ? c.ints(1) : c.attr_ints("split");
  const int64_t parts = c.version >= 18 && c.has_attr("num_outputs") ? c.attr_int("num_outputs", 1)
                                                                     : c.node.output_size();
  for (int64_t s : sizes)
    if (s < 0 || s > n) fail(c.where(), "split size ", s, " is outside [0, ", n, "]");
  if (sizes.empty() && (parts < 1 || parts > c.node.output_size()))
    fail(c.where(), "num_outputs ", parts, " for ", c.node.output_size(), " output(s)");
  if (sizes.empty()) {
    const int64_t each = (n + parts - 1) / parts;  // the last part may be smaller (opset 18)
    for (int64_t k = 0, left = n; k < parts; ++k, left -= each)
      sizes.push_back(std::min(each, left));
  }
  return split(x, sizes, axis);
}

Outs op_slice(const Ctx& c) {
  Tensor x = c.in.at(0);
  std::vector<int64_t> starts, ends, axes, steps;
  if (c.version >= 10) {
    starts = c.ints(1), ends = c.ints(2), axes = c.ints(3), steps = c.ints(4);
  } else {
    starts = c.attr_ints("starts"), ends = c.attr_ints("ends"), axes = c.attr_ints("axes");
  }
  if (axes.empty())
    for (size_t i = 0; i < starts.size(); ++i) axes.push_back(static_cast<int64_t>(i));
  if (steps.empty()) steps.assign(starts.size(), 1);
  for (size_t i = 0; i < starts.size(); ++i) {
    const int64_t a = axis_of(axes[i], x.ndim(), c), n = x.shape()[static_cast<size_t>(a)];
    if (steps[i] == 0) fail(c.where(), "step 0");
    // A step past the axis selects the start alone, as a step of the axis' length does; the
    // clamp keeps the index arithmetic below (and the core's) from overflowing.
    const int64_t most = std::max<int64_t>(n, 1);
    const int64_t step = std::clamp(steps[i], -most, most);
    auto clampi = [&](int64_t v, int64_t lo, int64_t hi) {
      if (v < 0) v += n;
      return std::clamp(v, lo, hi);
    };
    if (step > 0) {
      x = slice(x, a, clampi(starts[i], 0, n), clampi(ends[i], 0, n), step);
    } else {
      // Negative steps: reverse with an index_select of the positions.
      const int64_t s = clampi(starts[i], -1, n - 1);
      const int64_t e = ends[i] < -n ? -1 : clampi(ends[i], -1, n - 1);
      std::vector<int64_t> idx;
      for (int64_t k = s; k > e; k += step) idx.push_back(k);
      x = index_select(x, a, from_vector(idx, {static_cast<int64_t>(idx.size())}));
    }
  }
  return {x};
}

Outs op_squeeze(const Ctx& c) {
  Tensor x = c.in.at(0);
  std::vector<int64_t> axes = c.version >= 13 ? c.ints(1) : c.attr_ints("axes");
  if (axes.empty())
    for (int64_t d = 0; d < x.ndim(); ++d)
      if (x.shape()[static_cast<size_t>(d)] == 1) axes.push_back(d);
  for (auto& a : axes) a = axis_of(a, x.ndim(), c);
  std::sort(axes.rbegin(), axes.rend());
  for (int64_t a : axes) x = squeeze(x, a);
  return {x};
}

Outs op_unsqueeze(const Ctx& c) {
  Tensor x = c.in.at(0);
  std::vector<int64_t> axes = c.version >= 13 ? c.ints(1) : c.attr_ints("axes");
  const int64_t rank = x.ndim() + static_cast<int64_t>(axes.size());
  for (auto& a : axes) a = axis_of(a, rank, c);
  std::sort(axes.begin(), axes.end());
  for (int64_t a : axes) x = unsqueeze(x, a);
  return {x};
}

Outs op_expand(const Ctx& c) {
  const Tensor& x = c.in.at(0);
  std::vector<int64_t> shape = c.ints(1);
  // Bidirectional broadcasting: the result has the larger of each pair of dimensions.
  const size_t rank = std::max(shape.size(), x.shape().size());
  Shape out(rank, 1);
  for (size_t i = 0; i < rank; ++i) {
    const int64_t a = i + x.shape().size() >= rank ? x.shape()[i + x.shape().size() - rank] : 1;
    const int64_t b = i + shape.size() >= rank ? shape[i + shape.size() - rank] : 1;
    if (a != 1 && b != 1 && a != b)
      fail(c.where(), "cannot broadcast ", shape_str(x.shape()), " to ",
           shape_str(Shape(shape.begin(), shape.end())));
    out[i] = a == 1 ? b : a;
  }
  return {broadcast_to(x, onnx_checked_shape(out, c.where() + "shape"))};
}

Outs op_gather(const Ctx& c) {
  const Tensor& data = c.in.at(0);
  Tensor idx = c.in.at(1);
  const int64_t axis = axis_of(c.attr_int("axis", 0), data.ndim(), c);
  const int64_t n = data.shape()[static_cast<size_t>(axis)];
  if (idx.dtype() != Dtype::i64) idx = cast(idx, Dtype::i64);
  if (idx.evaluated() || idx.node()->prim == nullptr) {
    std::vector<int64_t> v = idx.to_vector<int64_t>();
    bool neg = std::any_of(v.begin(), v.end(), [](int64_t i) { return i < 0; });
    if (neg) {
      for (auto& i : v) i = i < 0 ? i + n : i;
      idx = from_vector(v, idx.shape());
    }
  } else {
    idx = where(less(idx, scalar(0, Dtype::i64)), idx + scalar(static_cast<double>(n), Dtype::i64),
                idx);
  }
  if (axis == 0 && data.ndim() == 2) return {embedding(data, idx)};
  Shape out(data.shape().begin(), data.shape().begin() + axis);
  out.insert(out.end(), idx.shape().begin(), idx.shape().end());
  out.insert(out.end(), data.shape().begin() + axis + 1, data.shape().end());
  return {reshape(index_select(data, axis, reshape(idx, {idx.numel()})), out)};
}

Outs op_shape(const Ctx& c) {
  const Shape& s = c.in.at(0).shape();
  int64_t r = static_cast<int64_t>(s.size());
  int64_t start = c.attr_int("start", 0), end = c.attr_int("end", r);
  if (start < 0) start += r;
  if (end < 0) end += r;
  start = std::clamp<int64_t>(start, 0, r);
  end = std::clamp<int64_t>(end, start, r);
  std::vector<int64_t> v(s.begin() + start, s.begin() + end);
  return {from_vector(v, {static_cast<int64_t>(v.size())})};
}

Outs op_constant(const Ctx& c) {
  if (const auto* a = c.attr("value")) return {tensor_from_proto(a->t(), "", c.where() + "value")};
  if (const auto* a = c.attr("value_float")) return {scalar(a->f(), Dtype::f32)};
  if (const auto* a = c.attr("value_int")) return {scalar(static_cast<double>(a->i()), Dtype::i64)};
  if (const auto* a = c.attr("value_floats")) {
    std::vector<float> v(a->floats().begin(), a->floats().end());
    return {from_vector(v, {static_cast<int64_t>(v.size())})};
  }
  if (const auto* a = c.attr("value_ints")) {
    std::vector<int64_t> v(a->ints().begin(), a->ints().end());
    return {from_vector(v, {static_cast<int64_t>(v.size())})};
  }
  fail(c.where(), "only value, value_float(s) and value_int(s) are supported");
}

Outs op_constant_of_shape(const Ctx& c) {
  const std::vector<int64_t> dims = c.ints(0);
  double value = 0;
  Dtype dtype = Dtype::f32;
  if (const auto* a = c.attr("value")) {
    const Tensor v = tensor_from_proto(a->t(), "", c.where() + "value");
    if (v.numel() != 1) fail(c.where(), "value must hold one element, it has ", v.numel());
    value = v.item<double>(), dtype = v.dtype();
  }
  return {full(onnx_checked_shape(dims, c.where() + "shape"), value, dtype)};
}

Outs op_range(const Ctx& c) {
  const Dtype dt = c.in.at(0).dtype();
  auto val = [&](size_t i) {
    c.check_known(i);
    return cast(c.in.at(i), Dtype::f64).item<double>();
  };
  const double start = val(0), limit = val(1), delta = val(2);
  if (delta == 0) fail(c.where(), "delta 0");
  const double count = std::ceil((limit - start) / delta);
  if (!(count <= static_cast<double>(kOnnxMaxElements)))  // NaN and infinities too
    fail(c.where(), "start ", start, ", limit ", limit, " and delta ", delta, " give ", count,
         " elements, more than 2^40");
  const int64_t n = std::max<int64_t>(0, static_cast<int64_t>(count));
  return {arange(start, start + static_cast<double>(n) * delta - delta / 2, delta, dt)};
}

Outs op_trilu(const Ctx& c) {
  const Tensor& x = c.in.at(0);
  const int64_t k = c.has_input(1) ? c.ints(1).at(0) : 0;
  const int64_t r = x.shape()[static_cast<size_t>(x.ndim() - 2)], m = x.shape().back();
  Tensor rows = reshape(arange(0, static_cast<double>(r), 1, Dtype::i64), {r, 1});
  Tensor cols = reshape(arange(0, static_cast<double>(m), 1, Dtype::i64), {1, m});
  Tensor diff = cols - rows;  // j - i
  Tensor keep = c.attr_int("upper", 1)
                    ? greater_equal(diff, scalar(static_cast<double>(k), Dtype::i64))
                    : less_equal(diff, scalar(static_cast<double>(k), Dtype::i64));
  return {where(keep, x, zeros({}, x.dtype()))};
}

Outs op_reduce(const Ctx& c, bool is_mean, int axes_input_from) {
  const Tensor& x = c.in.at(0);
  std::vector<int64_t> axes = c.version >= axes_input_from ? c.ints(1) : c.attr_ints("axes");
  const bool keep = c.attr_int("keepdims", 1) != 0;
  if (axes.empty()) {
    if (c.attr_int("noop_with_empty_axes", 0)) return {x};
    for (int64_t d = 0; d < x.ndim(); ++d) axes.push_back(d);
  }
  for (auto& a : axes) a = axis_of(a, x.ndim(), c);
  if (x.ndim() == 0) return {x};
  return {is_mean ? mean(x, axes, keep) : sum(x, axes, keep)};
}

Outs op_not(const Ctx& c) { return {equal(c.in.at(0), zeros({}, Dtype::boolean))}; }

}  // namespace

const std::map<std::string, OnnxOpDef>& onnx_op_table() {
  using std::vector;
  static const std::map<std::string, OnnxOpDef> table = [] {
    std::map<std::string, OnnxOpDef> t;
    const vector<int> arith = {1, 6, 7, 13, 14};
    t["Add"] = binary(arith, {7, 13, 14}, add);
    t["Sub"] = binary(arith, {7, 13, 14}, sub);
    t["Mul"] = binary(arith, {7, 13, 14}, mul);
    t["Div"] = binary(arith, {7, 13, 14}, onnx_div);
    t["Pow"] = {{1, 7, 12, 13, 15}, {7, 12, 13, 15}, op_pow};
    for (const char* op : {"Sqrt", "Exp", "Log", "Tanh", "Sigmoid", "Neg", "Abs", "Reciprocal"})
      t[op] = {{1, 6, 13}, {6, 13}, nullptr};
    t["Sqrt"].fn = [](const Ctx& c) { return Outs{sqrt(c.in.at(0))}; };
    t["Exp"].fn = [](const Ctx& c) { return Outs{exp(c.in.at(0))}; };
    t["Log"].fn = [](const Ctx& c) { return Outs{log(c.in.at(0))}; };
    t["Tanh"].fn = [](const Ctx& c) { return Outs{tanh(c.in.at(0))}; };
    t["Sigmoid"].fn = [](const Ctx& c) { return Outs{sigmoid(c.in.at(0))}; };
    t["Neg"].fn = [](const Ctx& c) { return Outs{neg(c.in.at(0))}; };
    t["Abs"].fn = [](const Ctx& c) { return Outs{abs(c.in.at(0))}; };
    t["Reciprocal"].fn = [](const Ctx& c) { return Outs{scalar_like(1, c.in.at(0)) / c.in.at(0)}; };
    t["Relu"] = unary({1, 6, 13, 14}, {6, 13, 14}, relu);
    t["Erf"] = {{9, 13}, {9, 13}, nullptr};
    t["Erf"].fn = [](const Ctx& c) {
      // erf(x) = 2 gelu(x sqrt 2) / (x sqrt 2) - 1 has a 0/0 at x = 0; use erf = 2 Phi(x sqrt 2) -
      // 1 through gelu(z)/z = Phi(z), with z = 0 mapped to Phi(0) = 1/2.
      const Tensor& x = c.in.at(0);
      Tensor z = x * std::sqrt(2.0);
      Tensor zero = equal(z, zeros({}, z.dtype()));
      Tensor safe = where(zero, ones({}, z.dtype()), z);
      Tensor phi = where(zero, full({}, 0.5, z.dtype()), gelu(safe) / safe);
      return Outs{phi * 2.0 - 1.0};
    };
    t["Gelu"] = {{20}, {20}, op_gelu};
    t["Softmax"] = {{1, 11, 13}, {1, 11, 13}, [](const Ctx& c) { return op_softmax(c, false); }};
    t["LogSoftmax"] = {{1, 11, 13}, {1, 11, 13}, [](const Ctx& c) { return op_softmax(c, true); }};
    t["Gemm"] = {{1, 6, 7, 9, 11, 13}, {7, 9, 11, 13}, onnx_gemm};
    t["MatMul"] = {
        {1, 9, 13}, {1, 9, 13}, [](const Ctx& c) { return Outs{matmul(c.in.at(0), c.in.at(1))}; }};
    t["Conv"] = {{1, 11, 22}, {1, 11, 22}, onnx_conv};
    t["MaxPool"] = {{1, 8, 10, 11, 12, 22}, {1, 8, 10, 11, 12, 22}, [](const Ctx& c) {
                      return onnx_pool(c, true);
                    }};
    t["AveragePool"] = {{1, 7, 10, 11, 19, 22}, {7, 10, 11, 19, 22}, [](const Ctx& c) {
                          return onnx_pool(c, false);
                        }};
    t["GlobalAveragePool"] = {{1, 22}, {1, 22}, onnx_global_avg_pool};
    t["BatchNormalization"] = {{1, 6, 7, 9, 14, 15}, {9, 14, 15}, onnx_batch_norm};
    t["LayerNormalization"] = {{17}, {17}, onnx_layer_norm};
    t["Flatten"] = {{1, 9, 11, 13, 21}, {1, 9, 11, 13, 21}, op_flatten};
    t["Gather"] = {{1, 11, 13}, {1, 11, 13}, op_gather};
    t["Reshape"] = {{1, 5, 13, 14, 19, 21}, {5, 13, 14, 19, 21}, op_reshape};
    t["Transpose"] = {{1, 13, 21}, {1, 13, 21}, op_transpose};
    t["Concat"] = {{1, 4, 11, 13}, {4, 11, 13}, op_concat};
    t["Split"] = {{1, 2, 11, 13, 18}, {2, 11, 13, 18}, op_split};
    t["Slice"] = {{1, 10, 11, 13}, {1, 10, 11, 13}, op_slice};
    t["Squeeze"] = {{1, 11, 13, 21}, {1, 11, 13, 21}, op_squeeze};
    t["Unsqueeze"] = {{1, 11, 13, 21}, {1, 11, 13, 21}, op_unsqueeze};
    t["Expand"] = {{8, 13}, {8, 13}, op_expand};
    t["Where"] = {{9, 16}, {9, 16}, op_where};
    t["Equal"] = binary({1, 7, 11, 13, 19}, {7, 11, 13, 19}, equal);
    t["Greater"] = binary({1, 7, 9, 13}, {7, 9, 13}, greater);
    t["Less"] = binary({1, 7, 9, 13}, {7, 9, 13}, less);
    t["GreaterOrEqual"] = binary({12, 16}, {12, 16}, greater_equal);
    t["LessOrEqual"] = binary({12, 16}, {12, 16}, less_equal);
    t["Not"] = {{1}, {1}, op_not};
    t["Max"] = {{1, 6, 8, 12, 13}, {8, 12, 13}, [](const Ctx& c) { return op_max_min(c, true); }};
    t["Min"] = {{1, 6, 8, 12, 13}, {8, 12, 13}, [](const Ctx& c) { return op_max_min(c, false); }};
    t["ReduceMean"] = {
        {1, 11, 13, 18}, {1, 11, 13, 18}, [](const Ctx& c) { return op_reduce(c, true, 18); }};
    t["ReduceSum"] = {
        {1, 11, 13}, {1, 11, 13}, [](const Ctx& c) { return op_reduce(c, false, 13); }};
    t["Dropout"] = {{1, 6, 7, 10, 12, 13, 22}, {7, 10, 12, 13, 22}, onnx_dropout};
    t["Identity"] = {{1, 13, 14, 16, 19, 21}, {1, 13, 14, 16, 19, 21}, [](const Ctx& c) {
                       return Outs{c.in.at(0)};
                     }};
    t["Constant"] = {{1, 9, 11, 12, 13, 19, 21}, {1, 9, 11, 12, 13, 19, 21}, op_constant};
    t["Shape"] = {{1, 13, 15, 19, 21}, {1, 13, 15, 19, 21}, op_shape};
    t["Cast"] = {{1, 6, 9, 13, 19, 21}, {6, 9, 13, 19, 21}, op_cast};
    t["Trilu"] = {{14}, {14}, op_trilu};
    t["Range"] = {{11}, {11}, op_range};
    t["ConstantOfShape"] = {{9, 20, 21}, {9, 20, 21}, op_constant_of_shape};
    return t;
  }();
  return table;
}

int onnx_resolve_version(const OnnxOpDef& def, int opset) {
  int v = 0;
  for (int s : def.versions)
    if (s <= opset) v = std::max(v, s);
  return v;
}

}  // namespace hetrain::interop
