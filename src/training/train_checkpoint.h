// Training checkpoints as train() writes and reads them (internal to the training layer): the
// weights and the training state (optimizer state, data position, RNG, loss scale, settings),
// plain (rank 0 writes everything) or sharded under ZeRO (every rank its shard).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include "hetrain/distributed/communicator.h"
#include "hetrain/distributed/sharded_optimizer.h"
#include "hetrain/training/amp.h"
#include "hetrain/training/nn.h"
#include "hetrain/training/optim.h"
#include "hetrain/training/trainer.h"

namespace hetrain::training {

struct ResumeState {
  int64_t step = 0, data_epoch = 0, data_position = 0;
  int64_t micro_batches = 1;  // ranks x grad-accum: the gradient's summation
  uint64_t dropout_seed = 0, dropout_offset = 0;
  const amp::GradScaler* scaler = nullptr;  // saved when training with one
  int64_t data_examples = 0;                // training examples: the data order depends on it
};

/// A plain checkpoint, written by rank 0 (leader). opt_state: opt.state_dict(), which every
/// rank computes (a sharded optimizer gathers it).
void save_checkpoint(const std::string& dir, nn::Module& model, optim::Optimizer& opt,
                     const std::map<std::string, Tensor>& opt_state, const TrainConfig& cfg,
                     bool leader, const ResumeState& st);

/// A sharded checkpoint (checkpoint.h): every rank writes its shard of the parameters and the
/// optimizer state (rank 0 also the model's buffers, which every rank holds whole), then rank 0
/// commits the index once every shard is written. Collective: every rank calls it.
/// on_point(step, "shard"|"commit"): the fault-injection hook (StepHooks::checkpoint).
void save_sharded(const std::string& dir, nn::Module& model,
                  const distributed::ShardedOptimizer& opt, const TrainConfig& cfg,
                  distributed::Communicator& comm, const ResumeState& st,
                  const std::function<void(int64_t, const std::string&)>& on_point);

/// Loads a checkpoint (plain or sharded, any rank count) into model and opt; returns where the
/// run stood. Refuses a checkpoint of another model, optimizer, precision or data order.
ResumeState load_checkpoint(const std::string& dir, nn::Module& model, optim::Optimizer& opt,
                            const TrainConfig& cfg, amp::GradScaler* scaler, int64_t data_examples);

}  // namespace hetrain::training
