// Collectives and the deterministic gradient reduction. The World* tests run in any world:
// a plain ctest run is a world of one; ctest also launches this binary under mpirun -np 2 and
// -np 4 (tests/distributed/mpi_tests.cmake), where each rank checks rank-dependent values.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <numeric>

#include "distributed/world.h"
#include "hetrain/base/error.h"
#include "hetrain/distributed/communicator.h"
#include "hetrain/distributed/grad_reducer.h"
#include "hetrain/distributed/mpi.h"
#include "hetrain/graph/ops.h"

using namespace hetrain;
using namespace hetrain::distributed;

namespace {

Communicator* g_world = nullptr;

class WorldEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    comm_ = make_world_communicator({.timeout_s = 60});
    g_world = comm_.get();
  }
  void TearDown() override {
    g_world = nullptr;
    comm_.reset();
  }

 private:
  std::unique_ptr<Communicator> comm_;
};
[[maybe_unused]] auto* const g_env = ::testing::AddGlobalTestEnvironment(new WorldEnvironment);

}  // namespace

Communicator& world() { return *g_world; }

namespace {

// Rank r's value at element i: distinct per rank and element, exact in f32.
Tensor param(const Shape& s) {
  Tensor t = zeros(s);
  t.eval();
  t.requires_grad_();
  return t;
}

float value(int r, int64_t i) { return static_cast<float>(r * 1000 + i) * 0.5f; }

}  // namespace

TEST(World, AllReduceSumsMaxMin) {
  Communicator& c = world();
  const int n = c.size(), me = c.rank();
  std::vector<float> v(10);
  for (int64_t i = 0; i < 10; ++i) v[i] = value(me, i);
  std::vector<double> m = {static_cast<double>(me), -static_cast<double>(me)};
  std::vector<int64_t> mn = {me + 5};
  c.all_reduce(v.data(), 10, Dtype::f32, ReduceOp::sum);
  c.all_reduce(m.data(), 1, Dtype::f64, ReduceOp::max);
  c.all_reduce(mn.data(), 1, Dtype::i64, ReduceOp::min);
  for (int64_t i = 0; i < 10; ++i) {
    float want = 0;
    for (int r = 0; r < n; ++r) want += value(r, i);  // exact: small multiples of 0.5
    EXPECT_EQ(v[i], want) << "element " << i;
  }
  EXPECT_EQ(m[0], n - 1);
  EXPECT_EQ(mn[0], 5);
}

TEST(World, ReduceScatterAllGatherAllToAll) {
  Communicator& c = world();
  const int n = c.size(), me = c.rank();
  const int64_t blk = 3;
  std::vector<float> send(static_cast<size_t>(blk * n)), recv(static_cast<size_t>(blk));
  for (int64_t i = 0; i < blk * n; ++i) send[i] = value(me, i);
  c.reduce_scatter(send.data(), recv.data(), blk, Dtype::f32, ReduceOp::sum);
  for (int64_t j = 0; j < blk; ++j) {
    float want = 0;
    for (int r = 0; r < n; ++r) want += value(r, me * blk + j);
    EXPECT_EQ(recv[j], want);
  }
  std::vector<int32_t> mine = {me, me * 10}, all(static_cast<size_t>(2 * n));
  c.all_gather(mine.data(), all.data(), 2, Dtype::i32);
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(all[2 * r], r);
    EXPECT_EQ(all[2 * r + 1], r * 10);
  }
  // all_to_all: block r of rank s holds s*100 + r; rank me receives s*100 + me from each s.
  std::vector<int64_t> out(static_cast<size_t>(n)), in(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) out[r] = me * 100 + r;
  c.all_to_all(out.data(), in.data(), 1, Dtype::i64);
  for (int s = 0; s < n; ++s) EXPECT_EQ(in[s], s * 100 + me);
}

TEST(World, BroadcastFromEveryRootAndNonBlocking) {
  Communicator& c = world();
  for (int root = 0; root < c.size(); ++root) {
    std::vector<float> v = {static_cast<float>(c.rank()), 7};
    WorkPtr w = c.ibroadcast(v.data(), 2, Dtype::f32, root);
    w->wait();
    EXPECT_TRUE(w->test());
    EXPECT_EQ(v[0], root);
    EXPECT_EQ(v[1], 7);
  }
  c.barrier();
  EXPECT_THROW(c.broadcast(nullptr, 0, Dtype::f32, c.size()), Error);
  EXPECT_THROW(c.all_reduce(nullptr, 0, Dtype::boolean, ReduceOp::sum), Error);
}

// Every rank's gradient g_r; the reducer must give (((g_0 + g_1) + ...) + g_{N-1}) / N exactly,
// whatever the bucket size, and one process accumulating the N gradients as micro-batches
// must give the same bits.
TEST(World, GradReducerIsTheFixedOrderSumForEveryBucketSize) {
  Communicator& c = world();
  const int n = c.size();
  auto grad_of = [](int r, int64_t p, int64_t i) {
    // Values whose sums round: the order is visible in the bits.
    return static_cast<float>(std::sin(0.37 * static_cast<double>(r * 7919 + p * 131 + i)) *
                              std::pow(10.0, static_cast<double>((i % 9) - 4)));
  };
  const std::vector<Shape> shapes = {{300, 5}, {5}, {7, 11}, {1000}};
  auto expected = [&](int64_t p, int64_t i) {
    float s = grad_of(0, p, i);
    for (int r = 1; r < n; ++r) s += grad_of(r, p, i);
    return s / static_cast<float>(n);
  };
  for (double mb : {25.0, 0.001, 0.004}) {
    std::vector<Tensor> params;
    for (const Shape& s : shapes) params.push_back(param(s));
    std::vector<Tensor*> ptrs;
    for (Tensor& t : params) ptrs.push_back(&t);
    auto set_grads = [&](int r) {
      for (size_t p = 0; p < params.size(); ++p) {
        std::vector<float> g(static_cast<size_t>(params[p].numel()));
        for (size_t i = 0; i < g.size(); ++i) g[i] = grad_of(r, static_cast<int64_t>(p), i);
        params[p].set_grad(from_vector(g, shapes[p]));
      }
    };
    // The N ranks, one micro-batch each.
    GradReducer ddp(ptrs, c, {.bucket_mb = mb, .first_bucket_mb = mb});
    if (mb < 0.01) {
      EXPECT_GT(ddp.buckets().size(), 1u);
    }
    set_grads(c.rank());
    ddp.accumulate(true);
    ddp.reduce(n);
    std::vector<std::vector<float>> got;
    for (size_t p = 0; p < params.size(); ++p) {
      got.push_back(params[p].grad().to_vector<float>());
      for (size_t i = 0; i < got[p].size(); ++i) {
        const float want = expected(static_cast<int64_t>(p), static_cast<int64_t>(i));
        ASSERT_EQ(std::memcmp(&got[p][i], &want, 4), 0) << "param " << p << " element " << i;
      }
    }
    // One process, N micro-batches.
    auto local = make_local_communicator();
    GradReducer accum(ptrs, *local, {.bucket_mb = mb, .first_bucket_mb = mb});
    for (int r = 0; r < n; ++r) {
      set_grads(r);
      accum.accumulate(r == 0);
    }
    accum.reduce(n);
    for (size_t p = 0; p < params.size(); ++p) {
      const std::vector<float> g = params[p].grad().to_vector<float>();
      EXPECT_EQ(std::memcmp(g.data(), got[p].data(), g.size() * 4), 0) << "param " << p;
    }
  }
}

TEST(GradReducer, BucketsFillInReverseParameterOrderFirstOneSmall) {
  auto local = make_local_communicator();
  // 4 parameters of 0.5 MiB each: first bucket (1 MiB cap) gets the last two, the next (2 MiB
  // cap) the first two.
  std::vector<Tensor> params;
  for (int i = 0; i < 4; ++i) params.push_back(param({128 * 1024}));
  std::vector<Tensor*> ptrs;
  for (Tensor& t : params) ptrs.push_back(&t);
  GradReducer r(ptrs, *local, {.bucket_mb = 2, .first_bucket_mb = 1});
  ASSERT_EQ(r.buckets().size(), 2u);
  EXPECT_EQ(r.buckets()[0], (std::vector<size_t>{3, 2}));
  EXPECT_EQ(r.buckets()[1], (std::vector<size_t>{1, 0}));
  EXPECT_THROW(GradReducer(ptrs, *local, {.bucket_mb = 0}), Error);
}

TEST(GradReducer, AccumulatesMicroBatchesInOrderAndDivides) {
  auto local = make_local_communicator();
  Tensor w = param({3});
  std::vector<Tensor*> ptrs = {&w};
  GradReducer r(ptrs, *local);
  const float g[3][3] = {{1e8f, 1, 3}, {1, -1e8f, 5}, {-1e8f, 1e8f, 7}};
  for (int k = 0; k < 3; ++k) {
    w.set_grad(from_vector(std::vector<float>(g[k], g[k] + 3), {3}));
    r.accumulate(k == 0);
    EXPECT_FALSE(w.grad().defined());  // cleared for the next micro-batch
  }
  r.reduce(3);
  const std::vector<float> out = w.grad().to_vector<float>();
  for (int i = 0; i < 3; ++i) {
    const float want = ((g[0][i] + g[1][i]) + g[2][i]) / 3.0f;
    EXPECT_EQ(out[i], want) << i;
  }
  EXPECT_EQ(out[0], 0.0f);  // (1e8 + 1) rounds to 1e8, then - 1e8
}

TEST(Fault, ParsesTheEnvironmentAndRejectsNonsense) {
  setenv("HETRAIN_FAULT_INJECT", "1:5:hang", 1);
  auto f = fault_from_env();
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->rank, 1);
  EXPECT_EQ(f->step, 5);
  EXPECT_EQ(f->kind, Fault::Kind::hang);
  for (const char* bad : {"1:5", "x:5:exit", "1:5:explode", "1:-2:exit", "1:5x:exit"}) {
    setenv("HETRAIN_FAULT_INJECT", bad, 1);
    EXPECT_THROW(fault_from_env(), Error) << bad;
  }
  unsetenv("HETRAIN_FAULT_INJECT");
  EXPECT_FALSE(fault_from_env().has_value());
}
