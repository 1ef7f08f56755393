#include <sstream>

#include "graph/prims/optim.h"
#include "hetrain/base/error.h"
#include "hetrain/graph/ops.h"

namespace hetrain {

std::vector<TensorMeta> AdamWUpdate::infer(const std::vector<TensorMeta>& in) const {
  if (in.size() != 4) fail("[adamw_update] expects p, g, m, v; got ", in.size(), " inputs");
  static const char* names[4] = {"param", "grad", "exp_avg", "exp_avg_sq"};
  if (!is_floating(in[0].dtype))
    fail("[adamw_update] param must be floating point, got ", dtype_name(in[0].dtype));
  for (int i = 1; i < 4; ++i)
    if (in[static_cast<size_t>(i)].shape != in[0].shape ||
        in[static_cast<size_t>(i)].dtype != in[0].dtype)
      fail("[adamw_update] ", names[i], " is ", dtype_name(in[static_cast<size_t>(i)].dtype), " ",
           shape_str(in[static_cast<size_t>(i)].shape), ", param is ", dtype_name(in[0].dtype), " ",
           shape_str(in[0].shape), ": they must match");
  return {in[0], in[0], in[0]};
}

Cost AdamWUpdate::cost(const std::vector<TensorMeta>& in, const std::vector<TensorMeta>&) const {
  const double n = static_cast<double>(numel(in[0].shape));
  const double e = static_cast<double>(dtype_size(in[0].dtype));
  return {12 * n, 4 * n * e, 3 * n * e};
}

std::string AdamWUpdate::attrs() const {
  std::ostringstream os;
  os << "lr=" << a_.lr << " betas=(" << a_.beta1 << ", " << a_.beta2 << ") eps=" << a_.eps
     << " weight_decay=" << a_.weight_decay;
  return os.str();
}

std::vector<Tensor> adamw_update(const Tensor& p, const Tensor& g, const Tensor& m, const Tensor& v,
                                 const AdamWStepArgs& args) {
  if (!(args.bias_correction1 > 0) || !(args.bias_correction2 > 0))
    fail("[adamw_update] bias corrections must be positive, got ", args.bias_correction1, " and ",
         args.bias_correction2);
  return make_node(std::make_shared<AdamWUpdate>(args), {p, g, m, v});
}

}  // namespace hetrain
