// The profiler: what the runtime ran (per node: primitive, device, worker thread, start, end,
// FLOPs and bytes from Primitive::cost, dtype and shapes), grouped into steps, and the host
// allocator's memory timeline by tag. Off until start(); the hooks cost a clock read and a
// push_back per node and per allocation.
//
//   hetrain::insight::Profiler prof;
//   prof.start();
//   for (int s = 0; s < 5; ++s) {
//     prof.begin_step(s);
//     ... forward, backward, optimizer step ...
//     prof.end_step(loss.item<double>());
//   }
//   prof.stop();
//   for (const auto& p : prof.summary()) std::printf("%s %.3f ms\n", p.name.c_str(), p.total_s *
//   1e3); write_json_atomic("trace.json", prof.chrome_trace());
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <limits>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "hetrain/base/dtype.h"
#include "hetrain/memory/allocator.h"
#include "hetrain/memory/device.h"
#include "hetrain/runtime/eval.h"

namespace hetrain::insight {

/// One executed node. Times are steady-clock nanoseconds.
struct NodeEvent {
  std::string primitive;  // Primitive::name()
  Device device;
  int worker = 0;     // 0: the thread that called start(); others numbered as first seen
  int64_t step = -1;  // index into Profiler::steps(); -1 outside any step
  int64_t start_ns = 0, end_ns = 0;
  double flops = 0, bytes_read = 0, bytes_written = 0;
  Dtype dtype = Dtype::f32;  // of the first output
  // The dtype the kernel computed in: its first floating-point input's (a matmul's or
  // convolution's operands: a bf16 GEMM under autocast is bf16 even where its fused epilogue
  // casts the result to f32), the first output's for nodes without one (integer inputs only).
  Dtype compute_dtype = Dtype::f32;
  std::string shapes;  // "f32[4,8] f32[8,16] -> f32[4,16]"
  double seconds() const { return 1e-9 * static_cast<double>(end_ns - start_ns); }
};

/// One training (or user-defined) step.
struct StepSpan {
  int64_t index = 0;  // the caller's step number
  int64_t start_ns = 0, end_ns = 0;
  double loss = 0;  // NaN when none was given
  double seconds() const { return 1e-9 * static_cast<double>(end_ns - start_ns); }
};

/// The host allocator's counters right after one change (allocation, free or retag).
struct MemorySample {
  int64_t t_ns = 0;
  std::array<int64_t, kNumMemoryTags> bytes{};  // current bytes per MemoryTag
  int64_t total = 0;
};

/// Totals per primitive and compute dtype over the recorded nodes (what the planner's
/// calibration reads): a bf16 matmul and an f32 one ran on different units, so they are two.
struct PrimitiveSummary {
  std::string name;
  int64_t calls = 0;
  double total_s = 0;  // sum of node durations
  double flops = 0, bytes_read = 0, bytes_written = 0;
  Dtype dtype = Dtype::f32;  // the nodes' compute dtype (NodeEvent::compute_dtype)
  /// The name, followed by the dtype where it is not f32: "fused_epilogue bf16".
  std::string label() const;
  double bytes() const { return bytes_read + bytes_written; }
  double gflops_per_s() const { return total_s > 0 ? flops / total_s * 1e-9 : 0; }
  double gbytes_per_s() const { return total_s > 0 ? bytes() / total_s * 1e-9 : 0; }
  double intensity() const { return bytes() > 0 ? flops / bytes() : 0; }  // FLOP/byte
};

class Profiler final : public NodeObserver, public MemoryObserver {
 public:
  Profiler() = default;
  ~Profiler() override;
  Profiler(const Profiler&) = delete;
  Profiler& operator=(const Profiler&) = delete;

  /// Installs the runtime and allocator hooks. The calling thread becomes worker 0. Only
  /// one profiler may be started at a time (throws otherwise).
  void start();
  /// Removes the hooks; the recorded events stay.
  void stop();
  bool running() const { return running_; }
  /// Drops everything recorded so far.
  void clear();

  /// Marks a step; nodes run between begin_step and end_step belong to it.
  void begin_step(int64_t index);
  void end_step(double loss = std::numeric_limits<double>::quiet_NaN());

  const std::vector<NodeEvent>& nodes() const { return nodes_; }
  const std::vector<StepSpan>& steps() const { return steps_; }
  const std::vector<MemorySample>& memory() const { return memory_; }
  /// Threads seen (worker indices 0 .. workers()-1).
  int workers() const { return next_worker_.load(); }

  /// Totals per (primitive, compute dtype) over the nodes inside steps (all nodes when no
  /// step was marked), longest total time first.
  std::vector<PrimitiveSummary> summary() const;
  /// Total wall time of the recorded steps.
  double step_seconds() const;

  /// Chrome trace JSON (the "JSON object format" of the Trace Event Format): one complete
  /// ("X") event per node with FLOPs, bytes, dtype and shapes in args, on the track of its
  /// worker; the steps as enclosing "X" events on every worker's track; the memory timeline
  /// as a counter ("C") track per tag. Opens in Perfetto and chrome://tracing.
  nlohmann::json chrome_trace() const;

  // Hooks (called by the runtime and the allocator).
  void on_node(const Node& node, int64_t start_ns, int64_t end_ns) override;
  void on_memory(MemoryTag tag, int64_t delta, const MemoryStats& stats) override;

 private:
  int worker_index();

  std::mutex mu_;
  bool running_ = false;
  uint64_t session_ = 0;  // tells this start() apart from an earlier one in thread caches
  std::atomic<int> next_worker_{0};
  int64_t current_step_ = -1;  // index into steps_ while a step is open
  std::vector<NodeEvent> nodes_;
  std::vector<StepSpan> steps_;
  std::vector<MemorySample> memory_;
};

/// Totals per (primitive, compute dtype) of the given nodes, longest total time first.
std::vector<PrimitiveSummary> summarize(const std::vector<NodeEvent>& nodes);

/// "f32[4,8]": the form shapes take in events and tables.
std::string meta_str(const TensorMeta& m);

}  // namespace hetrain::insight
