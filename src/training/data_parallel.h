// The trainer's data-parallel pieces (internal to src/training): the start-of-run broadcast,
// agreement checks and global logged numbers over a Communicator.
#pragma once

#include <array>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <vector>

#include "hetrain/distributed/communicator.h"
#include "hetrain/memory/allocator.h"
#include "hetrain/training/nn.h"

namespace hetrain::training {

/// Rank 0's parameters and buffers on every rank (each tensor replaced by a fresh leaf that
/// keeps requires_grad).
void broadcast_model(nn::Module& model, distributed::Communicator& comm);

/// Throws, naming `what` and every rank's value, unless all ranks hold the same v.
void check_agree(distributed::Communicator& comm, int64_t v, const char* what);

/// Whether every rank holds the same parameter bytes (a 64-bit FNV-1a hash of each rank's
/// parameters, gathered and compared).
bool parameters_identical(nn::Module& model, distributed::Communicator& comm);

/// The mean of all ranks' micro-batch losses, summed in global micro-batch order (rank-major:
/// rank r's micro-batch k is number r * K + k) exactly as one process summing them in order.
double global_mean_loss(distributed::Communicator& comm, const std::vector<double>& local);

/// Every rank's host memory by tag, for the log (all ranks call it): per rank its peak bytes
/// by tag over the run and, with at_update (the sharded optimizer's model states), the bytes
/// by tag live when the optimizer updated (the host's and the state device's together); with
/// at_update_device also the state device's part of them ("at_update_device_bytes").
nlohmann::json rank_memory(distributed::Communicator& comm, const MemoryStats& stats,
                           const std::array<int64_t, kNumMemoryTags>* at_update,
                           const std::array<int64_t, kNumMemoryTags>* at_update_device = nullptr);

}  // namespace hetrain::training
