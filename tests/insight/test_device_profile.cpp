// hetrain bench's measurements: a quick run gives plausible ceilings, and the profile it
// writes is the one the planner reads as `local`.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "hetrain/base/error.h"
#include "hetrain/insight/device_profile.h"
#include "hetrain/planning/catalog.h"

namespace hetrain::insight {
namespace {

TEST(DeviceProfile, QuickMeasurementIsPlausibleAndPlannerReadsIt) {
  DeviceProfile p = measure_device({.quick = true});
  EXPECT_GT(p.fma_peak_gflops, 1.0);
  EXPECT_GT(p.gemm_f32_tflops, 0.0);
  EXPECT_GT(p.gemm_bf16_tflops, 0.0);
  EXPECT_GT(p.mem_bw_gbs, 0.5);
  EXPECT_LT(p.mem_bw_gbs, 5000.0);
  EXPECT_GT(p.mem_bytes, 1e8);
  // A GEMM cannot beat the register-only FMA loop (10% slack for timing noise on a shared
  // machine); bf16/f16 are storage types computed in f32 here, so the same bound holds.
  EXPECT_LE(p.gemm_f32_tflops * 1e3, p.fma_peak_gflops * 1.1);
  EXPECT_LE(p.gemm_bf16_tflops * 1e3, p.fma_peak_gflops * 1.1);
  EXPECT_FALSE(p.rows.empty());

  const std::string dir =
      std::filesystem::temp_directory_path() / ("hetrain_profile_" + std::to_string(getpid()));
  const std::string path = dir + "/hetrain/device_profile.json";
  write_json_atomic(path, p.to_json());
  planning::Catalog cat;
  std::string warning;
  ASSERT_TRUE(cat.load_device_profile(path, &warning)) << warning;
  const planning::Hardware& h = cat.get("local");
  EXPECT_NEAR(h.tflops_f32, p.gemm_f32_tflops, 1e-12);
  EXPECT_NEAR(h.tflops_bf16, p.gemm_bf16_tflops, 1e-12);
  EXPECT_NEAR(h.mem_bw_gbs, p.mem_bw_gbs, 1e-9);
  EXPECT_TRUE(h.measured);
  std::filesystem::remove_all(dir);
}

TEST(DeviceProfile, UnwritablePathIsAnErrorAndLeavesNothing) {
  EXPECT_THROW(check_writable("/proc/forbidden/profile.json", "--json file"), Error);
  const std::string dir =
      std::filesystem::temp_directory_path() / ("hetrain_w_" + std::to_string(getpid()));
  check_writable(dir + "/a/profile.json", "--json file");
  EXPECT_FALSE(std::filesystem::exists(dir + "/a/profile.json"));
  EXPECT_THROW(check_writable(dir, "--json file"), Error);  // a directory
  std::filesystem::remove_all(dir);
}

TEST(DeviceProfile, AtomicWriteReplacesTheFile) {
  const std::string path = std::filesystem::temp_directory_path() /
                           ("hetrain_atomic_" + std::to_string(getpid()) + ".json");
  write_json_atomic(path, {{"a", 1}});
  write_json_atomic(path, {{"a", 2}});
  std::ifstream in(path);
  EXPECT_EQ(nlohmann::json::parse(in)["a"], 2);
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace hetrain::insight
