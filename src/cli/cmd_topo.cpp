// hetrain topo: this machine's topology from hwloc (packages, NUMA nodes with memory, cores,
// caches, GPUs and network devices with their NUMA locality) and, under mpirun, each rank's
// host, local rank, bound CPUs and threads; the MPI library and NCCL versions; warnings.
#include <hwloc.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "cli/args.h"
#include "cli/commands.h"
#include "hetrain/base/error.h"
#include "hetrain/base/thread_pool.h"
#include "hetrain/distributed/gpu_topology.h"
#include "hetrain/distributed/mpi.h"
#include "hetrain/distributed/nccl.h"

namespace hetrain::cli {

namespace {

using nlohmann::json;

/// The CPUs of this process's affinity mask as a list ("0-3,8").
std::string bound_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return "?";
  std::string out;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (!CPU_ISSET(c, &set)) continue;
    int e = c;
    while (e + 1 < CPU_SETSIZE && CPU_ISSET(e + 1, &set)) ++e;
    out += (out.empty() ? "" : ",") + std::to_string(c) + (e > c ? "-" + std::to_string(e) : "");
    c = e;
  }
  return out;
}

std::string nodeset_str(hwloc_const_nodeset_t s) {
  char buf[128];
  hwloc_bitmap_list_snprintf(buf, sizeof buf, s);
  return buf;
}

json machine_topology() {
  hwloc_topology_t t;
  if (hwloc_topology_init(&t) != 0) fail("[topo] hwloc_topology_init failed");
  hwloc_topology_set_io_types_filter(t, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
  if (hwloc_topology_load(t) != 0) {
    hwloc_topology_destroy(t);
    fail("[topo] hwloc could not read this machine's topology");
  }
  json m;
  m["packages"] = hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_PACKAGE);
  m["cores"] = hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_CORE);
  m["pus"] = hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_PU);
  m["numa_nodes"] = json::array();
  for (int i = 0; i < hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_NUMANODE); ++i) {
    hwloc_obj_t n = hwloc_get_obj_by_type(t, HWLOC_OBJ_NUMANODE, static_cast<unsigned>(i));
    char cpus[128];
    hwloc_bitmap_list_snprintf(cpus, sizeof cpus, n->cpuset);
    m["numa_nodes"].push_back(
        {{"index", n->os_index}, {"memory_bytes", n->attr->numanode.local_memory}, {"cpus", cpus}});
  }
  m["caches"] = json::array();
  for (hwloc_obj_type_t ct : {HWLOC_OBJ_L1CACHE, HWLOC_OBJ_L2CACHE, HWLOC_OBJ_L3CACHE}) {
    const int count = hwloc_get_nbobjs_by_type(t, ct);
    if (count == 0) continue;
    hwloc_obj_t c = hwloc_get_obj_by_type(t, ct, 0);
    m["caches"].push_back(
        {{"level", c->attr->cache.depth}, {"count", count}, {"bytes_each", c->attr->cache.size}});
  }
  m["io_devices"] = json::array();
  for (hwloc_obj_t o = hwloc_get_next_osdev(t, nullptr); o; o = hwloc_get_next_osdev(t, o)) {
    const auto kind = o->attr->osdev.type;
    if (kind != HWLOC_OBJ_OSDEV_GPU && kind != HWLOC_OBJ_OSDEV_NETWORK &&
        kind != HWLOC_OBJ_OSDEV_OPENFABRICS && kind != HWLOC_OBJ_OSDEV_COPROC)
      continue;
    hwloc_obj_t anc = hwloc_get_non_io_ancestor_obj(t, o);
    m["io_devices"].push_back(
        {{"name", o->name ? o->name : "?"},
         {"kind", kind == HWLOC_OBJ_OSDEV_NETWORK       ? "network"
                  : kind == HWLOC_OBJ_OSDEV_OPENFABRICS ? "infiniband"
                                                        : "gpu"},
         {"numa_nodes", anc && anc->nodeset ? nodeset_str(anc->nodeset) : ""}});
  }
  hwloc_topology_destroy(t);
  return m;
}

/// The NUMA nodes of the CPUs this process is bound to (hwloc); empty if hwloc cannot say.
std::vector<int> bound_numa_nodes() {
  std::vector<int> out;
  hwloc_topology_t t;
  if (hwloc_topology_init(&t) != 0) return out;
  if (hwloc_topology_load(t) == 0) {
    hwloc_bitmap_t cpus = hwloc_bitmap_alloc(), nodes = hwloc_bitmap_alloc();
    if (hwloc_get_cpubind(t, cpus, HWLOC_CPUBIND_PROCESS) == 0) {
      hwloc_cpuset_to_nodeset(t, cpus, nodes);
      for (int n = hwloc_bitmap_first(nodes); n >= 0; n = hwloc_bitmap_next(nodes, n))
        out.push_back(n);
    }
    hwloc_bitmap_free(cpus);
    hwloc_bitmap_free(nodes);
  }
  hwloc_topology_destroy(t);
  return out;
}

/// This rank: host, ranks, bound CPUs and their NUMA nodes, threads, device (the GPU NCCL
/// would choose, local rank % GPUs, with its NUMA node).
json rank_record(const distributed::Communicator& c, const distributed::GpuTopology& gpus) {
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  const int n = static_cast<int>(gpus.gpus.size());
  const int gpu = n > 0 ? c.local_rank() % n : -1;
  return {
      {"rank", c.rank()},
      {"local_rank", c.local_rank()},
      {"host", host},
      {"bound_cpus", bound_cpus()},
      {"cpu_numa_nodes", bound_numa_nodes()},
      {"cpus", available_cpus()},
      {"threads", num_threads()},
      {"device", gpu >= 0 && distributed::nccl_available() ? "cuda:" + std::to_string(gpu) : "cpu"},
      {"gpu", gpu},
      {"gpu_numa_node", gpu >= 0 ? gpus.gpus[static_cast<size_t>(gpu)].numa_node : -1}};
}

/// Per GPU: name, bus id, NUMA node, NVLink links up; and the pair matrix.
json gpu_json(const distributed::GpuTopology& t) {
  json g = json::array();
  for (const auto& d : t.gpus)
    g.push_back({{"name", d.name},
                 {"bus_id", d.bus_id},
                 {"numa_node", d.numa_node},
                 {"nvlink_links_up", d.nvlink_peers.size()}});
  return {{"driver_version", t.driver_version},
          {"gpus", g},
          {"pair_matrix", distributed::gpu_pair_matrix(t)}};
}

/// Warnings for ranks whose GPU is on a NUMA node none of their CPUs are on.
std::vector<std::string> placement_warnings(const std::vector<json>& ranks) {
  std::vector<distributed::RankPlacement> p;
  for (const json& r : ranks)
    p.push_back({r["rank"].get<int>(), r["host"].get<std::string>(),
                 r["cpu_numa_nodes"].get<std::vector<int>>(), r["gpu"].get<int>(),
                 r["gpu_numa_node"].get<int>()});
  return distributed::far_gpu_warnings(p);
}

/// Every rank's record on every rank (fixed-size slots: one all_gather).
std::vector<json> gather_records(distributed::Communicator& c, const json& mine) {
  constexpr int64_t kSlot = 1024;
  std::string s = mine.dump();
  if (static_cast<int64_t>(s.size()) >= kSlot) fail("[topo] rank record too long");
  std::vector<char> send(kSlot, 0), recv(static_cast<size_t>(kSlot * c.size()), 0);
  std::memcpy(send.data(), s.data(), s.size());
  c.all_gather(send.data(), recv.data(), kSlot, Dtype::boolean);
  std::vector<json> out;
  for (int r = 0; r < c.size(); ++r) out.push_back(json::parse(recv.data() + r * kSlot));
  return out;
}

void print_text(const json& j) {
  const json& m = j["machine"];
  std::cout << "host " << j["ranks"][0]["host"].get<std::string>() << ": " << m["packages"]
            << " package(s), " << m["cores"] << " cores, " << m["pus"] << " hardware threads\n";
  for (const json& n : m["numa_nodes"])
    std::cout << "  NUMA node " << n["index"] << ": CPUs " << n["cpus"].get<std::string>() << ", "
              << n["memory_bytes"].get<double>() / (1 << 30) << " GiB\n";
  for (const json& c : m["caches"])
    std::cout << "  L" << c["level"] << " cache: " << c["count"] << " x "
              << c["bytes_each"].get<double>() / 1024 << " KiB\n";
  for (const json& d : m["io_devices"])
    std::cout << "  " << d["kind"].get<std::string>() << " " << d["name"].get<std::string>()
              << " near NUMA node(s) " << d["numa_nodes"].get<std::string>() << "\n";
  std::cout << "world: " << j["world_size"] << " rank(s)";
  if (!j["mpi_library"].get<std::string>().empty())
    std::cout << ", " << j["mpi_library"].get<std::string>() << ", thread level "
              << j["mpi_thread_level"].get<std::string>();
  std::cout << "\nNCCL: "
            << (j["nccl_version"].get<std::string>().empty() ? "not built"
                                                             : j["nccl_version"].get<std::string>())
            << "\n";
  for (const json& r : j["ranks"])
    std::cout << "  rank " << r["rank"] << " (local " << r["local_rank"] << ") on "
              << r["host"].get<std::string>() << ": CPUs " << r["bound_cpus"].get<std::string>()
              << ", " << r["threads"] << " thread(s), " << r["device"].get<std::string>() << "\n";
  for (const json& g : j["nvml"]["gpus"])
    std::cout << "  GPU " << g["bus_id"].get<std::string>() << " " << g["name"].get<std::string>()
              << ": NUMA node "
              << (g["numa_node"].get<int>() < 0 ? "?" : std::to_string(g["numa_node"].get<int>()))
              << ", " << g["nvlink_links_up"] << " NVLink link(s) up\n";
  if (!j["nvml"]["gpus"].empty()) std::cout << j["gpu_matrix_text"].get<std::string>();
  for (const json& w : j["warnings"]) std::cout << "warning: " << w.get<std::string>() << "\n";
}

}  // namespace

int cmd_topo(const Args& args) {
  ArgParser p("topo",
              "This machine's topology (hwloc): packages, NUMA nodes and memory, cores, caches,\n"
              "GPUs and network devices with their NUMA locality; under mpirun each rank's host,\n"
              "bound CPUs, threads and device, the MPI library and its thread level, NCCL.");
  p.flag("json", "print JSON instead of text")
      .epilog("examples:\n  hetrain topo\n  mpirun -np 2 hetrain topo --json");
  if (!p.parse(args)) return 0;
  if (!p.positional().empty()) fail("[topo] unexpected argument '", p.positional()[0], "'");
  std::unique_ptr<distributed::Communicator> comm = distributed::make_world_communicator();
  const distributed::GpuTopology gpus = distributed::load_gpu_topology();
  const std::vector<json> ranks = gather_records(*comm, rank_record(*comm, gpus));
  if (comm->rank() != 0) return 0;
  json j;
  j["machine"] = machine_topology();
  j["world_size"] = comm->size();
  j["ranks"] = ranks;
  j["mpi_library"] = distributed::mpi_library_version();
  j["mpi_thread_level"] = distributed::mpi_thread_level();
  j["nccl_version"] = distributed::nccl_version();
  json warnings = json::array();
  const int cores = std::max(1u, std::thread::hardware_concurrency());
  std::map<std::string, int> threads_per_host;
  for (const json& r : ranks) threads_per_host[r["host"]] += r["threads"].get<int>();
  for (const auto& [host, n] : threads_per_host)
    if (n > cores)
      warnings.push_back("oversubscribed: " + std::to_string(n) + " threads on " + host + "'s " +
                         std::to_string(cores) + " CPUs");
  if (!distributed::nccl_available()) warnings.push_back("no GPU: ranks train on the CPU");
  if (!gpus.note.empty()) warnings.push_back(gpus.note);
  for (const std::string& w : placement_warnings(ranks)) warnings.push_back(w);
  j["nvml"] = gpu_json(gpus);
  if (!p.get_flag("json")) j["gpu_matrix_text"] = distributed::format_gpu_matrix(gpus);
  j["warnings"] = warnings;
  if (p.get_flag("json"))
    std::cout << j.dump(2) << "\n";
  else
    print_text(j);
  return 0;
}

}  // namespace hetrain::cli
