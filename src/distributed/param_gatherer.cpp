// ParamGatherer: ZeRO stage 3's all-gathers of parameter buckets, in plan order.
#include "hetrain/distributed/param_gatherer.h"

#include <algorithm>
#include <unordered_map>

#include "distributed/host_buffers.h"
#include "hetrain/base/error.h"
#include "hetrain/graph/primitive.h"
#include "hetrain/memory/allocator.h"

namespace hetrain::distributed {

namespace {

/// A run of nodes of one eval reading one bucket's parameters, and its gathered buffer.
struct Item {
  size_t bucket = 0;
  int64_t left = 0;  // nodes still to run
  Array full;        // the gathered bucket (shard * world elements)
  Array send;        // the shard on the gather's memory (a copy when it lives elsewhere)
  WorkPtr work;      // the all-gather in flight
  bool issued = false, ready = false, ended = false;
};

}  // namespace

/// One eval's items (EvalRun): started in item order, waited for by the nodes that read them.
class GatherRun final : public EvalRun {
 public:
  GatherRun(ParamGatherer& g, std::vector<Item> items, std::vector<std::vector<uint32_t>> uses)
      : g_(g), items_(std::move(items)), uses_(std::move(uses)) {
    std::lock_guard lock(g_.mu_);
    issue_through(0);  // the first gather starts before the first node runs
  }
  ~GatherRun() override {
    std::lock_guard lock(g_.mu_);
    for (Item& it : items_) {
      if (it.work) it.work->wait();  // its buffers must outlive the collective
      it.work.reset();
      if (it.ready && !it.ended) g_.release(it.bucket);
    }
  }
  GatherRun(const GatherRun&) = delete;
  GatherRun& operator=(const GatherRun&) = delete;

  void before_node(size_t i) override {
    if (uses_[i].empty()) return;
    std::lock_guard lock(g_.mu_);
    for (uint32_t j : uses_[i]) {
      issue_through(std::min(items_.size() - 1, j + kGatherPrefetch));
      Item& it = items_[j];
      if (it.ready) continue;
      it.work->wait();
      it.work.reset();
      it.send = Array();
      it.ready = true;
      g_.acquire(it.bucket, it.full);
    }
  }

  void after_node(size_t i) override {
    if (uses_[i].empty()) return;
    std::lock_guard lock(g_.mu_);
    for (uint32_t j : uses_[i]) {
      Item& it = items_[j];
      if (--it.left > 0) continue;
      it.ended = true;
      it.full = Array();
      g_.release(it.bucket);
    }
  }

 private:
  // Starts every item up to j not yet started, in item order (the same on every rank).
  void issue_through(size_t j) {
    for (; next_ <= j && next_ < items_.size(); ++next_) {
      Item& it = items_[next_];
      const ParamGatherer::Bucket& b = g_.buckets_[it.bucket];
      const int64_t shard = b.shard.numel();
      it.full.shape = {shard * g_.comm_.size()};
      it.full.dtype = Dtype::f32;
      it.full.tag = MemoryTag::parameters;
      {
        AllocationDeviceScope on(g_.home_);  // where the nodes that read it run
        it.full.allocate();
      }
      CollectiveContext ctx = g_.comm_.context();
      ctx.what = "all_gather of parameter bucket " + std::to_string(it.bucket) + " (zero 3)";
      g_.comm_.set_context(ctx);
      // Offloaded shards (host memory) cross to a GPU first: NCCL reads device memory.
      it.send = on_node(b.shard, shard, g_.home_);
      it.work = g_.comm_.iall_gather(it.send.raw(), it.full.raw(), shard, Dtype::f32);
      it.issued = true;
      ++g_.gathers_;
    }
  }

  ParamGatherer& g_;
  std::vector<Item> items_;
  std::vector<std::vector<uint32_t>> uses_;  // per node of the plan: the items it reads
  size_t next_ = 0;                          // the next item to start
};

ParamGatherer::ParamGatherer(Communicator& comm, std::vector<Bucket> buckets, Device home)
    : comm_(comm), buckets_(std::move(buckets)), home_(home), live_(buckets_.size(), 0) {
  set_eval_hook(this);
}

ParamGatherer::~ParamGatherer() { set_eval_hook(nullptr); }

std::unique_ptr<EvalRun> ParamGatherer::begin(const std::vector<Node*>& order) {
  std::unique_lock lock(mu_);
  std::unordered_map<const Node*, size_t> bucket_of;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    for (const auto& [leaf, off] : buckets_[b].leaves) bucket_of[leaf] = b;
    // Views of the parameters that outlived an earlier eval.
    auto& views = buckets_[b].views;
    std::erase_if(views, [](const std::weak_ptr<Node>& w) { return w.expired(); });
    for (const auto& w : views) bucket_of[w.lock().get()] = b;
  }
  std::vector<Item> items;
  std::vector<std::vector<uint32_t>> uses(order.size());
  // Per bucket: its open item and the count of bucket switches at its last use.
  std::vector<int64_t> open(buckets_.size(), -1), last_switch(buckets_.size(), 0);
  int64_t switches = 0;
  size_t previous = buckets_.size();
  for (size_t i = 0; i < order.size(); ++i) {
    Node* n = order[i];
    for (const Tensor& t : n->inputs) {
      const auto found = bucket_of.find(t.node());
      if (found == bucket_of.end()) continue;
      const size_t b = found->second;
      // A view of a parameter (a transpose) shares the gathered buffer: it is dropped and given
      // back with the parameters', and what reads it is a use of the bucket too.
      if (n->prim && n->prim->is_view() && n->outs.size() == 1 && !bucket_of.count(n)) {
        bucket_of[n] = b;
        buckets_[b].views.push_back(n->shared_from_this());
      }
      if (b != previous) ++switches;
      previous = b;
      auto& j = open[b];
      if (j < 0 || switches - last_switch[b] > kGatherWindow) {
        j = static_cast<int64_t>(items.size());
        items.emplace_back();
        items.back().bucket = b;
      }
      last_switch[b] = switches;
      const auto ju = static_cast<uint32_t>(j);
      if (std::find(uses[i].begin(), uses[i].end(), ju) == uses[i].end()) {
        uses[i].push_back(ju);
        ++items[static_cast<size_t>(j)].left;
      }
    }
  }
  lock.unlock();  // the run takes it again
  if (items.empty()) return nullptr;
  return std::make_unique<GatherRun>(*this, std::move(items), std::move(uses));
}

void ParamGatherer::acquire(size_t b, const Array& full) {
  if (live_[b]++ > 0) return;
  for (const auto& [leaf, off] : buckets_[b].leaves) {
    Array& a = leaf->outs[0];
    a.view_of(full, contiguous_strides(a.shape), off);
  }
  // Dropped views: the same strides and offset into a buffer of the same layout.
  for (const auto& w : buckets_[b].views)
    if (const std::shared_ptr<Node> v = w.lock(); v && v->sharded) v->outs[0].buffer = full.buffer;
}

void ParamGatherer::release(size_t b) {
  HT_ASSERT(live_[b] > 0);
  if (--live_[b] > 0) return;
  for (const auto& [leaf, off] : buckets_[b].leaves) leaf->outs[0].buffer.reset();
  // Views that ran drop the buffer too and count as evaluated (Node::sharded) until given it
  // back; views not yet run are left to run.
  for (const auto& w : buckets_[b].views)
    if (const std::shared_ptr<Node> v = w.lock(); v && v->outs[0].has_data()) {
      v->outs[0].buffer.reset();
      v->sharded = true;
    }
}

}  // namespace hetrain::distributed
