// NVML through dlopen: the few functions `hetrain topo` calls, declared with their documented C
// signatures (nvml.h) so that no CUDA header or library is needed to build.
#include "hetrain/distributed/gpu_topology.h"

#include <dlfcn.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace hetrain::distributed {

namespace {

std::string level_name(int level) {
  switch (level) {
    case 0:
      return "INT";
    case 10:
      return "PIX";
    case 20:
      return "PXB";
    case 30:
      return "PHB";
    case 40:
      return "NODE";
    default:
      return "SYS";
  }
}

// nvml.h: nvmlPciInfo_t (NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE 16, ..._BUFFER_SIZE 32).
struct NvmlPciInfo {
  char bus_id_legacy[16];
  unsigned int domain, bus, device, pci_device_id, pci_sub_system_id;
  char bus_id[32];
};
using NvmlDevice = void*;
using NvmlInit = int (*)();
using NvmlShutdown = int (*)();
using NvmlGetCount = int (*)(unsigned int*);
using NvmlGetHandle = int (*)(unsigned int, NvmlDevice*);
using NvmlGetName = int (*)(NvmlDevice, char*, unsigned int);
using NvmlGetPci = int (*)(NvmlDevice, NvmlPciInfo*);
using NvmlLinkState = int (*)(NvmlDevice, unsigned int, int*);
using NvmlLinkRemotePci = int (*)(NvmlDevice, unsigned int, NvmlPciInfo*);
using NvmlCommonAncestor = int (*)(NvmlDevice, NvmlDevice, int*);
using NvmlDriverVersion = int (*)(char*, unsigned int);
constexpr unsigned kMaxLinks = 18;  // NVML_NVLINK_MAX_LINKS (Hopper)

/// NVML's "00000000:17:00.0" as sysfs spells it: "0000:17:00.0".
std::string sysfs_bus_id(const char* nvml) {
  std::string s(nvml);
  if (s.size() > 12) s = s.substr(s.size() - 12);
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

int pci_numa_node(const std::string& bus_id) {
  std::ifstream f("/sys/bus/pci/devices/" + bus_id + "/numa_node");
  int node = -1;
  if (f >> node) return node;
  return -1;
}

template <class F>
F sym(void* lib, const char* name) {
  return reinterpret_cast<F>(dlsym(lib, name));
}

/// Fills `t` from an opened NVML; returns the note (empty on success).
std::string query(void* lib, GpuTopology& t) {
  auto init = sym<NvmlInit>(lib, "nvmlInit_v2");
  auto shutdown = sym<NvmlShutdown>(lib, "nvmlShutdown");
  auto count = sym<NvmlGetCount>(lib, "nvmlDeviceGetCount_v2");
  auto handle = sym<NvmlGetHandle>(lib, "nvmlDeviceGetHandleByIndex_v2");
  auto name = sym<NvmlGetName>(lib, "nvmlDeviceGetName");
  auto pci = sym<NvmlGetPci>(lib, "nvmlDeviceGetPciInfo_v3");
  auto link_state = sym<NvmlLinkState>(lib, "nvmlDeviceGetNvLinkState");
  auto link_pci = sym<NvmlLinkRemotePci>(lib, "nvmlDeviceGetNvLinkRemotePciInfo_v2");
  auto ancestor = sym<NvmlCommonAncestor>(lib, "nvmlDeviceGetTopologyCommonAncestor");
  auto driver = sym<NvmlDriverVersion>(lib, "nvmlSystemGetDriverVersion");
  if (!init || !shutdown || !count || !handle || !name || !pci)
    return "NVML lacks the functions hetrain topo needs";
  if (init() != 0) return "NVML could not start (no NVIDIA driver?)";
  unsigned n = 0;
  std::vector<NvmlDevice> dev;
  if (count(&n) == 0) dev.resize(n, nullptr);
  char buf[96] = {0};
  if (driver && driver(buf, sizeof buf) == 0) t.driver_version = buf;
  for (unsigned i = 0; i < n; ++i) {
    GpuInfo g;
    if (handle(i, &dev[i]) != 0) continue;
    if (name(dev[i], buf, sizeof buf) == 0) g.name = buf;
    NvmlPciInfo p{};
    if (pci(dev[i], &p) == 0) g.bus_id = sysfs_bus_id(p.bus_id);
    g.numa_node = pci_numa_node(g.bus_id);
    for (unsigned l = 0; link_state && link_pci && l < kMaxLinks; ++l) {
      int up = 0;
      NvmlPciInfo r{};
      if (link_state(dev[i], l, &up) == 0 && up == 1 && link_pci(dev[i], l, &r) == 0)
        g.nvlink_peers.push_back(sysfs_bus_id(r.bus_id));
    }
    t.gpus.push_back(g);
  }
  t.common_ancestor.assign(t.gpus.size(), std::vector<int>(t.gpus.size(), 50));
  for (unsigned i = 0; ancestor && i < t.gpus.size(); ++i)
    for (unsigned j = 0; j < t.gpus.size(); ++j) {
      int level = 50;
      if (i != j && ancestor(dev[i], dev[j], &level) == 0) t.common_ancestor[i][j] = level;
    }
  shutdown();
  return t.gpus.empty() ? "no GPU: NVML sees none" : "";
}

}  // namespace

std::vector<std::vector<std::string>> gpu_pair_matrix(const GpuTopology& t) {
  const size_t n = t.gpus.size();
  std::vector<std::vector<std::string>> m(n, std::vector<std::string>(n));
  for (size_t i = 0; i < n; ++i)
    for (size_t j = 0; j < n; ++j) {
      const auto& peers = t.gpus[i].nvlink_peers;
      const auto links = std::count(peers.begin(), peers.end(), t.gpus[j].bus_id);
      const int level = i < t.common_ancestor.size() && j < t.common_ancestor[i].size()
                            ? t.common_ancestor[i][j]
                            : 50;
      m[i][j] = i == j ? "X" : links > 0 ? "NV" + std::to_string(links) : level_name(level);
    }
  return m;
}

std::string format_gpu_matrix(const GpuTopology& t) {
  const auto m = gpu_pair_matrix(t);
  std::ostringstream s;
  s << "      ";
  for (size_t j = 0; j < m.size(); ++j) s << "GPU" << j << (j < 10 ? "  " : " ");
  s << "NUMA\n";
  for (size_t i = 0; i < m.size(); ++i) {
    s << "GPU" << i << (i < 10 ? "  " : " ");
    for (const std::string& c : m[i]) s << c << std::string(c.size() < 6 ? 6 - c.size() : 1, ' ');
    s << (t.gpus[i].numa_node < 0 ? "?" : std::to_string(t.gpus[i].numa_node)) << "\n";
  }
  s << "NV#: that many NVLink links; PIX: one PCIe switch; PXB: several PCIe switches; PHB: a PCIe "
       "host bridge; NODE: within a NUMA node; SYS: across NUMA nodes\n";
  return s.str();
}

std::vector<std::string> far_gpu_warnings(const std::vector<RankPlacement>& ranks) {
  std::vector<std::string> out;
  for (const RankPlacement& r : ranks) {
    if (r.gpu < 0 || r.gpu_numa_node < 0 || r.cpu_numa_nodes.empty()) continue;
    const auto& c = r.cpu_numa_nodes;
    if (std::find(c.begin(), c.end(), r.gpu_numa_node) != c.end()) continue;
    std::string nodes;
    for (int n : c) nodes += (nodes.empty() ? "" : ",") + std::to_string(n);
    out.push_back("GPU far from its rank: rank " + std::to_string(r.rank) + " on " + r.host +
                  " uses GPU " + std::to_string(r.gpu) + " on NUMA node " +
                  std::to_string(r.gpu_numa_node) + " but its CPUs are on NUMA node(s) " + nodes);
  }
  return out;
}

GpuTopology load_gpu_topology(const std::string& library) {
  GpuTopology t;
  std::string path = library;
  if (path.empty()) {
    const char* env = std::getenv("HETRAIN_NVML_LIBRARY");
    path = env && *env ? env : "libnvidia-ml.so.1";
  }
  void* lib = dlopen(path.c_str(), RTLD_LAZY | RTLD_LOCAL);
  if (!lib) {
    t.note = "no NVML (" + path + "): no NVLink state or GPU pair matrix";
    return t;
  }
  t.note = query(lib, t);
  dlclose(lib);
  return t;
}

}  // namespace hetrain::distributed
