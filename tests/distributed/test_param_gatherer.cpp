// ZeRO stage 3's gathers in one process: parameters as leaves without data (Node::sharded),
// given data by the ParamGatherer (the executor's eval hook) just before the nodes that read
// them. Forward and backward must give the bits of the same graph over ordinary parameters,
// with one thread and with several (independent nodes then run in any order, the gathers
// still start in plan order), and the leaves must hold no data between evals.
#include <gtest/gtest.h>

#include <cstring>

#include "hetrain/base/error.h"
#include "hetrain/base/thread_pool.h"
#include "hetrain/distributed/communicator.h"
#include "hetrain/distributed/param_gatherer.h"
#include "hetrain/graph/autodiff.h"
#include "hetrain/graph/ops.h"
#include "hetrain/memory/allocator.h"
#include "hetrain/runtime/scheduler.h"

namespace hetrain::distributed {
namespace {

struct Net {
  Tensor w1, b1, w2, w3;
  std::vector<Tensor*> params() { return {&w1, &b1, &w2, &w3}; }
};

// Two branches that read different parameters (independent nodes for the pool), a parameter
// read twice far apart (w1: first layer and the last), and a transposed read in backward.
Tensor loss_of(Net& n, const Tensor& x) {
  const Tensor h = tanh(add(matmul(x, n.w1), n.b1));
  const Tensor a = matmul(h, n.w2), b = matmul(h, n.w3);
  const Tensor y = matmul(tanh(add(a, b)), transpose(n.w2, 0, 1));  // (4, 16)
  const Tensor z = matmul(y, transpose(n.w1, 0, 1));                // (4, 8)
  return sum(mul(z, z));
}

struct Result {
  std::vector<float> loss;
  std::vector<std::vector<float>> grads;
};

Result run(Net& n, const Tensor& x) {
  Tensor loss = loss_of(n, x);
  backward(loss, Tensor());
  Result r{loss.to_vector<float>(), {}};
  for (Tensor* p : n.params()) r.grads.push_back(p->grad().to_vector<float>());
  return r;
}

Net make_net() {
  Generator g(7);
  Net n{randn({8, 16}, Dtype::f32, g), randn({16}, Dtype::f32, g), randn({16, 8}, Dtype::f32, g),
        randn({16, 8}, Dtype::f32, g)};
  for (Tensor* p : n.params()) {
    p->eval();
    p->requires_grad_();
  }
  return n;
}

// Each parameter in a bucket of its own: the shard (a world of one: the whole bucket) holds
// its values; the parameter becomes a leaf without data.
std::vector<ParamGatherer::Bucket> shard(Net& n) {
  std::vector<ParamGatherer::Bucket> buckets;
  for (Tensor* p : n.params()) {
    ParamGatherer::Bucket b;
    b.shard.shape = {p->numel()};
    b.shard.tag = MemoryTag::parameters;
    b.shard.allocate();
    const std::vector<float> v = p->to_vector<float>();
    std::memcpy(b.shard.raw(), v.data(), v.size() * sizeof(float));
    Array a;
    a.shape = p->shape();
    a.strides = contiguous_strides(a.shape);
    *p = make_leaf(std::move(a));
    p->node()->sharded = true;
    p->requires_grad_();
    b.leaves.emplace_back(p->node(), 0);
    buckets.push_back(std::move(b));
  }
  return buckets;
}

TEST(ParamGatherer, ShardedLeavesGiveTheBitsOfWholeParameters) {
  const int threads = num_threads();
  auto comm = make_local_communicator();
  Generator gx(3);
  const Tensor x = randn({4, 8}, Dtype::f32, gx).eval();
  for (int t : {1, 4}) {
    set_num_threads(t);
    Net plain = make_net();
    const Result want = run(plain, x);
    Net sharded = make_net();
    ParamGatherer g(*comm, shard(sharded));
    EXPECT_THROW(sharded.w1.to_vector<float>(), Error);  // no data outside an eval
    const Result got = run(sharded, x);
    EXPECT_EQ(got.loss, want.loss) << t << " threads";
    for (size_t k = 0; k < want.grads.size(); ++k) EXPECT_EQ(got.grads[k], want.grads[k]) << k;
    // Every bucket was gathered, w1 twice (its two reads lie far apart in the plan).
    EXPECT_GE(g.gathers(), 5) << t << " threads";
    for (Tensor* p : sharded.params()) EXPECT_FALSE(p->node()->outs[0].has_data());
    // A second hook is refused while one is installed.
    EXPECT_THROW(ParamGatherer(*comm, {}), Error);
  }
  set_num_threads(threads);
}

// Gathered onto a sim device (the state device under --zero 3): the leaves' device says where
// their data will be, the scheduler runs what reads them there (no copy task could run before
// the gather), the bits stay the CPU's, and a node pinned elsewhere is refused by name.
TEST(ParamGatherer, GatheredOnASimDeviceTheReadersRunThere) {
  const Device sim{DeviceKind::sim, 0};
  runtime::configure({.devices = runtime::parse_devices("cpu,sim:0"),
                      .placement = runtime::PlacementPolicy::heft});
  auto comm = make_local_communicator();
  Generator gx(3);
  const Tensor x = randn({4, 8}, Dtype::f32, gx).eval();
  Net plain = make_net();
  const Result want = run(plain, x);
  Net sharded = make_net();
  std::vector<ParamGatherer::Bucket> buckets = shard(sharded);
  for (Tensor* p : sharded.params()) p->node()->device = sim;
  allocator_for(sim).reset_peak();
  {
    ParamGatherer g(*comm, std::move(buckets), sim);
    const Result got = run(sharded, x);
    EXPECT_EQ(got.loss, want.loss);
    for (size_t k = 0; k < want.grads.size(); ++k) EXPECT_EQ(got.grads[k], want.grads[k]) << k;
    EXPECT_GT(allocator_for(sim).stats().peak[static_cast<size_t>(MemoryTag::parameters)], 0);
    for (Tensor* p : sharded.params()) EXPECT_FALSE(p->node()->outs[0].has_data());
    Tensor y;
    {
      DeviceScope on(Device::cpu());
      y = matmul(x, sharded.w1);
    }
    try {
      y.eval();
      FAIL() << "a node pinned to the CPU read a parameter gathered on sim:0";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(
                    "is pinned to cpu but reads a sharded parameter gathered on sim:0"),
                std::string::npos)
          << e.what();
    }
  }
  runtime::configure({});
}

}  // namespace
}  // namespace hetrain::distributed
