// Where the model state lives (TrainConfig::state_device): a run whose parameters and optimizer
// state live on a sim device must be bitwise the run that keeps them on the CPU, and they must
// really be there at the end (what lets a GPU run skip the per-step copies of the weights).
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "hetrain/base/error.h"
#include "hetrain/runtime/scheduler.h"
#include "hetrain/training/nn.h"
#include "hetrain/training/trainer.h"
#include "tiny_gpt.h"

using namespace hetrain;
using namespace hetrain::training;

namespace {

using RunResult = hetrain::testing::RecordedRun;
using hetrain::testing::TinyCorpus;

class StateDevice : public ::testing::Test {
 protected:
  void SetUp() override {
    cfg_ = hetrain::testing::tiny_gpt_config(corpus_.corpus(), 1, 32, 16, 4);
    runtime::configure({.devices = runtime::parse_devices("cpu,sim:0"),
                        .placement = runtime::PlacementPolicy::heft});
  }
  void TearDown() override { runtime::configure({}); }
  RunResult run(const std::string& state_device) {
    TrainConfig c = cfg_;
    c.state_device = state_device;
    return hetrain::testing::train_recording(c);
  }
  TinyCorpus corpus_{"state_device"};
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
