// The GPU pair matrix and the far-GPU warning over fake topologies (no GPU or NVML needed).
#include <gtest/gtest.h>

#include "hetrain/distributed/gpu_topology.h"

namespace hetrain::distributed {
namespace {

/// Four GPUs: 0-1 and 2-3 joined by 2 NVLink links each, 0-1 under one PCIe switch, 2-3 under
/// another on the second NUMA node; across the pairs only the system interconnect.
GpuTopology fake_four_gpus() {
  GpuTopology t;
  t.gpus = {{"A", "0000:17:00.0", 0, {"0000:18:00.0", "0000:18:00.0"}},
            {"A", "0000:18:00.0", 0, {"0000:17:00.0", "0000:17:00.0"}},
            {"A", "0000:97:00.0", 1, {"0000:98:00.0", "0000:98:00.0"}},
            {"A", "0000:98:00.0", 1, {"0000:97:00.0", "0000:97:00.0"}}};
  t.common_ancestor = {{0, 10, 50, 50}, {10, 0, 50, 50}, {50, 50, 0, 20}, {50, 50, 20, 0}};
  t.gpus[3].nvlink_peers.clear();  // links of GPU 3 down: PCIe level shows
  return t;
}

TEST(GpuTopology, PairMatrixNamesNvlinkCountsElseThePcieLevel) {
  const auto m = gpu_pair_matrix(fake_four_gpus());
  ASSERT_EQ(m.size(), 4u);
  EXPECT_EQ(m[0][0], "X");
  EXPECT_EQ(m[0][1], "NV2");
  EXPECT_EQ(m[1][0], "NV2");
  EXPECT_EQ(m[0][2], "SYS");
  EXPECT_EQ(m[2][3], "NV2");
  EXPECT_EQ(m[3][2], "PXB");
  const std::string text = format_gpu_matrix(fake_four_gpus());
  EXPECT_NE(text.find("GPU0  X     NV2   SYS   SYS   0"), std::string::npos) << text;
  EXPECT_NE(text.find("GPU3  SYS   SYS   PXB   X     1"), std::string::npos) << text;
}

TEST(GpuTopology, FarGpuWarnsNamingRankGpuAndBothNodes) {
  std::vector<RankPlacement> ranks = {{0, "h", {0}, 0, 0},
                                      {1, "h", {0}, 1, 1},
                                      {2, "h", {0, 1}, 2, 1},
                                      {3, "h", {}, 3, 1},
                                      {4, "h", {1}, -1, -1}};
  const auto w = far_gpu_warnings(ranks);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_NE(w[0].find("rank 1"), std::string::npos) << w[0];
  EXPECT_NE(w[0].find("GPU 1 on NUMA node 1"), std::string::npos) << w[0];
  EXPECT_NE(w[0].find("NUMA node(s) 0"), std::string::npos) << w[0];
}

TEST(GpuTopology, MissingNvmlLibraryIsANoteNotAnError) {
  const GpuTopology t = load_gpu_topology("/nonexistent/libnvidia-ml.so.1");
  EXPECT_TRUE(t.gpus.empty());
  EXPECT_NE(t.note.find("no NVML"), std::string::npos) << t.note;
}

#ifdef HETRAIN_FAKE_NVML
TEST(GpuTopology, LoadsAStandInNvmlThroughDlopen) {
  const GpuTopology t = load_gpu_topology(HETRAIN_FAKE_NVML);
  ASSERT_TRUE(t.note.empty()) << t.note;
  ASSERT_EQ(t.gpus.size(), 2u);
  EXPECT_EQ(t.gpus[0].name, "Fake GPU 0");
  EXPECT_EQ(t.gpus[0].bus_id, "0000:17:00.0");
  EXPECT_EQ(t.gpus[0].nvlink_peers.size(), 2u);
  EXPECT_EQ(t.driver_version, "999.99");
  const auto m = gpu_pair_matrix(t);
  EXPECT_EQ(m[0][1], "NV2");
  EXPECT_EQ(m[1][0], "PXB");  // GPU 1's links are down in the stand-in
}
#endif

}  // namespace
}  // namespace hetrain::distributed
