#include "hetrain/graph/tensor.h"

#include <sstream>

#include "hetrain/base/error.h"
#include "hetrain/graph/autocast.h"
#include "hetrain/graph/autodiff.h"
#include "hetrain/graph/ops.h"
#include "hetrain/graph/primitive.h"

namespace hetrain {

namespace {
thread_local bool g_grad_enabled = true;
thread_local bool g_pin_active = false;
thread_local Device g_pin = Device::cpu();

void require_defined(const Tensor& t, const char* what) {
  if (!t.defined()) fail("[tensor] ", what, " on an undefined tensor");
}
}  // namespace

bool grad_enabled() { return g_grad_enabled; }
NoGradScope::NoGradScope() : prev_(g_grad_enabled) { g_grad_enabled = false; }
NoGradScope::~NoGradScope() { g_grad_enabled = prev_; }

DeviceScope::DeviceScope(Device d) : prev_(g_pin), prev_active_(g_pin_active) {
  g_pin = d;
  g_pin_active = true;
}
DeviceScope::~DeviceScope() {
  g_pin = prev_;
  g_pin_active = prev_active_;
}

const Shape& Tensor::shape() const {
  require_defined(*this, "shape()");
  return node_->outs[index_].shape;
}
Dtype Tensor::dtype() const {
  require_defined(*this, "dtype()");
  return node_->outs[index_].dtype;
}
int64_t Tensor::size(int64_t axis) const {
  return shape()[normalize_axis(axis, shape().size(), "size")];
}

const Tensor& Tensor::eval() const {
  require_defined(*this, "eval()");
  if (!node_->evaluated()) hetrain::eval({*this});
  return *this;
}
bool Tensor::evaluated() const { return defined() && node_->evaluated(); }

const Array& Tensor::array() const {
  eval();
  if (node_->sharded && !node_->outs[index_].has_data())
    fail("[zero] a sharded parameter ", shape_str(shape()),
         " has no data outside the evals that gather it (--zero 3)");
  return node_->outs[index_];
}

namespace {
template <class T, class S>
void gather_logical(const Array& a, std::vector<T>& out) {
  const S* base = a.data<S>();
  size_t nd = a.shape.size();
  int64_t n = a.numel();
  out.resize(static_cast<size_t>(n));
  std::vector<int64_t> idx(nd, 0);
  int64_t off = 0;
  for (int64_t i = 0; i < n; ++i) {
    out[static_cast<size_t>(i)] = static_cast<T>(to_compute(base[off]));
    for (size_t d = nd; d-- > 0;) {
      if (++idx[d] < a.shape[d]) {
        off += a.strides[d];
        break;
      }
      off -= a.strides[d] * (a.shape[d] - 1);
      idx[d] = 0;
    }
  }
}
}  // namespace

template <class T>
std::vector<T> Tensor::to_vector() const {
  const Array& dev = array();
  // Data in a GPU's memory is read through a copy to the host (it waits for the kernels).
  Array host;
  if (dev.device().kind == DeviceKind::cuda) host = copy_to_device(dev, Device::cpu());
  const Array& a = host.has_data() ? host : dev;
  std::vector<T> out;
  switch (a.dtype) {
    case Dtype::f64:
      gather_logical<T, double>(a, out);
      break;
    case Dtype::f32:
      gather_logical<T, float>(a, out);
      break;
    case Dtype::f16:
      gather_logical<T, Half>(a, out);
      break;
    case Dtype::bf16:
      gather_logical<T, BFloat16>(a, out);
      break;
    case Dtype::i32:
      gather_logical<T, int32_t>(a, out);
      break;
    case Dtype::i64:
      gather_logical<T, int64_t>(a, out);
      break;
    case Dtype::boolean:
      gather_logical<T, bool>(a, out);
      break;
  }
  return out;
}

template <class T>
T Tensor::item() const {
  if (numel() != 1) fail("[item] needs a tensor with one element, got shape ", shape_str(shape()));
  return to_vector<T>()[0];
}

template std::vector<float> Tensor::to_vector<float>() const;
template std::vector<double> Tensor::to_vector<double>() const;
template std::vector<int64_t> Tensor::to_vector<int64_t>() const;
template std::vector<int32_t> Tensor::to_vector<int32_t>() const;
template float Tensor::item<float>() const;
template double Tensor::item<double>() const;
template int64_t Tensor::item<int64_t>() const;
template int32_t Tensor::item<int32_t>() const;
template bool Tensor::item<bool>() const;

bool Tensor::requires_grad() const { return defined() && node_->requires_grad; }
bool Tensor::is_leaf() const { return defined() && !node_->prim && node_->inputs.empty(); }

Tensor& Tensor::requires_grad_(bool on) {
  require_defined(*this, "requires_grad_()");
  if (!is_leaf())
    fail("[requires_grad_] only leaf tensors can be marked; this one is the output of '",
         node_->prim ? node_->prim->name() : "?", "' (use detach() first)");
  if (on && !is_floating(dtype()))
    fail("[requires_grad_] only floating-point tensors can require gradients, got ",
         dtype_name(dtype()));
  node_->requires_grad = on;
  node_->leaf_requires_grad = on;
  return *this;
}

Tensor Tensor::grad() const {
  require_defined(*this, "grad()");
  return node_->grad;
}
void Tensor::set_grad(const Tensor& g) const {
  require_defined(*this, "set_grad()");
  if (g.defined() && g.shape() != shape())
    fail("[set_grad] gradient shape ", shape_str(g.shape()), " differs from tensor shape ",
         shape_str(shape()));
  node_->grad = g;
}
void Tensor::zero_grad() const {
  if (defined()) node_->grad = Tensor();
}

void Tensor::backward() const { hetrain::backward(*this, Tensor()); }
void Tensor::backward(const Tensor& cotangent) const { hetrain::backward(*this, cotangent); }

Tensor Tensor::detach() const {
  const Array& a = array();
  return make_leaf(a);
}

std::string Tensor::str() const {
  if (!defined()) return "Tensor(undefined)";
  std::ostringstream os;
  os << "Tensor(" << dtype_name(dtype()) << ", " << shape_str(shape()) << ")";
  return os.str();
}

namespace {
std::shared_ptr<Node> build_node(std::shared_ptr<Primitive> prim, std::vector<Tensor> inputs) {
  // Mixed precision is a policy applied here, to every node: casts become graph nodes.
  amp::apply_autocast(prim->name(), inputs);
  std::vector<TensorMeta> in_meta;
  in_meta.reserve(inputs.size());
  bool rg = false;
  for (const auto& t : inputs) {
    if (!t.defined()) fail("[", prim->name(), "] an input is an undefined tensor");
    in_meta.push_back({t.shape(), t.dtype()});
    rg = rg || t.requires_grad();
  }
  std::vector<TensorMeta> out_meta = prim->infer(in_meta);
  auto node = std::make_shared<Node>();
  node->prim = std::move(prim);
  node->inputs = std::move(inputs);
  node->outs.resize(out_meta.size());
  MemoryTag tag = MemoryTagScope::current();
  bool any_float = false;
  for (size_t i = 0; i < out_meta.size(); ++i) {
    node->outs[i].shape = std::move(out_meta[i].shape);
    node->outs[i].dtype = out_meta[i].dtype;
    node->outs[i].tag = tag;
    any_float = any_float || is_floating(node->outs[i].dtype);
  }
  node->requires_grad = rg && any_float && g_grad_enabled;
  if (g_pin_active) {
    node->device = g_pin;
    node->pinned = true;
  }
  return node;
}
}  // namespace

std::vector<Tensor> make_node(std::shared_ptr<Primitive> prim, std::vector<Tensor> inputs) {
  std::shared_ptr<Node> node = build_node(std::move(prim), std::move(inputs));
  std::vector<Tensor> outs;
  outs.reserve(node->outs.size());
  for (size_t i = 0; i < node->outs.size(); ++i) outs.emplace_back(node, static_cast<int>(i));
  return outs;
}

Tensor make_node1(std::shared_ptr<Primitive> prim, std::vector<Tensor> inputs) {
  // One node, one tensor: skips make_node's vector of outputs.
  return Tensor(build_node(std::move(prim), std::move(inputs)), 0);
}

Tensor make_leaf(Array a) {
  auto node = std::make_shared<Node>();
  node->outs.push_back(std::move(a));
  return Tensor(node, 0);
}

}  // namespace hetrain
