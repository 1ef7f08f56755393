// Fused primitives' shapes, costs and vjps: those of the compositions they replace.
#include "graph/prims/fused.h"
#include "hetrain/graph/autodiff.h"
#include "hetrain/graph/ops.h"

namespace hetrain {

namespace {
std::vector<TensorMeta> metas(const std::vector<const Array*>& a) {
  std::vector<TensorMeta> r;
  for (const Array* x : a) r.push_back({x->shape, x->dtype});
  return r;
}
}  // namespace

std::vector<TensorMeta> ElementwiseChain::infer(const std::vector<TensorMeta>& in) const {
  if (static_cast<int>(in.size()) != num_inputs_ || steps_.empty())
    fail("[fused_elementwise] internal: ", in.size(), " inputs for a chain of ", num_inputs_);
  std::vector<TensorMeta> slot = in;
  for (const Step& s : steps_) {
    std::vector<TensorMeta> args;
    for (int a : s.args) args.push_back(slot.at(static_cast<size_t>(a)));
    slot.push_back(s.prim->infer(args).at(0));
  }
  return {slot.back()};
}

Cost ElementwiseChain::cost(const std::vector<TensorMeta>& in,
                            const std::vector<TensorMeta>& out) const {
  // Traffic: the chain's inputs and output only; work: every step's.
  Cost c = Primitive::cost(in, out);
  c.flops = 0;
  for (const Step& s : steps_) {
    std::vector<TensorMeta> args(s.args.size(), s.out);  // every operand has the output's shape
    c.flops += s.prim->cost(args, {s.out}).flops;
  }
  return c;
}

void WithEpilogue::eval_cuda(const std::vector<const Array*>& in,
                             const std::vector<Array*>& out) const {
  const std::vector<const Array*> main_in(in.begin(), in.begin() + num_main_);
  const std::vector<TensorMeta> produced = main_->infer(metas(main_in));
  Array t;
  t.shape = produced[0].shape;
  t.dtype = produced[0].dtype;
  t.tag = MemoryTag::workspace;
  main_->eval_cuda(main_in, {&t});
  if (as_shape_) {
    t.shape = *as_shape_;
    t.strides = contiguous_strides(t.shape);
  }
  epilogue_->eval_cuda(chain_inputs<const Array*>(&t, in), out);
}

void ElementwiseChain::eval_cuda(const std::vector<const Array*>& in,
                                 const std::vector<Array*>& out) const {
  std::vector<Array> tmp(steps_.size());
  std::vector<const Array*> slot = in;
  for (size_t k = 0; k < steps_.size(); ++k) {
    const Step& s = steps_[k];
    std::vector<const Array*> args;
    for (int a : s.args) args.push_back(slot[static_cast<size_t>(a)]);
    Array* o = out[0];
    if (k + 1 < steps_.size()) {
      tmp[k].shape = s.out.shape;
      tmp[k].dtype = s.out.dtype;
      tmp[k].tag = MemoryTag::workspace;
      o = &tmp[k];
    }
    s.prim->eval_cuda(args, {o});
    slot.push_back(o);
  }
}

bool ElementwiseChain::has_kernel(DeviceKind k) const {
  for (const Step& s : steps_)
    if (!s.prim->has_kernel(k)) return false;
  return true;
}

std::vector<Tensor> ElementwiseChain::vjp(const std::vector<Tensor>& x, const std::vector<Tensor>&,
                                          const std::vector<Tensor>& g,
                                          const std::vector<int>& argnums) const {
  // The composition, built again over x, differentiated step by step in reverse with each
  // step's own vjp. Partial derivatives: the inputs are independent here even where one
  // depends on another upstream (a residual add of a branch computed from the same input), so
  // the gradient must not flow past them; the outer backward carries it on from each input.
  std::vector<Tensor> slot = x;
  for (const Step& s : steps_) {
    std::vector<Tensor> args;
    for (int a : s.args) args.push_back(slot[static_cast<size_t>(a)]);
    slot.push_back(make_node1(s.prim, std::move(args)));
  }
  std::vector<Tensor> cot(slot.size());
  cot.back() = g[0];
  for (size_t k = steps_.size(); k-- > 0;) {
    const size_t at = x.size() + k;
    if (!cot[at].defined()) continue;
    const Step& s = steps_[k];
    std::vector<Tensor> args;
    std::vector<int> which;
    for (size_t i = 0; i < s.args.size(); ++i) {
      args.push_back(slot[static_cast<size_t>(s.args[i])]);
      if (is_floating(args.back().dtype())) which.push_back(static_cast<int>(i));
    }
    if (which.empty()) continue;
    const std::vector<Tensor> grads = s.prim->vjp(args, {slot[at]}, {cot[at]}, which);
    for (size_t j = 0; j < which.size(); ++j) {
      const Tensor& gj = grads[j];
      if (!gj.defined()) continue;
      Tensor& acc = cot[static_cast<size_t>(s.args[static_cast<size_t>(which[j])])];
      const Tensor& in = args[static_cast<size_t>(which[j])];
      const Tensor gc = gj.dtype() == in.dtype() ? gj : cast(gj, in.dtype());
      acc = acc.defined() ? acc + gc : gc;
    }
  }
  std::vector<Tensor> out;
  for (int a : argnums) {
    const Tensor& c = cot[static_cast<size_t>(a)];
    out.push_back(c.defined() ? c : zeros_like(x[static_cast<size_t>(a)]));
  }
  return out;
}

std::string ElementwiseChain::attrs() const {
  std::string r;
  for (const Step& s : steps_) r += (r.empty() ? "" : ",") + std::string(s.prim->name());
  return r;
}

std::vector<TensorMeta> WithEpilogue::infer(const std::vector<TensorMeta>& in) const {
  if (static_cast<int>(in.size()) < num_main_)
    fail("[fused_epilogue] internal: ", in.size(), " inputs for a producer of ", num_main_);
  const std::vector<TensorMeta> main_in(in.begin(), in.begin() + num_main_);
  TensorMeta produced = main_->infer(main_in).at(0);
  if (as_shape_) {
    if (numel(*as_shape_) != numel(produced.shape))
      fail("[fused_epilogue] internal: ", shape_str(produced.shape), " seen as ",
           shape_str(*as_shape_));
    produced.shape = *as_shape_;
  }
  return epilogue_->infer(chain_inputs(produced, in));
}

Cost WithEpilogue::cost(const std::vector<TensorMeta>& in,
                        const std::vector<TensorMeta>& out) const {
  // The producer's work and reads, the chain's work and other reads; one output written.
  const std::vector<TensorMeta> main_in(in.begin(), in.begin() + num_main_);
  const std::vector<TensorMeta> produced = main_->infer(main_in);
  Cost c = main_->cost(main_in, produced);
  TensorMeta seen = produced[0];
  if (as_shape_) seen.shape = *as_shape_;
  const Cost e = epilogue_->cost(chain_inputs(seen, in), out);
  c.flops += e.flops;
  c.bytes_read +=
      e.bytes_read - static_cast<double>(numel(produced[0].shape) * dtype_size(produced[0].dtype));
  c.bytes_written = e.bytes_written;
  return c;
}

bool WithEpilogue::has_kernel(DeviceKind k) const {
  return main_->has_kernel(k) && epilogue_->has_kernel(k);
}

std::vector<Tensor> WithEpilogue::vjp(const std::vector<Tensor>& x, const std::vector<Tensor>&,
                                      const std::vector<Tensor>& g,
                                      const std::vector<int>& argnums) const {
  // The composition, built again over x (lazily: only what the gradient reads runs), then the
  // chain's vjp and the producer's in turn: partial derivatives per input. (grad() over x would
  // give total ones, counting twice a branch from one input to another, as the residual add
  // x + x W has, and an input read both by the product and by the chain.)
  const std::vector<Tensor> main_in(x.begin(), x.begin() + num_main_);
  const Tensor raw = make_node1(main_, main_in);
  const Tensor produced = as_shape_ ? reshape(raw, *as_shape_) : raw;
  const std::vector<Tensor> chain_in = chain_inputs(produced, x);
  const Tensor y = make_node1(epilogue_, chain_in);
  std::vector<int> chain_args = {0}, main_args;
  for (int a : argnums) {
    if (a < num_main_)
      main_args.push_back(a);
    else
      chain_args.push_back(a - num_main_ + 1);
  }
  const std::vector<Tensor> cg = epilogue_->vjp(chain_in, {y}, g, chain_args);
  std::vector<Tensor> mg;
  if (!main_args.empty()) {
    Tensor gp = cg[0];
    if (as_shape_) gp = reshape(gp, raw.shape());
    mg = main_->vjp(main_in, {raw}, {gp}, main_args);
  }
  std::vector<Tensor> out;
  size_t next_main = 0, next_chain = 1;
  for (int a : argnums) out.push_back(a < num_main_ ? mg[next_main++] : cg[next_chain++]);
  return out;
}

std::string WithEpilogue::attrs() const {
  return std::string(main_->name()) + (as_shape_ ? "+reshape:" : ":") + epilogue_->attrs();
}

}  // namespace hetrain
