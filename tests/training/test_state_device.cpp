// Where the model state lives (TrainConfig::state_device): a run whose parameters and optimizer
// state live on a sim device must be bitwise the run that keeps them on the CPU, and they must
// really be there at the end (what lets a GPU run skip the per-step copies of the weights).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "hetrain/base/error.h"
#include "hetrain/runtime/scheduler.h"
#include "hetrain/training/nn.h"
#include "hetrain/training/trainer.h"

using namespace hetrain;
using namespace hetrain::training;
namespace fs = std::filesystem;

namespace {

struct RunResult {
  std::vector<double> losses;
  std::map<std::string, std::vector<float>> params;
  std::map<std::string, std::string> where;  // parameter -> device of its array
};

class StateDevice : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("hetrain_state_device_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    std::ofstream(dir_ / "corpus.txt") << std::string(4000, 'a') + "the quick brown fox jumps "
                                       << "over the lazy dog, again and again and again.\n";
    cfg_ = preset_config("gpt-mini");
    cfg_.data = (dir_ / "corpus.txt").string();
    cfg_.layers = 1;
    cfg_.width = 32;
    cfg_.heads = 2;
    cfg_.context = 16;
    cfg_.batch_size = 4;
    cfg_.steps = 3;
    cfg_.dropout = 0;
    cfg_.threads = 1;
    cfg_.progress = false;
    cfg_.final_eval = false;
    runtime::configure({.devices = runtime::parse_devices("cpu,sim:0"),
                        .placement = runtime::PlacementPolicy::heft});
  }
  void TearDown() override {
    runtime::configure({});
    fs::remove_all(dir_);
  }
  RunResult run(const std::string& state_device) {
    TrainConfig c = cfg_;
    c.state_device = state_device;
    RunResult r;
    StepHooks hooks;
    hooks.end = [&](int64_t, double loss) { r.losses.push_back(loss); };
    hooks.finished = [&](nn::Module& model) {
      for (auto& [name, p] : model.named_parameters()) {
        r.where[name] = p->array().device().str();
        r.params[name] = p->to_vector<float>();
      }
    };
    train(c, hooks);
    return r;
  }
  fs::path dir_;
  TrainConfig cfg_;
};

TEST_F(StateDevice, OnASimDeviceBitwiseTheCpuRun) {
  const RunResult cpu = run("cpu"), sim = run("sim:0");
  ASSERT_EQ(cpu.losses.size(), 3u);
  EXPECT_EQ(sim.losses, cpu.losses);
  EXPECT_EQ(sim.params, cpu.params);
  ASSERT_FALSE(sim.where.empty());
  for (const auto& [name, dev] : sim.where) EXPECT_EQ(dev, "sim:0") << name;
  for (const auto& [name, dev] : cpu.where) EXPECT_EQ(dev, "cpu") << name;
}

TEST_F(StateDevice, AutoLeavesTheStepToTheSchedulerWithoutAGpu) {
  EXPECT_EQ(resolve_state_device(cfg_), std::nullopt) << "sim devices are not GPUs";
  TrainConfig c = cfg_;
  c.state_device = "sim:0";
  EXPECT_EQ(resolve_state_device(c), (Device{DeviceKind::sim, 0}));
  c.state_device = "cpu";
  EXPECT_EQ(resolve_state_device(c), Device::cpu());
}

TEST_F(StateDevice, BadValuesAreRefusedWithTheirName) {
  TrainConfig c = cfg_;
  c.state_device = "sim:1";
  try {
    (void)resolve_state_device(c);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("state-device sim:1 is not among the configured devices (cpu, sim:0)"),
              std::string::npos)
        << msg;
  }
  c.state_device = "sim:0";
  c.zero = 1;
  // Under ZeRO the shards live on the state device (a sim device, or a GPU with NCCL); a GPU
  // that is not among the devices is refused as any device is.
  EXPECT_EQ(resolve_state_device(c), (Device{DeviceKind::sim, 0}));
  c.state_device = "cuda:0";
  try {
    (void)resolve_state_device(c);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("state-device cuda:0 is not among the configured devices"),
              std::string::npos)
        << msg;
  }
  c.zero = 0;
  try {
    apply_setting(c, "state-device", "gpu0", "--state-device");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("state-device must be auto, cpu, cuda:N or sim:N, got "
                                         "'gpu0'"),
              std::string::npos)
        << e.what();
  }
  apply_setting(c, "state_device", "cpu", "config.toml");
  EXPECT_EQ(c.state_device, "cpu");
}

}  // namespace
