// The NCCL communicator against exact sums, one GPU per rank. Skips (with the reason) in a
// build without NCCL or on a machine without a GPU; under mpirun on a GPU machine every rank
// checks its results (tests/distributed/mpi_tests.cmake).
#include <gtest/gtest.h>

#include <vector>

#include "distributed/world.h"
#include "hetrain/distributed/mpi.h"
#include "hetrain/distributed/nccl.h"

#ifdef HETRAIN_HAVE_NCCL
#include <cuda_runtime.h>
#endif

using namespace hetrain;
using namespace hetrain::distributed;

TEST(World, NcclCollectivesOnTheRanksGpus) {
#ifndef HETRAIN_HAVE_NCCL
  GTEST_SKIP() << "this build has no NCCL (CUDA backend off)";
#else
  if (!nccl_available()) GTEST_SKIP() << "no GPU visible (NCCL " << nccl_version() << ")";
  Communicator& boot = world();
  int gpus = 0;
  cudaGetDeviceCount(&gpus);
  if (gpus < boot.local_size())
    GTEST_SKIP() << boot.local_size() << " ranks on this host but " << gpus
                 << " GPU(s): NCCL needs one GPU per rank";
  auto gpu = make_nccl_communicator(boot, {.timeout_s = 60});
  const int size = gpu->size(), me = gpu->rank();
  const int64_t n = 1000;
  std::vector<float> h(n);
  auto value = [](int r, int64_t i) { return static_cast<float>(r * 1000 + i) * 0.5f; };
  for (int64_t i = 0; i < n; ++i) h[i] = value(me, i);
  float* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, n * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(d, h.data(), n * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  gpu->all_reduce(d, n, Dtype::f32, ReduceOp::sum);
  std::vector<float> out(n);
  ASSERT_EQ(cudaMemcpy(out.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  for (int64_t i = 0; i < n; ++i) {
    float want = 0;
    for (int r = 0; r < size; ++r) want += value(r, i);  // exact: multiples of 0.5
    ASSERT_EQ(out[i], want) << i;
  }
  // all_to_all: block r of rank s holds s * 100 + r.
  std::vector<int64_t> blocks(size), got(size);
  for (int r = 0; r < size; ++r) blocks[r] = me * 100 + r;
  int64_t *ds = nullptr, *dr = nullptr;
  ASSERT_EQ(cudaMalloc(&ds, size * sizeof(int64_t)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dr, size * sizeof(int64_t)), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(ds, blocks.data(), size * sizeof(int64_t), cudaMemcpyHostToDevice),
            cudaSuccess);
  gpu->all_to_all(ds, dr, 1, Dtype::i64);
  ASSERT_EQ(cudaMemcpy(got.data(), dr, size * sizeof(int64_t), cudaMemcpyDeviceToHost),
            cudaSuccess);
  for (int s = 0; s < size; ++s) EXPECT_EQ(got[s], s * 100 + me);
  // reduce_scatter (ZeRO's gradient shards): rank r gets the sum over ranks of block r, here
  // through the non-blocking handle; then all_gather puts every rank's shard back in order.
  const int64_t shard = 250;
  std::vector<float> full(static_cast<size_t>(shard * size));
  for (int64_t i = 0; i < shard * size; ++i) full[i] = value(me, i);
  float *dfull = nullptr, *dshard = nullptr;
  ASSERT_EQ(cudaMalloc(&dfull, full.size() * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dshard, shard * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dfull, full.data(), full.size() * sizeof(float), cudaMemcpyHostToDevice),
            cudaSuccess);
  gpu->ireduce_scatter(dfull, dshard, shard, Dtype::f32, ReduceOp::sum)->wait();
  std::vector<float> mine(shard);
  ASSERT_EQ(cudaMemcpy(mine.data(), dshard, shard * sizeof(float), cudaMemcpyDeviceToHost),
            cudaSuccess);
  for (int64_t i = 0; i < shard; ++i) {
    float want = 0;
    for (int r = 0; r < size; ++r) want += value(r, me * shard + i);
    ASSERT_EQ(mine[i], want) << "reduce_scatter [" << i << "]";
  }
  ASSERT_EQ(cudaMemset(dfull, 0, full.size() * sizeof(float)), cudaSuccess);
  gpu->all_gather(dshard, dfull, shard, Dtype::f32);
  ASSERT_EQ(cudaMemcpy(full.data(), dfull, full.size() * sizeof(float), cudaMemcpyDeviceToHost),
            cudaSuccess);
  for (int64_t i = 0; i < shard * size; ++i) {
    float want = 0;
    for (int r = 0; r < size; ++r) want += value(r, i);
    ASSERT_EQ(full[i], want) << "all_gather [" << i << "]";
  }
  // broadcast from the last rank.
  for (int64_t i = 0; i < n; ++i) h[i] = value(me, i);
  ASSERT_EQ(cudaMemcpy(d, h.data(), n * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  gpu->broadcast(d, n, Dtype::f32, size - 1);
  ASSERT_EQ(cudaMemcpy(out.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(out[i], value(size - 1, i)) << "broadcast " << i;
  gpu->barrier();
  cudaFree(d);
  cudaFree(ds);
  cudaFree(dr);
  cudaFree(dfull);
  cudaFree(dshard);
#endif
}
