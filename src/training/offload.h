// Offload (TrainConfig::offload): a policy over where each kind of model state lives, on top of
// the state device. Without offload everything lives on the state device; `optimizer` keeps the
// optimizer state on the host and runs the optimizer step there, reading the gradients across
// (the scheduler's copy tasks) and copying the updated parameters back; `optimizer+params`
// (ZeRO stage 3) keeps the parameter shards on the host too, while the buckets gathered for the
// nodes that read them go to the state device and are freed after use. The same homes serve the
// unsharded run (place_parameters) and ZeRO's flat buffers (state_homes).
// Internal to the training layer.
#pragma once

#include <optional>

#include "hetrain/distributed/sharded_optimizer.h"
#include "hetrain/memory/device.h"
#include "hetrain/training/nn.h"
#include "hetrain/training/trainer.h"

namespace hetrain::training {

/// Throws, saying why, for an offload the run cannot do: without an accelerator as state device
/// (a CPU-only run), optimizer+params below --zero 3, or an unknown value. train() calls it once.
void check_offload(const TrainConfig& cfg);

/// Whether cfg offloads the optimizer ("optimizer" or "optimizer+params"; a config
/// check_offload accepted). Cheap: the training step asks it twice a step.
bool offloads_optimizer(const TrainConfig& cfg);

/// Whether a sharded optimizer's updates stream (ShardedOptimizer::stream_next_step): under
/// offload, each bucket's update runs on the host as soon as backward has reduced the bucket,
/// unless something needs every gradient before any update (clipping's global norm, the grad
/// scaler's inf/NaN check: then the updates follow it, bucket by bucket). HETRAIN_OFFLOAD_STREAM
/// =off turns it off (a baseline for A/B timings); another value than on/off is an error.
bool streams_updates(const TrainConfig& cfg, bool grad_scaler);

/// Where the optimizer step runs: the host under offload, else the state device (none: the
/// scheduler places it).
std::optional<Device> optimizer_step_device(const TrainConfig& cfg);

/// The memory node of the sharded optimizer's and the gradient reducer's flat buffers: the state
/// device (the host without one). Their collectives run on a communicator for that memory
/// (distributed::make_device_communicator: the run's own for host memory, NCCL for a GPU).
Device flat_buffer_home(const TrainConfig& cfg);
/// Where the sharded optimizer's buffers live under cfg: flat_buffer_home, less what --offload
/// moves to the host.
distributed::StateHomes state_homes(const TrainConfig& cfg);

/// Unsharded runs under offload: copies the parameters that are not on the state device there
/// (after the host's update, and once before the first step), tagged as parameters; the host
/// copies go. (Under a sharded optimizer the parameters are views of its flat buffers, already
/// where state_homes puts them.)
void place_parameters(nn::Module& model, const TrainConfig& cfg);

}  // namespace hetrain::training
