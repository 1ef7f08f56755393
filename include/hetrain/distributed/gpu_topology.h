// GPUs as NVML sees them, for `hetrain topo`: per GPU its name, PCI bus id, NUMA node and
// NVLink links up, and a GPU pair matrix like `nvidia-smi topo -m` (NV# for NVLink, else
// PIX/PXB/PHB/NODE/SYS from the PCIe common ancestor). NVML (libnvidia-ml.so.1) is loaded with
// dlopen at run time: no link-time dependency, and without it `load_gpu_topology` says why.
//
//   GpuTopology t = load_gpu_topology();          // HETRAIN_NVML_LIBRARY overrides the library
//   if (!t.note.empty()) warn(t.note);
//   std::cout << format_gpu_matrix(t);
#pragma once

#include <string>
#include <vector>

namespace hetrain::distributed {

struct GpuInfo {
  std::string name;
  std::string bus_id;  // "0000:17:00.0", as sysfs spells it
  int numa_node = -1;  // -1: unknown
  /// The bus id at the far end of each NVLink link that is up (a GPU, or an NVSwitch).
  std::vector<std::string> nvlink_peers;
};

struct GpuTopology {
  std::vector<GpuInfo> gpus;
  /// NVML's nvmlGpuTopologyLevel_t for each pair (0 internal, 10 single switch, 20 several
  /// switches, 30 host bridge, 40 same NUMA node, 50 across NUMA nodes); n x n.
  std::vector<std::vector<int>> common_ancestor;
  std::string driver_version;
  /// Empty when NVML answered; else why there is no GPU information ("no NVML (...)").
  std::string note;
};

/// The pair matrix: "X" on the diagonal, "NV<k>" for k NVLink links between the two GPUs, else
/// PIX/PXB/PHB/NODE/SYS from the common ancestor.
std::vector<std::vector<std::string>> gpu_pair_matrix(const GpuTopology& t);
/// The matrix as text with a header row, one row per GPU, and its NUMA node; and the legend.
std::string format_gpu_matrix(const GpuTopology& t);

/// Where a rank runs: the NUMA nodes of its bound CPUs and its GPU's NUMA node.
struct RankPlacement {
  int rank = 0;
  std::string host;
  std::vector<int> cpu_numa_nodes;
  int gpu = -1;            // -1: no GPU
  int gpu_numa_node = -1;  // -1: unknown
};

/// A warning per rank whose GPU sits on a NUMA node none of its bound CPUs are on.
std::vector<std::string> far_gpu_warnings(const std::vector<RankPlacement>& ranks);

/// The GPUs through NVML, loaded from `library` (default: $HETRAIN_NVML_LIBRARY, else
/// libnvidia-ml.so.1). Never throws: without the library, or without a GPU, `note` says so.
GpuTopology load_gpu_topology(const std::string& library = "");

}  // namespace hetrain::distributed
