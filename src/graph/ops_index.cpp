// embedding, index_select and gather: builders, shape inference and vjps (scatter-adds).
#include <string>

#include "graph/prims/nn.h"
#include "hetrain/graph/ops.h"

namespace hetrain {

std::optional<int64_t> find_bad_index(const Array& index_in, int64_t bound,
                                      std::optional<int64_t> skip) {
  // Indices in a GPU's memory are scanned from a host copy (it waits for their kernel).
  const Array index = index_in.device().kind == DeviceKind::cuda
                          ? copy_to_device(index_in, Device::cpu())
                          : index_in;
  std::optional<int64_t> bad;
  auto scan = [&]<class I>() {
    const I* p = index.data<I>();
    // Strided walk: indices are small next to the data they select.
    const size_t nd = index.shape.size();
    std::vector<int64_t> coord(nd, 0);
    const int64_t n = index.numel();
    int64_t off = 0;
    for (int64_t k = 0; k < n; ++k) {
      int64_t v = static_cast<int64_t>(p[off]);
      if ((v < 0 || v >= bound) && !(skip && v == *skip)) {
        bad = v;
        return;
      }
      for (size_t d = nd; d-- > 0;) {
        off += index.strides[d];
        if (++coord[d] < index.shape[d]) break;
        off -= index.strides[d] * index.shape[d];
        coord[d] = 0;
      }
    }
  };
  dispatch_index(index.dtype, "index", scan);
  return bad;
}

void fail_bad_index(const char* op, int64_t bad, int64_t bound, int axis, int64_t ignore_index) {
  const std::string o = op;
  if (o == "embedding")
    fail("[embedding] id ", bad, " is out of range for an embedding table of V=", bound,
         " rows (ids must be in [0, ", bound, "))");
  if (o == "cross_entropy")
    fail("[cross_entropy] target ", bad, " is out of range for C=", bound,
         " classes (targets must be in [0, ", bound, ") or equal ignore_index=", ignore_index, ")");
  fail("[", op, "] index ", bad, " is out of range for axis ", axis, " of size ", bound);
}

namespace {

void require_index(const Tensor& index, const char* op, const char* what) {
  if (!index.defined()) fail("[", op, "] ", what, " is undefined");
  if (index.dtype() != Dtype::i32 && index.dtype() != Dtype::i64)
    fail("[", op, "] ", what, " must be an integer tensor (i32 or i64), got ",
         dtype_name(index.dtype()));
}

/// Bounds errors at the op call when the indices already hold data; otherwise the kernel
/// reports them at evaluation.
void check_now(const Tensor& index, int64_t bound, const char* op, int axis) {
  if (index.evaluated())
    if (auto bad = find_bad_index(index.array(), bound)) fail_bad_index(op, *bad, bound, axis);
}

}  // namespace

// ---- Take / IndexAdd ---------------------------------------------------------------------------

std::vector<TensorMeta> Take::infer(const std::vector<TensorMeta>& in) const {
  const Shape& xs = in[0].shape;
  Shape s(xs.begin(), xs.begin() + axis_);
  s.insert(s.end(), in[1].shape.begin(), in[1].shape.end());
  s.insert(s.end(), xs.begin() + axis_ + 1, xs.end());
  return {{s, in[0].dtype}};
}

Cost Take::cost(const std::vector<TensorMeta>& in, const std::vector<TensorMeta>& out) const {
  Cost c;
  // Reads the selected slices and the indices, writes the output.
  c.bytes_read = static_cast<double>(numel(out[0].shape) * dtype_size(in[0].dtype) +
                                     numel(in[1].shape) * dtype_size(in[1].dtype));
  c.bytes_written = static_cast<double>(numel(out[0].shape) * dtype_size(out[0].dtype));
  return c;
}

std::vector<Tensor> Take::vjp(const std::vector<Tensor>& x, const std::vector<Tensor>&,
                              const std::vector<Tensor>& g, const std::vector<int>&) const {
  return {make_node1(std::make_shared<IndexAdd>(x[0].shape(), axis_), {g[0], x[1]})};
}

std::vector<TensorMeta> IndexAdd::infer(const std::vector<TensorMeta>& in) const {
  return {{full_, in[0].dtype}};
}

std::vector<Tensor> IndexAdd::vjp(const std::vector<Tensor>& x, const std::vector<Tensor>&,
                                  const std::vector<Tensor>& g, const std::vector<int>&) const {
  return {make_node1(std::make_shared<Take>(axis_, "index_select"), {g[0], x[1]})};
}

Tensor embedding(const Tensor& weight, const Tensor& ids) {
  if (!weight.defined()) fail("[embedding] weight is undefined");
  if (weight.ndim() != 2)
    fail("[embedding] weight must be 2-D (V, D), got ", shape_str(weight.shape()));
  require_index(ids, "embedding", "ids");
  check_now(ids, weight.shape()[0], "embedding", 0);
  return make_node1(std::make_shared<Take>(0, "embedding"), {weight, ids});
}

Tensor index_select(const Tensor& x, int64_t axis, const Tensor& index) {
  if (!x.defined()) fail("[index_select] input is undefined");
  require_index(index, "index_select", "index");
  if (index.ndim() > 1)
    fail("[index_select] index must be 0-D or 1-D, got ", shape_str(index.shape()));
  if (x.ndim() == 0) {
    // torch treats a 0-d input as having one element along axis 0.
    normalize_axis(axis, 1, "index_select");
    return reshape(index_select(reshape(x, {1}), 0, reshape(index, {index.numel()})),
                   index.ndim() == 0 ? Shape{} : Shape{index.numel()});
  }
  int a = normalize_axis(axis, x.shape().size(), "index_select");
  check_now(index, x.shape()[static_cast<size_t>(a)], "index_select", a);
  // A 0-d index keeps the axis with size 1, as torch.index_select.
  Tensor idx = index.ndim() == 0 ? reshape(index, {1}) : index;
  return make_node1(std::make_shared<Take>(a, "index_select"), {x, idx});
}

// ---- Gather / ScatterAdd -----------------------------------------------------------------------

std::vector<TensorMeta> Gather::infer(const std::vector<TensorMeta>& in) const {
  return {{in[1].shape, in[0].dtype}};
}

std::vector<Tensor> Gather::vjp(const std::vector<Tensor>& x, const std::vector<Tensor>&,
                                const std::vector<Tensor>& g, const std::vector<int>&) const {
  return {make_node1(std::make_shared<ScatterAdd>(x[0].shape(), axis_), {g[0], x[1]})};
}

std::vector<TensorMeta> ScatterAdd::infer(const std::vector<TensorMeta>& in) const {
  return {{full_, in[0].dtype}};
}

std::vector<Tensor> ScatterAdd::vjp(const std::vector<Tensor>& x, const std::vector<Tensor>&,
                                    const std::vector<Tensor>& g, const std::vector<int>&) const {
  return {make_node1(std::make_shared<Gather>(axis_), {g[0], x[1]})};
}

Tensor gather(const Tensor& x, int64_t axis, const Tensor& index) {
  if (!x.defined()) fail("[gather] input is undefined");
  require_index(index, "gather", "index");
  if (x.ndim() == 0 && index.ndim() == 0) {
    normalize_axis(axis, 1, "gather");
    return reshape(gather(reshape(x, {1}), 0, reshape(index, {1})), {});
  }
  if (index.ndim() != x.ndim())
    fail("[gather] index ", shape_str(index.shape()), " must have as many dimensions as input ",
         shape_str(x.shape()));
  int a = normalize_axis(axis, x.shape().size(), "gather");
  for (size_t d = 0; d < x.shape().size(); ++d)
    if (static_cast<int>(d) != a && index.shape()[d] > x.shape()[d])
      fail("[gather] index ", shape_str(index.shape()), " is larger than input ",
           shape_str(x.shape()), " in dimension ", d, " (only axis ", a, " may differ)");
  check_now(index, x.shape()[static_cast<size_t>(a)], "gather", a);
  return make_node1(std::make_shared<Gather>(a), {x, index});
}

}  // namespace hetrain
