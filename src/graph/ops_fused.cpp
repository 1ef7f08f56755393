// Fused primitives' shapes, costs and vjps: those of the compositions they replace.
#include "graph/prims/fused.h"
#include "hetrain/graph/autodiff.h"

namespace hetrain {

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
  // The composition, built again over x, differentiated.
  std::vector<Tensor> slot = x;
  for (const Step& s : steps_) {
    std::vector<Tensor> args;
    for (int a : s.args) args.push_back(slot[static_cast<size_t>(a)]);
    slot.push_back(make_node1(s.prim, std::move(args)));
  }
  std::vector<Tensor> wrt;
  for (int a : argnums) wrt.push_back(x[static_cast<size_t>(a)]);
  return grad({slot.back()}, wrt, {g[0]});
}

std::string ElementwiseChain::attrs() const {
  std::string r;
  for (const Step& s : steps_) r += (r.empty() ? "" : ",") + std::string(s.prim->name());
  return r;
}

}  // namespace hetrain
