#include "hetrain/training/optim.h"

#include <cmath>
#include <numeric>
#include <unordered_map>

#include "hetrain/base/error.h"
#include "hetrain/graph/primitive.h"
#include "hetrain/runtime/eval.h"

namespace hetrain::optim {

namespace {
struct Update {
  Tensor* dst;
  Tensor value;
  MemoryTag tag;
};
/// Evaluates new values and installs them as fresh leaves (parameters keep requires_grad).
/// Only the final values carry the parameter/optimizer-state tag; temporaries stay
/// activations.
void commit(std::vector<Update>& updates) {
  std::vector<Tensor> targets;
  for (auto& u : updates) {
    Node* n = u.value.node();
    if (!n->evaluated() && n->prim && !n->prim->is_view()) n->outs[u.value.index()].tag = u.tag;
    targets.push_back(u.value);
  }
  eval(targets);
  for (auto& [dst, v, tag] : updates) {
    bool rg = dst->defined() && dst->is_leaf() && dst->requires_grad();
    Tensor leaf = v.detach();
    if (rg) leaf.requires_grad_(true);
    *dst = leaf;
  }
}
}  // namespace

void Optimizer::step() {
  std::vector<size_t> all(params_.size());
  std::iota(all.begin(), all.end(), size_t{0});
  update(all);
  count_step();
}

void Optimizer::update(const std::vector<size_t>&) {
  fail("[optimizer] ", name(), " cannot update a part of its parameters");
}

void Optimizer::zero_grad() {
  for (auto& [n, p] : params_) p->zero_grad();
}

double Optimizer::clip_grad_norm(double max_norm) {
  std::vector<Tensor*> ps;
  for (auto& [n, p] : params_) ps.push_back(p);
  return optim::clip_grad_norm(ps, max_norm);
}

Tensor& Optimizer::slot(const std::string& name, size_t i) {
  auto& v = state_[name];
  if (v.size() < params_.size()) v.resize(params_.size());
  return v[i];
}

std::map<std::string, Tensor> Optimizer::state_dict() const {
  std::map<std::string, Tensor> out;
  for (const auto& [slot, vec] : state_)
    for (size_t i = 0; i < vec.size(); ++i)
      if (vec[i].defined()) out[slot + "." + params_[i].first] = vec[i];
  return out;
}

void Optimizer::load_state_dict(const std::map<std::string, Tensor>& state, int64_t steps) {
  // Each entry finds its parameter by name in one lookup (a scan per entry was quadratic in the
  // number of parameters).
  std::unordered_map<std::string, size_t> index;
  for (size_t i = 0; i < params_.size(); ++i) index.emplace(params_[i].first, i);
  std::map<std::string, std::vector<Tensor>> fresh;
  for (const auto& [key, t] : state) {
    auto dot = key.find('.');
    if (dot == std::string::npos) fail("[optimizer] bad state entry '", key, "'");
    std::string slot = key.substr(0, dot), pname = key.substr(dot + 1);
    const auto found = index.find(pname);
    if (found == index.end())
      fail("[optimizer] state entry '", key, "' names no parameter of this model");
    const size_t i = found->second;
    if (t.shape() != params_[i].second->shape())
      fail("[optimizer] state entry '", key, "' has shape ", shape_str(t.shape()),
           " but the parameter has ", shape_str(params_[i].second->shape()));
    if (t.dtype() != params_[i].second->dtype())
      fail("[optimizer] state entry '", key, "' has dtype ", dtype_name(t.dtype()),
           " but the parameter has ", dtype_name(params_[i].second->dtype()));
    auto& v = fresh[slot];
    v.resize(params_.size());
    v[i] = t;
  }
  state_ = std::move(fresh);
  steps_ = steps;
}

SGD::SGD(NamedParams params, SgdOptions o) : Optimizer(std::move(params), o.lr), o_(o) {
  if (o.lr < 0) fail("[sgd] learning rate must be >= 0, got ", o.lr);
  if (o.nesterov && (o.momentum <= 0 || o.dampening != 0))
    fail("[sgd] Nesterov momentum requires momentum > 0 and zero dampening");
}

void SGD::update(const std::vector<size_t>& which) {
  NoGradScope ng;
  std::vector<Update> updates;
  for (size_t i : which) {
    Tensor& p = *params_[i].second;
    Tensor g = p.grad();
    if (!g.defined()) continue;
    if (o_.weight_decay != 0) g = g + p * o_.weight_decay;
    if (o_.momentum != 0) {
      Tensor& buf = slot("momentum_buffer", i);
      buf = buf.defined() ? buf * o_.momentum + g * (1.0 - o_.dampening) : copy(g);
      g = o_.nesterov ? g + buf * o_.momentum : buf;
      updates.push_back({&buf, buf, MemoryTag::optimizer_state});
    }
    updates.push_back({&p, p - g * lr_, MemoryTag::parameters});
  }
  commit(updates);
}

AdamW::AdamW(NamedParams params, AdamWOptions o) : Optimizer(std::move(params), o.lr), o_(o) {
  if (o.lr < 0) fail("[adamw] learning rate must be >= 0, got ", o.lr);
  if (o.beta1 < 0 || o.beta1 >= 1 || o.beta2 < 0 || o.beta2 >= 1)
    fail("[adamw] betas must be in [0, 1), got (", o.beta1, ", ", o.beta2, ")");
  if (o.eps < 0) fail("[adamw] eps must be >= 0");
}

void AdamW::update(const std::vector<size_t>& which) {
  NoGradScope ng;
  const int64_t t = steps_ + 1;
  const double bc1 = 1.0 - std::pow(o_.beta1, static_cast<double>(t));
  const double bc2 = 1.0 - std::pow(o_.beta2, static_cast<double>(t));
  std::vector<Update> updates;
  for (size_t i : which) {
    Tensor& p = *params_[i].second;
    Tensor g = p.grad();
    if (!g.defined()) continue;
    Tensor& m = slot("exp_avg", i);
    Tensor& v = slot("exp_avg_sq", i);
    if (!m.defined()) m = zeros_like(p);
    if (!v.defined()) v = zeros_like(p);
    // torch.optim.AdamW (decoupled decay, then the Adam update), fused: one pass per tensor.
    AdamWStepArgs a{lr_, o_.beta1, o_.beta2, o_.eps, o_.weight_decay, bc1, bc2};
    std::vector<Tensor> r =
        adamw_update(p, g.dtype() == p.dtype() ? g : cast(g, p.dtype()), m, v, a);
    updates.push_back({&p, r[0], MemoryTag::parameters});
    updates.push_back({&m, r[1], MemoryTag::optimizer_state});
    updates.push_back({&v, r[2], MemoryTag::optimizer_state});
  }
  commit(updates);
}

double clip_grad_norm(const std::vector<Tensor*>& params, double max_norm) {
  NoGradScope ng;
  Tensor total;
  for (Tensor* p : params) {
    Tensor g = p->grad();
    if (!g.defined()) continue;
    Tensor s = sum(square(g.dtype() == Dtype::f64 ? g : cast(g, Dtype::f32)));
    total = total.defined() ? total + s : s;
  }
  if (!total.defined()) return 0.0;
  double norm = std::sqrt(total.item<double>());
  double coef = max_norm / (norm + 1e-6);
  if (coef < 1.0) {
    std::vector<Tensor> targets;
    for (Tensor* p : params) {
      Tensor g = p->grad();
      if (!g.defined()) continue;
      targets.push_back(g * coef);
    }
    for (auto& t : targets) t.node()->outs[0].tag = MemoryTag::gradients;
    eval(targets);
    size_t k = 0;
    for (Tensor* p : params)
      if (p->grad().defined()) p->set_grad(targets[k++].detach());
  }
  return norm;
}

double LrSchedule::at(int64_t step) const {
  if (warmup_steps > 0 && step < warmup_steps)
    return base_lr * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
  if (kind == "constant") return base_lr;
  if (kind == "step") {
    int64_t k = (step - warmup_steps) / std::max<int64_t>(step_size, 1);
    return base_lr * std::pow(gamma, static_cast<double>(k));
  }
  if (kind == "cosine") {
    int64_t span = std::max<int64_t>(total_steps - warmup_steps, 1);
    double prog =
        std::min(1.0, static_cast<double>(step - warmup_steps) / static_cast<double>(span));
    return min_lr + 0.5 * (base_lr - min_lr) * (1.0 + std::cos(M_PI * prog));
  }
  fail("[lr schedule] unknown kind '", kind, "'; expected constant, step or cosine");
}

}  // namespace hetrain::optim
