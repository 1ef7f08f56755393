// Dynamic loss scaling for fp16 training, with PyTorch's GradScaler semantics and defaults.
//
//   amp::GradScaler scaler;                 // scale 65536, x2 every 2000 clean steps, x0.5 on
//   inf/NaN
//   {
//     amp::Autocast scope(amp::Precision::fp16);
//     loss = cross_entropy(model.forward(x), y);
//   }
//   scaler.scale(loss).backward();          // gradients of loss * scale
//   scaler.unscale(opt);                    // gradients / scale, non-finite ones detected
//   optim::clip_grad_norm(params, 1.0);     // clipping sees true gradients
//   scaler.step(opt);                       // skipped (and counted) if a gradient was inf/NaN
//   scaler.update();                        // back off or grow the scale
//
// The autocast policy itself (which primitives run in bf16/f16) is in graph/autocast.h.
#pragma once

#include <cstdint>
#include <string>

#include "hetrain/graph/autocast.h"
#include "hetrain/training/optim.h"

namespace hetrain::amp {

struct GradScalerOptions {
  double init_scale = 65536.0;  // 2^16, as torch.amp.GradScaler
  double growth_factor = 2.0;   // after growth_interval consecutive clean steps
  double backoff_factor = 0.5;  // after a step with an inf/NaN gradient
  int64_t growth_interval = 2000;
  /// The floor: update() throws when the scale falls below it (PyTorch has none and would
  /// shrink the scale forever while gradients stay non-finite).
  double min_scale = 1.0;
};

/// The scaler's resumable state (kept in checkpoints).
struct GradScalerState {
  float scale = 65536.0f;
  int64_t growth_tracker = 0;  // clean steps since the last growth or back-off
  int64_t skipped_steps = 0;   // optimizer steps skipped for non-finite gradients, in total
};

class GradScaler {
 public:
  /// Checks the options (positive scale, growth > 1, backoff in (0, 1), interval >= 1).
  explicit GradScaler(GradScalerOptions options = {});

  /// loss * scale, in f32 (f64 for an f64 loss).
  Tensor scale(const Tensor& loss) const;
  /// Divides every gradient of opt's parameters by the scale (multiplies by the f32
  /// reciprocal, as PyTorch) and records whether any gradient holds an inf or NaN, and the
  /// first parameter whose does. At most once between two update() calls; gradients must be
  /// f32 or f64 (master weights), not f16/bf16.
  void unscale(optim::Optimizer& opt);
  /// opt.step() unless a gradient was non-finite, in which case the step is skipped and
  /// counted. Unscales first when unscale() was not called. Returns whether opt stepped.
  bool step(optim::Optimizer& opt);
  /// Ends the step: after a non-finite step the scale is multiplied by backoff_factor and the
  /// growth tracker reset; after growth_interval clean steps in a row it is multiplied by
  /// growth_factor (unless that overflows f32). Throws Error when the scale falls below
  /// min_scale, naming the first parameter whose gradient was non-finite.
  void update();

  float get_scale() const { return state_.scale; }
  int64_t growth_tracker() const { return state_.growth_tracker; }
  int64_t skipped_steps() const { return state_.skipped_steps; }
  /// Whether the current step's gradients held an inf/NaN (valid after unscale()).
  bool found_inf() const { return found_inf_; }
  /// The first parameter (in the optimizer's order) whose gradient was non-finite.
  const std::string& first_nonfinite() const { return first_nonfinite_; }
  const GradScalerOptions& options() const { return opt_; }

  GradScalerState state() const { return state_; }
  /// Restores a state; throws for a non-positive or non-finite scale or negative counters.
  void load_state(const GradScalerState& s);

 private:
  GradScalerOptions opt_;
  GradScalerState state_;
  bool unscaled_ = false;
  bool found_inf_ = false;
  std::string first_nonfinite_;
};

/// Exact text of a float (shortest round-trip form) and back, for checkpoint metadata.
std::string float_to_exact_string(float v);
/// Throws Error naming `what` when s is not a whole float.
float float_from_exact_string(const std::string& s, const std::string& what);

}  // namespace hetrain::amp
