// The runtime's device set and policy, and the parsing of device lists.
#include <algorithm>
#include <sstream>
#include <thread>

#include "hetrain/base/byte_size.h"
#include "hetrain/base/error.h"
#include "hetrain/base/thread_pool.h"
#include "hetrain/memory/allocator.h"
#include "hetrain/runtime/scheduler.h"
#include "runtime/internal.h"
#if HETRAIN_HAVE_CUDA
#include "backends/cuda/api.h"
#endif

namespace hetrain::runtime {

PlacementPolicy parse_placement(const std::string& s) {
  if (s == "pinned") return PlacementPolicy::pinned;
  if (s == "density") return PlacementPolicy::density;
  if (s == "heft") return PlacementPolicy::heft;
  fail("[placement] unknown policy '", s, "'; expected pinned, density or heft");
}

const char* placement_name(PlacementPolicy p) {
  switch (p) {
    case PlacementPolicy::pinned:
      return "pinned";
    case PlacementPolicy::density:
      return "density";
    case PlacementPolicy::heft:
      return "heft";
  }
  return "?";
}

std::string available_devices() { return devices_found(); }

namespace {
DeviceModel cpu_model() {
  DeviceModel m;
  m.device = Device::cpu();
  // Defaults near this class of machine (per core: ~50 GFLOP/s f32 GEMM, ~10 GB/s); the
  // performance models replace them with measured times.
  const double cores = num_threads();
  m.gflops = 50 * cores;
  m.gbps = 10 * cores;
  m.link_gbps = 10;
  // One node at a time at that rate: each CPU kernel already spreads over every core, so nodes
  // run side by side share the same cores and add no throughput. (Counting each thread as a
  // worker at the whole CPU's rate made the CPU look cores-times faster than it is, and led
  // HEFT to move a GPU run's independent work, such as weight gradients, onto it.)
  m.workers = 1;
  return m;
}

/// A CUDA device before measurement: round figures of a current data-centre GPU (the
/// performance models replace them with measured kernel times). One worker: its kernels
/// queue in order on one stream.
DeviceModel cuda_model(Device d) {
  DeviceModel m;
  m.device = d;
  m.gflops = 50000;  // f32/tf32 mix of GEMMs and elementwise kernels, GFLOP/s
  m.gbps = 2000;
  m.link_gbps = 20;  // pinned host-to-device copies over PCIe
  m.link_latency_s = 10e-6;
  m.node_overhead_s = 5e-6;  // a launch
  m.workers = 1;
  return m;
}
}  // namespace

std::vector<DeviceModel> parse_devices(const std::string& list) {
  std::vector<DeviceModel> out;
  const DeviceModel cpu = cpu_model();
  std::stringstream ss(list);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) fail("[devices] empty device name in '", list, "'");
    std::string name = item;
    // sim:N:mem=SIZE: the memory node's capacity (before or after @S).
    int64_t memory_bytes = 0;
    if (auto mem = name.find(":mem="); mem != std::string::npos) {
      const size_t end = name.find('@', mem);
      const std::string sv =
          name.substr(mem + 5, end == std::string::npos ? std::string::npos : end - mem - 5);
      memory_bytes = parse_byte_size(sv, "[devices] memory of '" + item + "'");
      name.erase(mem, end == std::string::npos ? std::string::npos : end - mem);
    }
    const bool has_slowdown = name.find('@') != std::string::npos;
    double slowdown = 1;
    if (auto at = name.find('@'); at != std::string::npos) {
      const std::string sv = name.substr(at + 1);
      name = name.substr(0, at);
      try {
        size_t used = 0;
        slowdown = std::stod(sv, &used);
        if (used != sv.size()) throw std::invalid_argument("");
      } catch (const std::exception&) {
        fail("[devices] bad slowdown '", sv, "' in '", item, "': expected a number >= 1");
      }
      if (!(slowdown >= 1 && slowdown <= 1e6))
        fail("[devices] bad slowdown '", sv, "' in '", item, "': expected a number >= 1");
    }
    Device d;
    try {
      d = Device::parse_name(name);
    } catch (const Error&) {
      fail("[devices] unknown device '", name, "'; devices found: ", available_devices());
    }
    try {
      require_device(d);
    } catch (const Error& e) {
      fail("[devices] device '", name, "' is not present: ", e.what());
    }
    if (has_slowdown && d.kind != DeviceKind::sim)
      fail("[devices] '", item, "': only sim devices take a slowdown (sim:N@S)");
    if (memory_bytes > 0 && d.kind != DeviceKind::sim)
      fail("[devices] '", item, "': only sim devices take a memory capacity (sim:N:mem=SIZE)");
    for (const DeviceModel& m : out)
      if (m.device == d) fail("[devices] device '", name, "' is listed twice in '", list, "'");
    if (d.kind == DeviceKind::cpu) {
      out.push_back(cpu);
    } else if (d.kind == DeviceKind::cuda) {
      out.push_back(cuda_model(d));
    } else {
      // One dedicated worker thread: a core's share of the CPU, slowed down.
      DeviceModel m = cpu;
      m.device = d;
      m.slowdown = slowdown;
      m.memory_bytes = memory_bytes;
      m.workers = 1;
      m.gflops = cpu.gflops / std::max(1, num_threads());
      m.gbps = cpu.gbps / std::max(1, num_threads());
      out.push_back(m);
    }
  }
  if (out.empty())
    fail("[devices] no device in '", list, "'; devices found: ", available_devices());
  // Sim devices' workers are threads on this machine's cores, beside the CPU's.
  if (out.size() > 1) {
    const unsigned hc = std::thread::hardware_concurrency();
    for (DeviceModel& m : out)
      if (m.device.kind == DeviceKind::cpu || m.device.kind == DeviceKind::sim)
        m.host_cores = hc == 0 ? 1 : static_cast<int>(hc);
  }
  if (out[0].device != Device::cpu())
    fail("[devices] the device list '", list, "' must start with cpu (where data is created)");
  return out;
}

namespace {
RuntimeConfig& config_slot() {
  static RuntimeConfig c = [] {
    RuntimeConfig r;
    r.devices = {cpu_model()};
    return r;
  }();
  return c;
}
bool g_heterogeneous = false;
}  // namespace

void configure(RuntimeConfig cfg) {
  if (cfg.devices.empty()) cfg.devices = {cpu_model()};
  if (cfg.devices.size() > 16) fail("[devices] at most 16 devices, got ", cfg.devices.size());
  if (cfg.devices[0].device != Device::cpu()) fail("[devices] the first device must be cpu");
  for (const DeviceModel& m : cfg.devices) (void)allocator_for(m.device);
  // Sim devices' capacities: the listed ones as given, the others unlimited.
  for (int i = 0; i < kMaxSimDevices; ++i) allocator_for({DeviceKind::sim, i}).set_capacity(0, "");
  for (const DeviceModel& m : cfg.devices)
    if (m.device.kind == DeviceKind::sim && m.memory_bytes > 0)
      allocator_for(m.device).set_capacity(
          m.memory_bytes, "--devices " + m.device.str() + ":mem=" + format_bytes(m.memory_bytes));
  config_slot() = std::move(cfg);
  g_heterogeneous = config_slot().devices.size() > 1;
  clear_plan_cache();
}

const RuntimeConfig& config() { return config_slot(); }
bool heterogeneous() { return g_heterogeneous; }

int device_index(Device d) {
  const auto& devs = config_slot().devices;
  for (size_t i = 0; i < devs.size(); ++i)
    if (devs[i].device == d) return static_cast<int>(i);
  return -1;
}

std::string configured_devices() {
  std::string s;
  for (const DeviceModel& m : config_slot().devices) s += (s.empty() ? "" : ", ") + m.device.str();
  return s;
}

}  // namespace hetrain::runtime
