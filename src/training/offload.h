// Optimizer offload (TrainConfig::offload): a policy over where each kind of model state lives,
// on top of the state device. Parameters and gradients stay on the state device (an
// accelerator); the optimizer state lives on the host and the optimizer step runs there, reading
// the gradients across (the scheduler's copy tasks) and copying the updated parameters back.
// Internal to the training layer.
#pragma once

#include <optional>

#include "hetrain/memory/device.h"
#include "hetrain/training/nn.h"
#include "hetrain/training/trainer.h"

namespace hetrain::training {

/// Throws, saying why, for an offload the run cannot do: without an accelerator as state device
/// (a CPU-only run), under ZeRO, optimizer+params, or an unknown value. train() calls it once.
void check_offload(const TrainConfig& cfg);

/// Whether cfg offloads the optimizer ("optimizer"; a config check_offload accepted). Cheap:
/// the training step asks it twice a step.
bool offloads_optimizer(const TrainConfig& cfg);

/// Where the optimizer step runs: the host under offload, else the state device (none: the
/// scheduler places it).
std::optional<Device> optimizer_step_device(const TrainConfig& cfg);

/// Under offload, copies the parameters that are not on the state device there (after the
/// host's update, and once before the first step), tagged as parameters; the host copies go.
void place_parameters(nn::Module& model, const TrainConfig& cfg);

}  // namespace hetrain::training
