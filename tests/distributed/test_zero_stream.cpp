// The sharded optimizer's streamed updates (ShardedOptimizer::stream_next_step, the trainer's
// policy under --offload): each bucket is updated as soon as the reducer has reduced it, while
// backward still runs, and the result is bitwise the updates after backward; and its model-state
// measurement only when asked. (World of one: a local communicator.)
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "hetrain/distributed/communicator.h"
#include "hetrain/distributed/grad_reducer.h"
#include "hetrain/distributed/sharded_optimizer.h"
#include "hetrain/graph/ops.h"
#include "hetrain/runtime/eval.h"
#include "hetrain/training/optim.h"

using namespace hetrain;
using namespace hetrain::distributed;

namespace {

// Values whose sums and products round: a changed order shows in the bits.
std::vector<float> values(int64_t n, int seed) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    v[static_cast<size_t>(i)] =
        static_cast<float>(0.3 * std::sin(0.71 * static_cast<double>(i) + 1.3 * seed));
  return v;
}

// Holds backward at the node that computes the first parameter's gradient (the input layer's:
// backward makes it last) until the optimizer has updated a bucket, for at most 30 s, and
// records how many it had: streamed updates are seen there, updates after backward are not.
class HoldInputLayerGradient final : public NodeObserver {
 public:
  HoldInputLayerGradient(const Tensor* first, const ShardedOptimizer* opt)
      : first_(first), opt_(opt) {}
  void on_node(const Node& node, int64_t, int64_t) override {
    const Tensor& g = first_->node()->grad;
    if (!g.defined() || g.node() != &node) return;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (opt_->buckets_updated() == 0 && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    seen.push_back(opt_->buckets_updated());
  }
  std::vector<int64_t> seen;  // per step

 private:
  const Tensor* first_;
  const ShardedOptimizer* opt_;
};

struct Outcome {
  std::vector<std::vector<float>> params;
  std::vector<int64_t> seen, streamed;  // per step
  size_t buckets = 0;
};

// Three steps of AdamW on a small tanh network; every parameter in a bucket of its own.
Outcome train(int stage, bool stream) {
  auto comm = make_local_communicator();
  const std::vector<Shape> shapes = {{6, 16}, {16}, {16, 16}, {16}, {16, 3}};
  std::vector<Tensor> ps;
  for (size_t i = 0; i < shapes.size(); ++i) {
    int64_t n = 1;
    for (int64_t d : shapes[i]) n *= d;
    ps.push_back(from_vector(values(n, static_cast<int>(i)), shapes[i]).eval());
    ps.back().requires_grad_();
  }
  std::vector<Tensor*> ptrs;
  optim::NamedParams named;
  for (size_t i = 0; i < ps.size(); ++i) {
    ptrs.push_back(&ps[i]);
    named.emplace_back("p" + std::to_string(i), &ps[i]);
  }
  GradReducer reducer(ptrs, *comm, ShardedOptimizer::bucket_options(stage, 1e-6, 1e-6));
  ShardedOptimizer opt(
      named, reducer, *comm, stage,
      [](const optim::NamedParams& p) {
        return std::make_unique<optim::AdamW>(p, optim::AdamWOptions{.lr = 0.05});
      },
      nullptr);
  Outcome out;
  out.buckets = reducer.buckets().size();
  const Tensor x = from_vector(values(24, 99), {4, 6});
  HoldInputLayerGradient hold(&ps[0], &opt);
  if (stream) add_node_observer(&hold);
  for (int step = 0; step < 3; ++step) {
    opt.set_lr(0.05);
    Tensor h = tanh(matmul(x, ps[0]) + ps[1]);
    h = tanh(matmul(h, ps[2]) + ps[3]);
    const Tensor loss = sum(square(matmul(h, ps[4])));
    const bool streams = stream && opt.stream_next_step();
    reducer.overlap_next_backward(true, streams ? 1 : 0);
    loss.backward();
    reducer.accumulate(true);
    reducer.reduce(1);
    opt.step();
    opt.zero_grad();
    out.streamed.push_back(opt.streamed_buckets());
  }
  if (stream) remove_node_observer(&hold);
  out.seen = hold.seen;
  for (const Tensor& p : ps) out.params.push_back(p.to_vector<float>());
  return out;
}

}  // namespace

TEST(ZeroStream, BucketsAreUpdatedDuringBackwardBitwiseTheUpdatesAfterIt) {
  for (int stage : {1, 2}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    const Outcome after = train(stage, false);
    const Outcome streamed = train(stage, true);
    ASSERT_EQ(after.buckets, 5u);
    // At the input layer's gradient, backward's last, the later layers' buckets were updated.
    ASSERT_EQ(streamed.seen.size(), 3u);
    for (int64_t seen : streamed.seen) EXPECT_GE(seen, 1);
    for (int64_t n : streamed.streamed) EXPECT_GE(n, 1);
    for (int64_t n : after.streamed) EXPECT_EQ(n, 0);
    ASSERT_EQ(after.params.size(), streamed.params.size());
    for (size_t i = 0; i < after.params.size(); ++i)
      EXPECT_EQ(std::memcmp(after.params[i].data(), streamed.params[i].data(),
                            after.params[i].size() * 4),
                0)
          << "parameter " << i;
  }
}

TEST(ZeroStream, OnlyStagesThatReduceDuringBackwardStream) {
  auto comm = make_local_communicator();
  Tensor p = zeros({8});
  p.eval();
  p.requires_grad_();
  for (int stage : {0, 3}) {
    GradReducer reducer({&p}, *comm, ShardedOptimizer::bucket_options(stage, 1));
    ShardedOptimizer opt(
        {{"p", &p}}, reducer, *comm, stage,
        [](const optim::NamedParams& q) {
          return std::make_unique<optim::SGD>(q, optim::SgdOptions{.lr = 0.1});
        },
        nullptr);
    EXPECT_FALSE(opt.stream_next_step()) << "stage " << stage;
  }
}

// model_state_bytes() reads every home device's allocator statistics in step(): only when asked
// (the trainer asks for a JSON log), not every step of every run.
TEST(ShardedOptimizer, ModelStatesAreMeasuredOnlyWhenAsked) {
  auto comm = make_local_communicator();
  for (bool measure : {false, true}) {
    Tensor p = from_vector(values(64, 1), {64}).eval();
    p.requires_grad_();
    GradReducer reducer({&p}, *comm, ShardedOptimizer::bucket_options(1, 1));
    ShardedOptimizer opt(
        {{"p", &p}}, reducer, *comm, 1,
        [](const optim::NamedParams& q) {
          return std::make_unique<optim::SGD>(q, optim::SgdOptions{.lr = 0.1});
        },
        nullptr);
    opt.measure_model_states(measure);
    sum(square(p)).backward();
    reducer.accumulate(true);
    reducer.reduce(1);
    opt.step();
    const auto& bytes = opt.model_state_bytes();
    const auto params = bytes[static_cast<size_t>(MemoryTag::parameters)];
    const auto grads = bytes[static_cast<size_t>(MemoryTag::gradients)];
    if (measure) {
      EXPECT_GE(params, 64 * 4);
      EXPECT_GE(grads, 64 * 4);
    } else {
      EXPECT_EQ(params, 0);
      EXPECT_EQ(grads, 0);
    }
  }
}
