// A sim device's memory capacity (sim:N:mem=SIZE in a device list): parsed, installed on the
// device's allocator by configure(), and enforced there with Hetrain's out-of-memory error.
#include <gtest/gtest.h>

#include "hetrain/graph/ops.h"
#include "hetrain/memory/allocator.h"
#include "hetrain/runtime/eval.h"
#include "hetrain/runtime/scheduler.h"

using namespace hetrain;
namespace rt = hetrain::runtime;

namespace {

class SimMemory : public ::testing::Test {
 protected:
  void TearDown() override { rt::configure({}); }
};

TEST_F(SimMemory, ParsesCapacityWithAndWithoutSlowdown) {
  auto devs = rt::parse_devices("cpu,sim:0:mem=64MiB,sim:1@4:mem=2MiB,sim:2:mem=1.5KiB@2,sim:3");
  ASSERT_EQ(devs.size(), 5u);
  EXPECT_EQ(devs[0].memory_bytes, 0);
  EXPECT_EQ(devs[1].device, (Device{DeviceKind::sim, 0}));
  EXPECT_EQ(devs[1].memory_bytes, int64_t{64} << 20);
  EXPECT_EQ(devs[1].slowdown, 1);
  EXPECT_EQ(devs[2].memory_bytes, int64_t{2} << 20);
  EXPECT_EQ(devs[2].slowdown, 4);
  EXPECT_EQ(devs[3].memory_bytes, 1536);
  EXPECT_EQ(devs[3].slowdown, 2);
  EXPECT_EQ(devs[4].memory_bytes, 0);
}

TEST_F(SimMemory, BadCapacityNamesTheItem) {
  try {
    rt::parse_devices("cpu,sim:0:mem=lots");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[devices] memory of 'sim:0:mem=lots': expected a size "
                                         "in bytes"),
              std::string::npos)
        << e.what();
  }
  try {
    rt::parse_devices("cpu:mem=1GiB");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("only sim devices take a memory capacity"),
              std::string::npos)
        << e.what();
  }
}

TEST_F(SimMemory, ConfigureInstallsAndLiftsCapacity) {
  rt::configure({.devices = rt::parse_devices("cpu,sim:0:mem=1MiB,sim:1")});
  EXPECT_EQ(allocator_for({DeviceKind::sim, 0}).capacity(), 1 << 20);
  EXPECT_EQ(allocator_for({DeviceKind::sim, 1}).capacity(), 0);
  rt::configure({.devices = rt::parse_devices("cpu,sim:1")});
  EXPECT_EQ(allocator_for({DeviceKind::sim, 0}).capacity(), 0);
}

TEST_F(SimMemory, PassingCapacityIsOutOfMemoryOnThatDevice) {
  rt::configure({.devices = rt::parse_devices("cpu,sim:0:mem=1MiB"),
                 .placement = rt::PlacementPolicy::pinned});
  Tensor small = ones({64, 1024}).eval();  // 256 KiB
  Tensor big = ones({512, 1024}).eval();   // 2 MiB
  {
    DeviceScope on(Device{DeviceKind::sim, 0});
    Tensor y = exp(small);
    EXPECT_NO_THROW(y.eval());
  }
  try {
    DeviceScope on(Device{DeviceKind::sim, 0});
    Tensor y = exp(big);
    y.eval();
    FAIL() << "no out-of-memory error";
  } catch (const OutOfMemoryError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("[memory] out of memory on sim:0: "), std::string::npos) << m;
    EXPECT_NE(m.find("2.0 MiB (2097152 bytes)"), std::string::npos) << m;
    EXPECT_NE(m.find("capacity (--devices sim:0:mem=1.0 MiB)"), std::string::npos) << m;
    EXPECT_NE(m.find("largest tensors alive:"), std::string::npos) << m;
  }
}

}  // namespace
