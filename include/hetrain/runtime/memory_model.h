// The memory model: a prediction of the allocator's counters over one eval(), from the graph
// alone, before anything runs. It replays the executor's order on one worker (ready nodes
// last-in first-out, consumers in graph order), allocates each node's outputs (a view none), and
// frees a buffer when the executor would: once its last consumer has run and nothing outside
// the graph still holds its node (reference counts read from the graph as it stands).
//
//   auto targets = gradient_graph(loss, policy);          // graph/autodiff.h: nothing runs
//   runtime::MemoryPrediction p = runtime::predict_eval_memory(targets);
//   p.peak[MemoryTag::activations]  // what eval(targets, true) will reach, starting from now
//
// Kernels' scratch (tag workspace: a convolution's unfolded input, attention's blocks) is what
// each node's own kernel takes when run once on inputs of its shapes (kernel_scratch.cpp), at
// the node's place in the order.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "hetrain/graph/tensor.h"
#include "hetrain/memory/allocator.h"

namespace hetrain::runtime {

struct MemoryPrediction {
  std::array<int64_t, kNumMemoryTags> start{};  // live when the eval begins (the allocator's)
  std::array<int64_t, kNumMemoryTags> peak{};   // highest per tag during the eval
  std::array<int64_t, kNumMemoryTags> end{};    // live when it returns
  int64_t peak_total = 0;
  int64_t start_total = 0;
  /// Live per tag once the caller, after the eval, replaces the targets marked in each of the
  /// `detach` masks by fresh leaves of their values (Tensor::detach): a target's node then
  /// goes, and with it its other outputs (a layer norm's input gradient, held by the node that
  /// made a weight's gradient).
  std::vector<std::array<int64_t, kNumMemoryTags>> detached;
  int64_t nodes = 0;  // nodes the eval runs
  int64_t at(MemoryTag t) const { return peak[static_cast<size_t>(t)]; }
};

/// Predicts eval(targets, release_graph) on the host allocator from its current counters. The
/// caller must hold no more references to the graph's nodes than the eval's caller will.
/// `detach`: masks over targets, one `detached` entry each.
MemoryPrediction predict_eval_memory(const std::vector<Tensor>& targets, bool release_graph = true,
                                     const std::vector<std::vector<char>>& detach = {});

}  // namespace hetrain::runtime
