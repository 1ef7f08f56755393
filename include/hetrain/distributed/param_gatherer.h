// ZeRO stage 3's parameter gathers: the parameters live as shards of the flat bucket buffers
// (distributed/sharded_optimizer.h); the model's parameter tensors are leaves without data
// (Node::sharded). Installed as the executor's EvalHook, the gatherer looks at each eval's plan
// (its nodes in plan order, the same on every rank) and lists the uses of every bucket:
//
//   item = (bucket, a run of nodes reading its parameters): a bucket's uses are one item until
//          more than kGatherWindow other buckets were used since its last use (so forward and
//          backward, or the two ends of a tied embedding, are separate items).
//
// Before a node runs, the items it reads are gathered: every item up to the one it needs plus
// kGatherPrefetch more is started (an all-gather of the bucket's shards into a full bucket
// buffer), always in item order, so every rank issues the same collectives in the same order
// whatever order the executor runs independent nodes in; then the needed ones are waited for
// and the bucket's parameter leaves become views of the gathered buffer. After an item's last
// node ran, the buffer is dropped, and with it the leaves' data once no other item of the
// bucket is live. Views of a parameter (a linear layer's transposed weight, which backward
// reads again) belong to its bucket: they drop the buffer with the leaves (and count as
// evaluated, Node::sharded) and get the next gathered buffer back, so a forward's gathered
// weights are not held until backward.
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "hetrain/distributed/communicator.h"
#include "hetrain/graph/tensor.h"
#include "hetrain/runtime/eval.h"

namespace hetrain::distributed {

/// Other buckets used between two uses of a bucket that still count as one gather.
inline constexpr int kGatherWindow = 2;
/// Items started ahead of the one a node waits for.
inline constexpr size_t kGatherPrefetch = 1;

class ParamGatherer final : public EvalHook {
 public:
  /// One bucket: this rank's shard (shard elements, the rank's block of the bucket) and the
  /// parameter leaves it holds, each at its element offset in the whole bucket.
  struct Bucket {
    Array shard;
    std::vector<std::pair<Node*, int64_t>> leaves;
    std::vector<std::weak_ptr<Node>> views;  // views of the leaves seen in plans (gatherer's)
  };
  /// Installs itself as the executor's eval hook (removed by the destructor). The gathered
  /// buckets go to the memory node of `home` (the host, or the state device), which comm's
  /// collectives must reach (NCCL for a GPU); a shard elsewhere is copied there first.
  ParamGatherer(Communicator& comm, std::vector<Bucket> buckets, Device home = Device::cpu());
  ~ParamGatherer() override;
  ParamGatherer(const ParamGatherer&) = delete;
  ParamGatherer& operator=(const ParamGatherer&) = delete;

  std::unique_ptr<EvalRun> begin(const std::vector<Node*>& order) override;
  /// All-gathers of parameter buckets started so far (every rank the same number).
  int64_t gathers() const { return gathers_; }

 private:
  friend class GatherRun;
  // Under mu_: bucket b's leaves become views of full (when no other item of b is live), or
  // lose their data (when the last live item of b ends).
  void acquire(size_t b, const Array& full);
  void release(size_t b);

  Communicator& comm_;
  std::vector<Bucket> buckets_;
  Device home_;
  std::vector<int> live_;  // per bucket: items gathered and not yet ended
  std::mutex mu_;          // the runs' items and the leaves' data
  int64_t gathers_ = 0;
};

}  // namespace hetrain::distributed
