// The heterogeneous scheduler: the devices eval() may run nodes on, the placement policies
// that choose a device per node, and the list scheduler that predicts when each task runs.
//
//   using namespace hetrain;
//   runtime::configure({.devices = runtime::parse_devices("cpu,sim:0,sim:1@4"),
//                       .placement = runtime::PlacementPolicy::heft});
//   Tensor y = relu(matmul(x, w));   // eval() places each node, inserts the copies
//   { DeviceScope on(Device::parse("sim:0")); z = exp(y); }   // a pin is always respected
//
// Placement only chooses where a node runs; correctness never depends on it: the executor
// makes every input present on the node's device (copy tasks), whatever the plan says.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hetrain/base/dtype.h"
#include "hetrain/memory/device.h"

namespace hetrain::runtime {

/// What placement knows of a device: its speed, and the link to it from other memory nodes.
struct DeviceModel {
  Device device;
  double gflops = 100;            // sustained compute rate, GFLOP/s
  double gbps = 20;               // memory bandwidth, GB/s
  double link_gbps = 10;          // copies into this device's memory node, GB/s
  double link_latency_s = 5e-6;   // per copy
  double node_overhead_s = 2e-6;  // scheduling and dispatch per node
  int workers = 1;       // nodes that run at once, each at the rates above (the CPU: one, as
                         // each of its kernels runs on every core)
  double slowdown = 1;   // sim devices: kernels take this many times their CPU time
  std::string hardware;  // simulate: the catalog entry this device models ("" = itself)
  /// > 0: the device's workers run on this machine's cores, this many, shared with every other
  /// device that sets it (the CPU and sim devices beside it); 0: hardware of its own.
  int host_cores = 0;
  /// Sim devices: the capacity of the device's memory node in bytes (sim:N:mem=64MiB; 0: no
  /// limit). Its allocator enforces it: passing it is an OutOfMemoryError.
  int64_t memory_bytes = 0;
  double ridge() const { return gflops / gbps; }  // FLOP/byte where compute-bound begins
};

enum class PlacementPolicy : uint8_t { pinned, density, heft };
/// "pinned", "density" or "heft"; throws naming the bad value.
PlacementPolicy parse_placement(const std::string& s);
const char* placement_name(PlacementPolicy p);

/// Parses a device list: "cpu,sim:0,sim:1@4,sim:2:mem=64MiB" (sim:N@S runs kernels S times
/// slower than on one CPU core, S >= 1; sim:N:mem=SIZE gives its memory node a capacity, a size
/// as parse_byte_size reads it; both may be given, in either order). The CPU must be listed first,
/// names are unique. An unknown or absent device is an error naming it and listing the devices this
/// build has.
std::vector<DeviceModel> parse_devices(const std::string& list);
/// The devices this build can run nodes on ("cpu, sim:0 .. sim:7").
std::string available_devices();

struct RuntimeConfig {
  std::vector<DeviceModel> devices;  // empty: the CPU alone
  PlacementPolicy placement = PlacementPolicy::heft;
};
/// Sets the devices and policy eval() uses from now on (drops cached plans). Not to be called
/// while another thread is inside eval().
void configure(RuntimeConfig cfg);
const RuntimeConfig& config();
/// True when eval() schedules over more than the CPU.
bool heterogeneous();

// ---- placement over a task graph ---------------------------------------------------------

/// One node to place. Inputs name a producer node (an index into the graph, earlier in
/// topological order) or external data already present on some devices.
struct TaskInput {
  int producer = -1;  // -1: data that exists before this graph runs
  int index = 0;      // which output of the producer
  double bytes = 0;
  uint32_t present = 1;  // external data: bit d set when device d holds a valid copy
  int external = -1;     // external data: an id shared by every input reading that data
};
struct TaskNode {
  const char* name = "";  // primitive name (perf-model key)
  Dtype dtype = Dtype::f32;
  double flops = 0, bytes = 0;  // work and memory traffic (Primitive::cost)
  double size = 0;              // perf-model size: bytes read + written
  uint64_t footprint = 0;       // perf-model history key: input and output shapes
  std::vector<TaskInput> inputs;
  int pin = -1;         // device index the node must run on; -1: free
  uint32_t forbid = 0;  // bit d: device d has no kernel for this node (never placed there)
  bool view = false;    // aliases its first input: no work, stays with its input
};

/// Durations the policies and the list scheduler use.
class DurationModel {
 public:
  virtual ~DurationModel() = default;
  /// Seconds to run node on device d (index into devices).
  virtual double node_seconds(const TaskNode& node, int d) const = 0;
  /// Seconds to copy bytes into device d's memory node.
  virtual double copy_seconds(double bytes, int d) const = 0;
  /// Nodes device d runs at once.
  virtual int workers(int d) const { return 1; }
  /// Cores shared by the devices whose nodes hold one while they run (0: none are shared).
  virtual int shared_cores() const { return 0; }
  /// Of a node that runs `seconds` on device d, the seconds from its start that it holds a shared
  /// core (0: none). A sim device's kernel holds one for its own run time; its declared slowdown
  /// is spent asleep.
  virtual double core_seconds(double seconds, int d) const { return 0; }
};

/// Roofline durations from the device models: max(flops / rate, bytes / bandwidth) plus the
/// per-node overhead; sim devices scale by their slowdown.
class RooflineModel : public DurationModel {
 public:
  explicit RooflineModel(std::vector<DeviceModel> devices) : devices_(std::move(devices)) {}
  double node_seconds(const TaskNode& node, int d) const override;
  double copy_seconds(double bytes, int d) const override;
  int workers(int d) const override { return devices_[static_cast<size_t>(d)].workers; }
  int shared_cores() const override;
  double core_seconds(double seconds, int d) const override;
  const std::vector<DeviceModel>& devices() const { return devices_; }

 private:
  std::vector<DeviceModel> devices_;
};

struct CopyTask {
  int producer = -1, index = 0;  // producer -1: external data of input `input` of node `consumer`
  int consumer = -1, input = 0;  // the first node that needs it
  int device = 0;                // destination
  double bytes = 0, start = 0, finish = 0;
};

/// A placement and the schedule the list scheduler predicts for it.
struct Schedule {
  std::vector<int> device;            // per node
  std::vector<double> start, finish;  // per node, seconds from the start
  std::vector<CopyTask> copies;       // one per (data, destination): never duplicated
  double makespan = 0;
  double bytes_moved = 0;
  std::vector<double> busy;  // per device: seconds of node work
  /// For explain: per node, the predicted finish time on each device (-1 where not allowed).
  std::vector<std::vector<double>> finish_on;
};

/// Places the nodes (pins respected) and predicts the schedule: each device runs up to its
/// `workers` nodes at a time, devices that share the host's cores no more nodes together than
/// there are cores, each device's incoming link one copy at a time, and a copy starts as
/// soon as its producer finishes (prefetch). `pinned` puts free nodes on device 0; `density`
/// picks per node the device with the least roofline time plus input transfer time; `heft`
/// the earliest finish time over the devices' queues, nodes by upward rank.
Schedule place(const std::vector<TaskNode>& graph, PlacementPolicy policy,
               const DurationModel& model, int num_devices, bool explain = false);

/// Lower bound on the makespan: max(critical path at each node's fastest device, total work at
/// the fastest device / number of workers over all devices, and for devices sharing the host's
/// cores the least core time of all nodes / cores). Copies are not counted.
double makespan_lower_bound(const std::vector<TaskNode>& graph, const DurationModel& model,
                            int num_devices);

// ---- simulate mode ------------------------------------------------------------------------

/// One task of a simulated run: a node or a copy, on a device, at predicted times.
struct SimTask {
  std::string name;              // primitive, or "copy"
  int device = 0;                // index into the configured devices
  double start = 0, finish = 0;  // seconds from the start of the simulation
  double flops = 0, bytes = 0;
  bool copy = false;
  std::string source;  // duration from "history", "regression" or "roofline"
  std::vector<double>
      finish_on;  // explain: finish on each device from `start`'s eval (-1: not allowed)
};

/// What simulate mode predicts, accumulated over the evals run under a SimulateScope.
struct SimulationLog {
  bool explain = false;    // fill SimTask::finish_on
  bool keep_tasks = true;  // keep every task (for traces and explain)
  std::vector<SimTask> tasks;
  double clock = 0;   // predicted time: eval makespans plus host time between evals
  double host_s = 0;  // measured host time outside eval() (graph building)
  double bytes_moved = 0;
  double lower_bound = 0;  // sum over evals of makespan_lower_bound (evals are barriers)
  int64_t copies = 0, nodes = 0, evals = 0;
  std::vector<double> busy;  // per device: seconds of node work
};

/// While alive, eval() on this thread runs no kernel: it places and schedules the nodes as in
/// a real run (durations from the performance models where trusted, else from the configured
/// device models), appends the predicted schedule to log, and gives outputs uninitialised
/// memory on their devices (values read back are meaningless). Host time between evals is
/// measured and added to the clock.
class SimulateScope {
 public:
  explicit SimulateScope(SimulationLog& log);
  ~SimulateScope();
  SimulateScope(const SimulateScope&) = delete;
  SimulateScope& operator=(const SimulateScope&) = delete;

 private:
  SimulationLog* prev_;
};

/// While alive, eval() on this thread runs its kernels even inside a SimulateScope: for the
/// few values graph building itself needs (an imported model's shape subgraphs, folded to
/// constants). The time it takes counts as host time of the simulated run.
class SimulatePause {
 public:
  SimulatePause();
  ~SimulatePause();
  SimulatePause(const SimulatePause&) = delete;
  SimulatePause& operator=(const SimulatePause&) = delete;

 private:
  SimulationLog* prev_;
};

/// Whether a SimulateScope (not paused) is active on this thread.
bool simulating();

struct SchedulerStats {
  int64_t plans = 0;       // placements computed
  int64_t plan_hits = 0;   // evals that reused a cached placement
  int64_t copy_tasks = 0;  // copies the executor inserted
};
SchedulerStats scheduler_stats();

}  // namespace hetrain::runtime
