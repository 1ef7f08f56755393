// Optimizers with PyTorch's update rules, gradient clipping and learning-rate schedules.
// A step builds the update of every parameter as one graph and evaluates it at once.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "hetrain/graph/ops.h"

namespace hetrain::optim {

using NamedParams = std::vector<std::pair<std::string, Tensor*>>;

class Optimizer {
 public:
  explicit Optimizer(NamedParams params, double lr) : params_(std::move(params)), lr_(lr) {}
  virtual ~Optimizer() = default;
  /// Updates every parameter that has a gradient: update() over all of them, then count_step().
  virtual void step();
  /// Updates the parameters at these indices into params() that have a gradient, as step()
  /// would, without counting a step: a sharded optimizer updates its buckets one by one, each
  /// as soon as its gradients are reduced, and then counts the step once. Elementwise updates
  /// give the same bits whatever the split. Throws for an optimizer that cannot.
  virtual void update(const std::vector<size_t>& which);
  /// Ends a step whose parameters update() updated.
  void count_step() { ++steps_; }
  virtual const char* name() const = 0;
  /// Clears the gradients (a sharded optimizer points them at its buffers again).
  virtual void zero_grad();
  /// Scales the gradients so their global L2 norm is at most max_norm; returns the norm
  /// before (clip_grad_norm below over params(); a sharded optimizer sums its shards).
  virtual double clip_grad_norm(double max_norm);
  /// Whether any gradient holds an inf or NaN, given this process's answer (the grad scaler's
  /// overflow check). A sharded optimizer, whose ranks see different gradient shards, combines
  /// every rank's answer, so that all skip the same steps.
  virtual bool any_nonfinite(bool local) { return local; }
  double lr() const { return lr_; }
  void set_lr(double lr) { lr_ = lr; }
  int64_t steps() const { return steps_; }
  /// The parameters this optimizer updates, with their names.
  const NamedParams& params() const { return params_; }
  /// Per-parameter state ("exp_avg.<param>", ...) and the step count, for checkpoints.
  /// (A sharded optimizer gathers its shards: every rank must call it.)
  virtual std::map<std::string, Tensor> state_dict() const;
  virtual void load_state_dict(const std::map<std::string, Tensor>& state, int64_t steps);

 protected:
  /// state_[slot][param index]; an undefined tensor until first used.
  Tensor& slot(const std::string& name, size_t i);
  NamedParams params_;
  double lr_;
  int64_t steps_ = 0;
  std::map<std::string, std::vector<Tensor>> state_;
};

struct SgdOptions {
  double lr = 0.01, momentum = 0, dampening = 0, weight_decay = 0;
  bool nesterov = false;
};
class SGD final : public Optimizer {
 public:
  SGD(NamedParams params, SgdOptions o);
  void update(const std::vector<size_t>& which) override;
  const char* name() const override { return "sgd"; }

 private:
  SgdOptions o_;
};

struct AdamWOptions {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.01;
};
class AdamW final : public Optimizer {
 public:
  AdamW(NamedParams params, AdamWOptions o);
  void update(const std::vector<size_t>& which) override;
  const char* name() const override { return "adamw"; }

 private:
  AdamWOptions o_;
};

/// Scales all gradients so their global L2 norm is at most max_norm (torch's
/// clip_grad_norm_: factor max_norm / (norm + 1e-6), capped at 1). Returns the norm before.
double clip_grad_norm(const std::vector<Tensor*>& params, double max_norm);

/// Learning rate at a step (0-based) for constant, step and cosine-with-warm-up schedules.
struct LrSchedule {
  std::string kind = "constant";  // constant | step | cosine
  double base_lr = 1e-3;
  int64_t warmup_steps = 0;  // linear warm-up from 0 (all kinds)
  int64_t total_steps = 0;   // cosine: decay to min_lr at total_steps
  double min_lr = 0;         // cosine floor
  int64_t step_size = 1000;  // step: multiply by gamma every step_size steps
  double gamma = 0.1;
  double at(int64_t step) const;
};

}  // namespace hetrain::optim
