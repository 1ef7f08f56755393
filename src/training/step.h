// The training step shared by train(), the synthetic steps of simulate and the memory checks
// (memory_plan.cpp): internal to the training layer.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "hetrain/distributed/communicator.h"
#include "hetrain/distributed/grad_reducer.h"
#include "hetrain/graph/recompute.h"
#include "hetrain/training/amp.h"
#include "hetrain/training/data.h"
#include "hetrain/training/memory_plan.h"
#include "hetrain/training/nn.h"
#include "hetrain/training/optim.h"
#include "hetrain/training/trainer.h"

namespace hetrain::training {

/// The optimizer train() uses for cfg.
std::unique_ptr<optim::Optimizer> make_optimizer(const TrainConfig& cfg, nn::Module& model);
/// The same over given parameters (a sharded optimizer's shards).
std::unique_ptr<optim::Optimizer> make_optimizer(const TrainConfig& cfg,
                                                 const optim::NamedParams& params);
Tensor loss_of(const Tensor& logits, const Tensor& targets, bool language);
/// A batch of the preset's shapes (zeros): the work of a real one, no dataset read.
data::Batch synthetic_batch(const TrainConfig& cfg);

/// What the step does besides its graph, for the memory model.
StepShape step_shape(const TrainConfig& cfg, const optim::Optimizer& opt, nn::Module& model);

/// The activation-checkpointing policy of a run's steps: auto's plan is made at the first
/// backward, from that step's graph, and kept (later steps have the same structure).
struct RecomputeState {
  RecomputePolicy policy;
  bool planned = false;
  bool announce = true;  // print auto's choice on stderr
  RecomputePlan plan;    // auto: the choice
  /// Called with the root of each backward and its policy before it runs (memory checks).
  std::function<void(const Tensor& root, const RecomputePolicy& policy)> before_backward;
};
RecomputeState recompute_state(const TrainConfig& cfg, bool announce);

struct StepOutcome {
  double loss = 0;  // the mean over every rank's micro-batches
  distributed::ReduceTimes times;
  int64_t streamed_buckets = 0;  // offload: buckets updated during backward (ShardedOptimizer)
  double update_s = 0;  // the update after backward and reduction (what streaming leaves of it)
};

/// One step: for each micro-batch forward (under the configured autocast), backward (of the
/// scaled loss with a grad scaler, under the recompute policy), running statistics and (with a
/// reducer) accumulation into the gradient buckets; then the reduction over the ranks, unscale,
/// clipping, update (skipped and counted by the scaler when a gradient is inf/NaN), scale
/// update. Without a reducer there is one micro-batch and one rank. `step` names the step in
/// errors.
StepOutcome train_step(nn::Module& model, optim::Optimizer& opt,
                       const std::vector<data::Batch>& micro, const TrainConfig& cfg, bool language,
                       amp::GradScaler* scaler, int64_t step, distributed::GradReducer* reducer,
                       distributed::Communicator& comm, RecomputeState& recompute);

}  // namespace hetrain::training
