// GradScaler: dynamic loss scaling with torch.amp.GradScaler's semantics.
#include "hetrain/training/amp.h"

#include <charconv>
#include <cmath>
#include <limits>

#include "hetrain/base/error.h"
#include "hetrain/memory/allocator.h"
#include "hetrain/runtime/eval.h"

namespace hetrain::amp {

GradScaler::GradScaler(GradScalerOptions o) : opt_(o) {
  if (!(o.init_scale > 0) || !std::isfinite(static_cast<float>(o.init_scale)))
    fail("[GradScaler] init_scale must be a positive finite f32 value, got ", o.init_scale);
  if (!(o.growth_factor > 1.0))
    fail("[GradScaler] growth_factor must be > 1, got ", o.growth_factor);
  if (!(o.backoff_factor > 0.0 && o.backoff_factor < 1.0))
    fail("[GradScaler] backoff_factor must be in (0, 1), got ", o.backoff_factor);
  if (o.growth_interval < 1)
    fail("[GradScaler] growth_interval must be >= 1, got ", o.growth_interval);
  if (!(o.min_scale >= 0) || !std::isfinite(o.min_scale))
    fail("[GradScaler] min_scale must be >= 0 and finite, got ", o.min_scale);
  state_.scale = static_cast<float>(o.init_scale);
}

Tensor GradScaler::scale(const Tensor& loss) const {
  if (!loss.defined()) fail("[GradScaler] scale(): the loss is undefined");
  if (!is_floating(loss.dtype()))
    fail("[GradScaler] scale(): the loss must be floating point, got ", dtype_name(loss.dtype()));
  // An f32 scale promotes an f16/bf16 loss to f32 (PyTorch multiplies by an f32 tensor).
  return loss * scalar(state_.scale, loss.dtype() == Dtype::f64 ? Dtype::f64 : Dtype::f32);
}

void GradScaler::unscale(optim::Optimizer& opt) {
  if (unscaled_) fail("[GradScaler] unscale() was already called since the last update()");
  NoGradScope ng;
  // PyTorch: inv_scale = scale.double().reciprocal().float(); grads *= inv_scale in f32.
  const double inv =
      static_cast<double>(static_cast<float>(1.0 / static_cast<double>(state_.scale)));
  struct Item {
    Tensor* param;
    const std::string* name;
    Tensor unscaled, bad;  // bad: sum(g * 0), NaN exactly when g holds an inf or NaN
  };
  std::vector<Item> items;
  std::vector<Tensor> targets;
  for (const auto& [name, p] : opt.params()) {
    Tensor g = p->grad();
    if (!g.defined()) continue;
    if (g.dtype() != Dtype::f32 && g.dtype() != Dtype::f64)
      fail("[GradScaler] parameter '", name, "' has a ", dtype_name(g.dtype()),
           " gradient; keep parameters in f32 (master weights) and run low precision through "
           "autocast");
    Tensor u = g * scalar(inv, g.dtype());
    u.node()->outs[0].tag = MemoryTag::gradients;
    Tensor bad = sum(g * scalar(0.0, g.dtype()));
    targets.push_back(u);
    targets.push_back(bad);
    items.push_back({p, &name, u, bad});
  }
  eval(targets);
  found_inf_ = false;
  first_nonfinite_.clear();
  for (Item& it : items) {
    if (!found_inf_ && std::isnan(it.bad.item<double>())) {
      found_inf_ = true;
      first_nonfinite_ = *it.name;
    }
    it.param->set_grad(it.unscaled.detach());
  }
  const bool local = found_inf_;
  found_inf_ = opt.any_nonfinite(local);
  if (found_inf_ && !local) first_nonfinite_ = "(a gradient shard of another rank)";
  unscaled_ = true;
}

bool GradScaler::step(optim::Optimizer& opt) {
  if (!unscaled_) unscale(opt);
  if (found_inf_) {
    ++state_.skipped_steps;
    return false;
  }
  opt.step();
  return true;
}

void GradScaler::update() {
  if (!unscaled_)
    fail("[GradScaler] update() before unscale() or step(): no gradients were checked");
  // torch._amp_update_scale_: the products are formed in double and stored as f32.
  if (found_inf_) {
    state_.scale = static_cast<float>(static_cast<double>(state_.scale) * opt_.backoff_factor);
    state_.growth_tracker = 0;
  } else if (state_.growth_tracker + 1 == opt_.growth_interval) {
    const float grown = static_cast<float>(static_cast<double>(state_.scale) * opt_.growth_factor);
    if (std::isfinite(grown)) state_.scale = grown;
    state_.growth_tracker = 0;
  } else {
    ++state_.growth_tracker;
  }
  unscaled_ = false;
  if (static_cast<double>(state_.scale) < opt_.min_scale)
    fail("[GradScaler] the loss scale fell to ", state_.scale, ", below its floor of ",
         opt_.min_scale,
         ": gradients stay non-finite however far the loss is scaled down "
         "(first non-finite gradient: parameter '",
         first_nonfinite_, "'); lower the learning rate, or train in bf16 or fp32");
}

void GradScaler::load_state(const GradScalerState& s) {
  if (!(s.scale > 0) || !std::isfinite(s.scale))
    fail("[GradScaler] a loaded scale must be positive and finite, got ", s.scale);
  if (s.growth_tracker < 0 || s.skipped_steps < 0)
    fail("[GradScaler] loaded counters must be >= 0, got growth_tracker ", s.growth_tracker,
         " and skipped_steps ", s.skipped_steps);
  state_ = s;
  unscaled_ = found_inf_ = false;
  first_nonfinite_.clear();
}

std::string float_to_exact_string(float v) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  HT_ASSERT(ec == std::errc());
  return std::string(buf, end);
}

float float_from_exact_string(const std::string& s, const std::string& what) {
  float v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size())
    fail("[GradScaler] ", what, ": '", s, "' is not a number");
  return v;
}

}  // namespace hetrain::amp
