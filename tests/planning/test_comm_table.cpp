// Collective timings from the device profile (bench --comm) and what a data-parallel plan on
// `local` is charged for them.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>

#include "hetrain/base/error.h"
#include "hetrain/planning/comm_table.h"
#include "hetrain/planning/plan.h"
#include "testing.h"

using namespace hetrain;
using namespace hetrain::planning;
namespace fs = std::filesystem;

using hetrain::testing::error_of;

namespace {
// ddp_fixed_order measured at 1 KiB, 1 MiB and 4 MiB on 2 ranks: 1 ms, 3 ms, 9 ms.
const char* const kTable = R"({"world_size": 2, "backend": "mpi", "date": "2026-01-01",
  "rows": [{"op": "ddp_fixed_order", "bytes": 4194304, "seconds": 9e-3},
           {"op": "ddp_fixed_order", "bytes": 1024, "seconds": 1e-3},
           {"op": "ddp_fixed_order", "bytes": 1048576, "seconds": 3e-3},
           {"op": "all_reduce", "bytes": 1024, "seconds": 2e-3}]})";

}  // namespace

TEST(CommTable, SecondsInterpolateBetweenSizesAndExtendTheLastLine) {
  const CommTable t = CommTable::from_json(nlohmann::json::parse(kTable), "t");
  EXPECT_EQ(t.world_size, 2);
  EXPECT_EQ(t.backend, "mpi");
  EXPECT_DOUBLE_EQ(t.seconds(kDdpReduceOp, 10), 1e-3);  // below the smallest: its time
  EXPECT_DOUBLE_EQ(t.seconds(kDdpReduceOp, 1024), 1e-3);
  EXPECT_DOUBLE_EQ(t.seconds(kDdpReduceOp, 1048576), 3e-3);
  EXPECT_DOUBLE_EQ(t.seconds(kDdpReduceOp, 2621440), 6e-3);   // halfway from 1 to 4 MiB
  EXPECT_DOUBLE_EQ(t.seconds(kDdpReduceOp, 8388608), 17e-3);  // 9 ms + 4 MiB at 6 ms / 3 MiB
  EXPECT_DOUBLE_EQ(t.seconds("all_reduce", 1e6), 2e-3);       // one row: that time
  EXPECT_NE(error_of([&] {
              t.seconds("all_gather", 1);
            }).find("no 'all_gather' rows (run 'mpirun -np 2 hetrain bench --comm' again)"),
            std::string::npos);
}

TEST(CommTable, BadTablesAreRefusedNamingTheField) {
  auto err = [](const std::string& text) {
    return error_of([&] { comm_tables_from_json(nlohmann::json::parse(text), "profile"); });
  };
  EXPECT_NE(err(R"({"comm": {}})").find("field 'comm' must be an array"), std::string::npos);
  EXPECT_NE(err(R"({"comm": [{"rows": []}]})").find("profile comm[0]: field 'world_size'"),
            std::string::npos);
  EXPECT_NE(err(R"({"comm": [{"world_size": 2, "rows": []}]})").find("'rows' must be a non-empty"),
            std::string::npos);
  EXPECT_NE(
      err(R"({"comm": [{"world_size": 2, "rows": [{"op": "x", "bytes": 8, "seconds": -1}]}]})")
          .find("comm[0] rows[0]: field 'seconds' must be in (0, 1e15), got -1"),
      std::string::npos);
  EXPECT_NE(err(R"({"comm": [{"world_size": 2, "rows": [{"op": "x", "bytes": 8, "seconds": 1},
                                                      {"op": "x", "bytes": 8, "seconds": 2}]}]})")
                .find("op 'x' has two rows for 8 bytes"),
            std::string::npos);
  const std::string two = std::string(R"({"comm": [)") + kTable + "," + kTable + "]}";
  EXPECT_NE(err(two).find("two 'comm' tables for 2 ranks"), std::string::npos);
  EXPECT_TRUE(comm_tables_from_json(nlohmann::json::parse("{}"), "p").empty());
}

TEST(CommTable, BucketsAreTheTrainersAndTheirTimesAddUp) {
  const double mib = 1048576;
  EXPECT_EQ(uniform_buckets(0.5 * mib, 1, 25), std::vector<double>{0.5 * mib});
  EXPECT_EQ(uniform_buckets(30 * mib, 1, 25), (std::vector<double>{mib, 25 * mib, 4 * mib}));
  const CommTable t = CommTable::from_json(nlohmann::json::parse(kTable), "t");
  const DdpCommTime c = ddp_comm_time(t, {mib, 2621440});
  EXPECT_EQ(c.buckets, 2);
  EXPECT_DOUBLE_EQ(c.total_s, 3e-3 + 6e-3);
  EXPECT_DOUBLE_EQ(c.last_s, 6e-3);
}

// A plan on `local` with 2 data-parallel ranks: the step of one rank's share of the batch plus
// the measured reduction of the trainer's buckets of f32 gradients, nothing hidden.
TEST(PlanLocal, DataParallelStepAddsTheMeasuredReduction) {
  const fs::path path =
      fs::temp_directory_path() / ("hetrain_test_" + std::to_string(::getpid()) + "_comm.json");
  std::ofstream(path) << R"({"version": 1, "gemm_tflops": {"f32": 0.1}, "mem_bw_gbs": 10,
                            "mem_bytes": 16e9, "comm": [)"
                      << kTable << "]}";
  Catalog cat;
  std::string warning;
  ASSERT_TRUE(cat.load_device_profile(path.string(), &warning)) << warning;
  fs::remove(path);
  const Hardware& h = cat.get("local");
  ASSERT_EQ(h.comm_tables.size(), 1u);
  Job job;
  job.model = preset("gpt-mini");
  job.global_batch = 32;
  job.tokens = 32 * 64 * 10;
  job.precision = Precision::fp32;
  Strategy s;
  s.micro_batch = 16;
  const Plan two = evaluate(job, h, 2, s);
  // 834,304 parameters: 3,337,216 bytes of gradients, a 1 MiB bucket and the rest.
  ASSERT_EQ(two.params, 834304);
  const double rest = 4.0 * 834304 - 1048576;
  const double expected = 3e-3 + (3e-3 + 6e-3 * (rest - 1048576) / (4194304 - 1048576));
  EXPECT_DOUBLE_EQ(two.time.dp_comm, expected);
  EXPECT_DOUBLE_EQ(two.time.dp_exposed, expected);
  job.global_batch = 16;
  const Plan one = evaluate(job, h, 1, s);
  EXPECT_NEAR(two.time.step - one.time.step, expected, 1e-12);
  // No timings for 4 ranks: no figure.
  job.global_batch = 64;
  EXPECT_EQ(evaluate(job, h, 4, s).time.dp_comm, std::numeric_limits<double>::infinity());
}
