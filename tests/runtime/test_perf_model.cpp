// Performance models (history, regression, confidence, the file) and simulate mode.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "hetrain/graph/ops.h"
#include "hetrain/runtime/eval.h"
#include "hetrain/runtime/perf_model.h"
#include "hetrain/runtime/scheduler.h"

using namespace hetrain;
namespace rt = hetrain::runtime;
namespace fs = std::filesystem;

namespace {
std::string temp_dir() {
  std::string d =
      (fs::temp_directory_path() / ("hetrain_perf_" + std::to_string(getpid()))).string();
  fs::create_directories(d);
  return d;
}
}  // namespace

TEST(PerfModel, HistoryNeedsEnoughQuietSamples) {
  rt::PerfModels m;
  m.record("add", "cpu:2t", Dtype::f32, 7, 1000, 1e-5);
  m.record("add", "cpu:2t", Dtype::f32, 7, 1000, 1.1e-5);
  EXPECT_FALSE(m.estimate("add", "cpu:2t", Dtype::f32, 7, 1000).trusted) << "two samples";
  m.record("add", "cpu:2t", Dtype::f32, 7, 1000, 0.9e-5);
  const rt::PerfEstimate e = m.estimate("add", "cpu:2t", Dtype::f32, 7, 1000);
  EXPECT_TRUE(e.trusted);
  EXPECT_STREQ(e.source, "history");
  EXPECT_NEAR(e.seconds, 1e-5, 1e-12);
  // A preempted run (10x) is an outlier, not a new mean.
  m.record("add", "cpu:2t", Dtype::f32, 7, 1000, 1e-4);
  EXPECT_NEAR(m.estimate("add", "cpu:2t", Dtype::f32, 7, 1000).seconds, 1e-5, 1e-12);
  // Noisy samples (coefficient of variation ~0.8) are not trusted.
  for (double t : {1e-5, 3e-5, 0.5e-5, 3.5e-5}) m.record("mul", "cpu:2t", Dtype::f32, 9, 1000, t);
  EXPECT_FALSE(m.estimate("mul", "cpu:2t", Dtype::f32, 9, 1000).trusted);
  // Another device class or dtype knows nothing.
  EXPECT_FALSE(m.estimate("add", "sim@1", Dtype::f32, 7, 1000).trusted);
  EXPECT_FALSE(m.estimate("add", "cpu:2t", Dtype::bf16, 7, 1000).trusted);
}

TEST(PerfModel, RegressionAnswersUnseenSizesWithinItsRange) {
  rt::PerfModels m;
  auto t_of = [](double s) { return 2e-9 * std::pow(s, 1.5) + 1e-6; };
  uint64_t fp = 1;
  for (double s : {1e3, 4e3, 1.6e4, 6.4e4, 2.56e5}) {
    ++fp;
    for (int k = 0; k < 3; ++k) m.record("matmul", "cpu:2t", Dtype::f32, fp, s, t_of(s));
  }
  const rt::PerfEstimate e = m.estimate("matmul", "cpu:2t", Dtype::f32, 999, 3e4);
  ASSERT_TRUE(e.trusted);
  EXPECT_STREQ(e.source, "regression");
  EXPECT_NEAR(e.seconds, t_of(3e4), 0.05 * t_of(3e4));
  // Far outside the fitted sizes: not trusted (explore instead).
  EXPECT_FALSE(m.estimate("matmul", "cpu:2t", Dtype::f32, 999, 1e8).trusted);
}

TEST(PerfModel, FileRoundTripAndBadFilesSetAside) {
  const std::string dir = temp_dir(), path = dir + "/perfmodel.json";
  rt::PerfModels m;
  for (int k = 0; k < 3; ++k) m.record("exp", "cpu:2t", Dtype::f32, 5, 4096, 2e-6);
  m.save(path);
  rt::PerfModels back;
  EXPECT_EQ(back.load(path), "");
  EXPECT_NEAR(back.estimate("exp", "cpu:2t", Dtype::f32, 5, 4096).seconds, 2e-6, 1e-15);

  std::ofstream(path) << "{\"format\": \"hetrain-perfmodel\", \"models\": [";  // truncated
  rt::PerfModels corrupt;
  const std::string w = corrupt.load(path);
  EXPECT_NE(w.find(path + " set aside as " + path + ".bad"), std::string::npos) << w;
  EXPECT_NE(w.find("not valid JSON"), std::string::npos) << w;
  EXPECT_TRUE(corrupt.empty());
  EXPECT_TRUE(fs::exists(path + ".bad"));
  EXPECT_FALSE(fs::exists(path));

  nlohmann::json j = m.to_json();
  j["machine"] = "another-host / some CPU";
  std::ofstream(path) << j.dump();
  rt::PerfModels foreign;
  const std::string w2 = foreign.load(path);
  EXPECT_NE(w2.find("written on another machine ('another-host / some CPU'"), std::string::npos)
      << w2;
  EXPECT_TRUE(foreign.empty());

  j["machine"] = rt::machine_id();
  j["models"][0]["history"][0]["n"] = "three";
  std::ofstream(path) << j.dump();
  rt::PerfModels wrong;
  const std::string w3 = wrong.load(path);
  EXPECT_NE(w3.find("malformed entry"), std::string::npos) << w3;
  fs::remove_all(dir);
}

TEST(PerfModel, CalibratedFromMeasuredKernels) {
  rt::perf_models().clear();
  rt::set_perf_recording(true);
  for (int i = 0; i < 6; ++i) {
    Tensor a = ones({64, 64}), b = ones({64, 64});
    (void)matmul(a, b).eval();
  }
  rt::set_perf_recording(false);
  const nlohmann::json j = rt::perf_models().to_json();
  bool found = false;
  for (const auto& m : j["models"])
    if (m["prim"] == "matmul") {
      found = true;
      EXPECT_EQ(m["device"], rt::device_class(rt::config().devices[0]));
      EXPECT_GE(m["history"][0]["n"].get<int64_t>(), 4);
      EXPECT_GT(m["history"][0]["mean_s"].get<double>(), 0);
    }
  EXPECT_TRUE(found) << j.dump(1);
  rt::perf_models().clear();
}

namespace {
class CountingObserver : public NodeObserver {
 public:
  void on_node(const Node&, int64_t, int64_t) override { ++count; }
  int count = 0;
};
}  // namespace

TEST(Simulate, RunsNoKernelAndPredictsTheSchedule) {
  rt::configure(
      {.devices = rt::parse_devices("cpu,sim:0"), .placement = rt::PlacementPolicy::pinned});
  CountingObserver obs;
  add_node_observer(&obs);
  rt::SimulationLog log;
  Tensor x = ones({128, 128}).eval();
  {
    rt::SimulateScope sim(log);
    Tensor y = matmul(x, x);
    Tensor z;
    {
      DeviceScope on(Device{DeviceKind::sim, 0});
      z = tanh(y);
    }
    eval({sum(z)});
  }
  remove_node_observer(&obs);
  rt::configure({});
  EXPECT_EQ(obs.count, 0) << "simulate mode runs no kernel";
  EXPECT_GE(log.nodes, 3);
  EXPECT_EQ(log.copies, 2) << "y to sim:0, and tanh's result back to the CPU";
  EXPECT_EQ(log.bytes_moved, 2 * 128 * 128 * 4);
  // The matmul's predicted time is at least its roofline time on the CPU model.
  const rt::DeviceModel cpu = rt::parse_devices("cpu")[0];
  EXPECT_GE(log.clock, 2.0 * 128 * 128 * 128 / (cpu.gflops * 1e9));
  ASSERT_EQ(static_cast<int64_t>(log.tasks.size()), log.nodes + log.copies);
  double end = 0;
  for (const auto& t : log.tasks) end = std::max(end, t.finish);
  EXPECT_LE(end, log.clock + 1e-12);
}

TEST(Simulate, IndependentNodesOverlapOnTheCpuWorkers) {
  rt::configure({.devices = rt::parse_devices("cpu"), .placement = rt::PlacementPolicy::heft});
  const int workers = rt::config().devices[0].workers;
  rt::SimulationLog log;
  Tensor a = ones({256, 256}).eval(), b = ones({256, 256}).eval();
  {
    rt::SimulateScope sim(log);
    Tensor x = matmul(a, b), y = matmul(b, a);
    eval({x, y});
  }
  rt::configure({});
  ASSERT_EQ(log.nodes, 2);
  const double busy = log.busy[0], span = log.clock - log.host_s;
  if (workers >= 2) {
    EXPECT_NEAR(span, busy / 2, 1e-9) << "two independent matmuls run at once";
  } else {
    EXPECT_NEAR(span, busy, 1e-9);
  }
}
