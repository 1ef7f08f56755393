// ZeRO's flat buffers on the state device's memory, one mechanism for every node: the buffer
// operations on a sim device give the host's bits; ZeRO 1-3 with their buffers on sim:0 give
// stage 0's bits; the communicator for a memory is the run's own for host memory and NCCL for a
// GPU. On a GPU (skipped with the reason elsewhere): ZeRO 1-3 on cuda:0 over NCCL (one rank, no
// mpirun) against stage 0 on cuda:0, and offload through page-locked host memory.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "distributed/host_buffers.h"
#include "hetrain/base/error.h"
#include "hetrain/distributed/nccl.h"
#include "hetrain/runtime/scheduler.h"
#include "hetrain/training/nn.h"
#include "hetrain/training/trainer.h"
#include "tiny_gpt.h"

#ifdef HETRAIN_HAVE_NCCL
#include "backends/cuda/flat_buffers.h"
#endif

using namespace hetrain;
using namespace hetrain::distributed;
using namespace hetrain::training;

namespace {

std::vector<float> read_back(const Array& a, int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  Array host = flat_f32(n, MemoryTag::workspace, Device::cpu());
  copy_f32(host, 0, a, 0, n);
  std::memcpy(v.data(), host.raw(), v.size() * sizeof(float));
  return v;
}

TEST(ZeroDevice, FlatBufferOpsOnASimDeviceGiveTheHostsBits) {
  const int64_t n = 1000;
  std::vector<float> x(n), y(n);
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::sin(0.37f * static_cast<float>(i)) * 3.1f;
    y[i] = std::cos(0.11f * static_cast<float>(i)) / 7.3f;
  }
  // The reference: the reducer's arithmetic written out.
  std::vector<float> want(n);
  for (int64_t i = 0; i < n; ++i) want[i] = ((0.0f + x[i]) + y[i]) / 3.0f * 0.7f;
  want[5] = 0;  // zeroed below
  const Device sim{DeviceKind::sim, 0};
  for (Device node : {Device::cpu(), sim}) {
    SCOPED_TRACE(node.str());
    Array a = flat_f32(n + 8, MemoryTag::gradients, node);
    EXPECT_EQ(a.device(), node);
    EXPECT_EQ(read_back(a, n + 8), std::vector<float>(n + 8, 0.0f)) << "allocated zeroed";
    Array hx = flat_f32(n, MemoryTag::workspace), hy = flat_f32(n, MemoryTag::workspace);
    std::memcpy(hx.raw(), x.data(), n * sizeof(float));
    std::memcpy(hy.raw(), y.data(), n * sizeof(float));
    copy_f32(a, 8, hx, 0, n);  // across nodes, at an offset
    add_f32(a, 8, hy, 0, n);
    scale_f32(a, 8, n, 3.0f, true);
    scale_f32(a, 8, n, 0.7f, false);
    zero_f32(a, 8 + 5, 1);
    const std::vector<float> got = read_back(a, n + 8);
    EXPECT_EQ(std::vector<float>(got.begin() + 8, got.end()), want);
    EXPECT_EQ(std::vector<float>(got.begin(), got.begin() + 8), std::vector<float>(8, 0.0f));
    // Host memory is read in place by collectives on the host: no copy for them.
    EXPECT_EQ(on_node(a, n, Device::cpu()).buffer, a.buffer);
    EXPECT_EQ(&staging_allocator(node), &host_allocator());
  }
}

// On a GPU: the same operations queued on cuda:0's stream give the host's bits, and offload's
// page-locked blocks are copied without staging (only the pinned allocator's own blocks: other
// memory is staged), reused only after the copies queued from them.
TEST(ZeroDevice, FlatBufferOpsOnAGpuGiveTheHostsBitsThroughPinnedBlocks) {
#ifndef HETRAIN_HAVE_NCCL
  GTEST_SKIP() << "this build has no CUDA backend with NCCL";
#else
  if (!nccl_available()) GTEST_SKIP() << "no GPU visible: the GPU's buffer ops are owed a GPU run";
  const Device gpu{DeviceKind::cuda, 0};
  const int64_t n = 1 << 16;
  std::vector<float> x(n), y(n), want(n);
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::sin(0.37f * static_cast<float>(i)) * 3.1f;
    y[i] = std::cos(0.11f * static_cast<float>(i)) / 7.3f;
    want[i] = (x[i] + y[i]) / 3.0f * 0.7f;
  }
  Array a = flat_f32(n, MemoryTag::gradients, gpu);
  EXPECT_EQ(a.device(), gpu);
  EXPECT_EQ(read_back(a, n), std::vector<float>(n, 0.0f)) << "allocated zeroed";
  Array px = staging_f32(n, MemoryTag::communication, gpu);
  EXPECT_EQ(px.device(), Device::cpu()) << "page-locked memory is host memory";
  EXPECT_TRUE(cuda::is_pinned_block(px.raw(), n * sizeof(float)));
  EXPECT_FALSE(cuda::is_pinned_block(x.data(), n * sizeof(float))) << "pageable memory";
  EXPECT_FALSE(cuda::is_pinned_block(px.raw(), size_t{1} << 40)) << "past the block";
  std::memcpy(px.raw(), x.data(), n * sizeof(float));
  copy_f32(a, 0, px, 0, n);  // asynchronous from the pinned block
  px = Array{};              // released behind the copy: not reused before it ran
  Array py = staging_f32(n, MemoryTag::communication, gpu);
  std::memcpy(py.raw(), y.data(), n * sizeof(float));
  add_f32(a, 0, py, 0, n);
  scale_f32(a, 0, n, 3.0f, true);
  scale_f32(a, 0, n, 0.7f, false);
  Array back = staging_f32(n, MemoryTag::communication, gpu);
  copy_f32(back, 0, a, 0, n);  // device to host: complete on return
  std::vector<float> got(n);
  std::memcpy(got.data(), back.raw(), n * sizeof(float));
  EXPECT_EQ(got, want);
  EXPECT_EQ(read_back(a, n), want) << "through pageable memory too";
#endif
}

TEST(ZeroDevice, HostMemoryUsesTheRunsCommunicatorAndAGpuNcclOrAClearError) {
  auto local = make_local_communicator();
  EXPECT_EQ(make_device_communicator(Device::cpu(), *local, 60), nullptr);
  EXPECT_EQ(make_device_communicator({DeviceKind::sim, 0}, *local, 60), nullptr);
  install_nccl_communicators();
  if (nccl_available()) GTEST_SKIP() << "a GPU is visible: the error path is for machines without";
  try {
    (void)make_device_communicator({DeviceKind::cuda, 0}, *local, 60);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("cuda:0"), std::string::npos) << msg;
#ifdef HETRAIN_HAVE_NCCL
    EXPECT_NE(msg.find("sees no GPU"), std::string::npos) << msg;
#else
    EXPECT_NE(msg.find("this build has none"), std::string::npos) << msg;
#endif
  }
}

using RunResult = hetrain::testing::RecordedRun;

class ZeroOnStateDevice : public ::testing::Test {
 protected:
  void SetUp() override {
    cfg_ = hetrain::testing::tiny_gpt_config(corpus_.corpus(), 1, 32, 16, 4);
    cfg_.grad_accum = 2;    // two micro-batches: the reducer's sums run at every stage
    cfg_.bucket_mb = 0.01;  // several buckets
  }
  void TearDown() override { runtime::configure({}); }
  RunResult run(const std::string& state_device, int64_t zero, const std::string& offload) {
    TrainConfig c = cfg_;
    c.state_device = state_device;
    c.zero = zero;
    c.offload = offload;
    return hetrain::testing::train_recording(c);
  }
  hetrain::testing::TinyCorpus corpus_{"zero_device"};
  TrainConfig cfg_;
};

TEST_F(ZeroOnStateDevice, StagesWithBuffersOnASimDeviceBitwiseStageZero) {
  runtime::configure({.devices = runtime::parse_devices("cpu,sim:0"),
                      .placement = runtime::PlacementPolicy::heft});
  const RunResult ref = run("cpu", 0, "none");
  ASSERT_EQ(ref.losses.size(), 3u);
  for (int64_t zero : {1, 2, 3}) {
    SCOPED_TRACE("zero " + std::to_string(zero));
    const RunResult r = run("sim:0", zero, "none");
    EXPECT_EQ(r.losses, ref.losses);
    EXPECT_EQ(r.params, ref.params);
    if (zero < 3) {
      for (const auto& [name, dev] : r.where) EXPECT_EQ(dev, "sim:0") << name;
    }
  }
}

// One rank on cuda:0: NCCL bootstrapped over the world of one (no mpirun). Stage 0 on cuda:0
// runs its reduction over NCCL too, so every stage does the same kernels and sums: bitwise.
// Offload runs the update on the host's AdamW, which need not round as the GPU's does: those
// runs match stage 0 on the GPU within 1e-5 (relative), and each other bitwise.
TEST_F(ZeroOnStateDevice, StagesOnACudaStateDeviceOverNcclBitwiseStageZero) {
#ifndef HETRAIN_HAVE_NCCL
  GTEST_SKIP() << "this build has no NCCL (CUDA backend off, or a toolkit without NCCL)";
#else
  if (!nccl_available()) GTEST_SKIP() << "no GPU visible: ZeRO on cuda:0 is owed a GPU run";
  install_nccl_communicators();
  runtime::configure({.devices = runtime::parse_devices("cpu,cuda:0"),
                      .placement = runtime::PlacementPolicy::heft});
  const RunResult ref = run("cuda:0", 0, "none");
  ASSERT_EQ(ref.losses.size(), 3u);
  for (const auto& [name, dev] : ref.where) EXPECT_EQ(dev, "cuda:0") << name;
  for (int64_t zero : {1, 2, 3}) {
    SCOPED_TRACE("zero " + std::to_string(zero));
    const RunResult r = run("cuda:0", zero, "none");
    EXPECT_EQ(r.losses, ref.losses);
    EXPECT_EQ(r.params, ref.params);
    if (zero < 3) {
      for (const auto& [name, dev] : r.where) EXPECT_EQ(dev, "cuda:0") << name;
    }
  }
  // Offload's host copies are page-locked, tagged communication (the copies' own staging blocks
  // come from the same allocator, tagged workspace, and do not count here).
  Allocator& pinned = cuda::pinned_host_allocator(0);
  pinned.reset_peak();
  const auto comm_peak = [&] {
    return pinned.stats().peak[static_cast<size_t>(MemoryTag::communication)];
  };
  const int64_t live = comm_peak();  // what was live at the reset
  const RunResult off2 = run("cuda:0", 2, "optimizer");
  EXPECT_GT(comm_peak(), live) << "offload's host copies are page-locked";
  const RunResult off3 = run("cuda:0", 3, "optimizer+params");
  EXPECT_EQ(off3.losses, off2.losses);
  EXPECT_EQ(off3.params, off2.params);
  ASSERT_EQ(off2.losses.size(), ref.losses.size());
  for (size_t i = 0; i < ref.losses.size(); ++i)
    EXPECT_NEAR(off2.losses[i], ref.losses[i], 1e-5 * std::fabs(ref.losses[i])) << i;
  for (const auto& [name, v] : ref.params) {
    const std::vector<float>& o = off2.params.at(name);
    ASSERT_EQ(o.size(), v.size()) << name;
    for (size_t i = 0; i < v.size(); ++i)
      ASSERT_NEAR(o[i], v[i], 1e-5 * std::max(1.0f, std::fabs(v[i]))) << name << "[" << i << "]";
  }
#endif
}

}  // namespace
