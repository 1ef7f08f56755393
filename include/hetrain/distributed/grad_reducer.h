// Data-parallel gradient reduction with a fixed summation order, so that N ranks give the same
// bits as one process accumulating the same N micro-batches.
//
//   GradReducer reducer(model.parameters(), comm, {.bucket_mb = 25, .first_bucket_mb = 1});
//   for (int k = 0; k < K; ++k) {
//     if (k == K - 1) reducer.overlap_next_backward(k == 0);  // buckets start during backward
//     forward/backward of micro-batch k;   // fresh .grad on each parameter
//     reducer.accumulate(k == 0);          // bucket += grad (micro-batch order), grads cleared
//   }
//   reducer.reduce(K * comm.size());       // sum over ranks in rank order, / divisor, into .grad
//
// Buckets hold the gradients of consecutive parameters in reverse parameter order (the order
// backward produces them); the first bucket holds at most first_bucket_mb, the others
// bucket_mb (a larger parameter gets a bucket of its own). Each bucket is reduced by an
// all-to-all of its shards (block r to rank r), a sum of the blocks in rank order 0..N-1 on
// the rank that owns the shard, a division by the divisor, and an all-gather: element i ends as
// ((g_0[i] + g_1[i]) + ... + g_{N-1}[i]) / divisor whatever the bucket sizes, and one process
// with K micro-batches computes ((g_0[i] + g_1[i]) + ... + g_{K-1}[i]) / K, the same
// operations on the same values.
//
// Overlap: armed by overlap_next_backward(), the reducer watches the executor (a NodeObserver):
// when a parameter's gradient node has run, its values go into the bucket at once, and a bucket
// whose gradients are all in starts its all-to-all (buckets start in bucket order on every
// rank, as MPI requires) while backward goes on; completed exchanges are summed there too.
// Open MPI progresses non-blocking collectives only inside MPI calls, so something polls the
// exchanges in flight while backward runs, as ProgressMode says: each later node (executor), a
// communication thread that runs while backward does (thread), or nothing until reduce()
// (none, a baseline). The mode changes when a bucket is summed, never how: the bits are the
// same. reduce() starts what is left and finishes with the all-gathers.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "hetrain/distributed/communicator.h"
#include "hetrain/graph/tensor.h"
#include "hetrain/memory/array.h"
#include "hetrain/memory/device.h"
#include "hetrain/runtime/eval.h"

namespace hetrain::distributed {

struct BucketOptions {
  double bucket_mb = 25;       // MiB of f32 gradients per bucket
  double first_bucket_mb = 1;  // the first bucket (the last parameters), reduced soonest
  // The ZeRO layouts (distributed/sharded_optimizer.h).
  bool gather = true;          // all-gather the reduced shards (false: a rank keeps its shard)
  bool keep_buffers = true;    // each bucket's full gradient buffer lives between steps (false:
                               // allocated for the step, the reduced shard copied out, freed)
  bool install_grads = true;   // reduce() sets the parameters' .grad (copies)
  int64_t shard_multiple = 1;  // shards are padded to a multiple of this many elements
  // Parameters of at most this many elements go into buckets of their own, "persistent" ones
  // (ZeRO 3 keeps them whole, as DeepSpeed's param_persistence_threshold); 0: none.
  int64_t persist_numel = 0;
  bool overlap = true;  // overlap_next_backward() starts buckets during backward
                        // (false: ZeRO 3, whose gathers are backward's collectives)
  // The memory node of the bucket buffers (gradients and exchange buffers): the host, or the
  // state device (a sim device, read in place; a GPU, whose sums run on its stream). The
  // communicator given with it must reach that memory (NCCL for a GPU: make_device_communicator).
  Device buffers = Device::cpu();
  ProgressMode progress = progress_mode_from_env();
};

/// Time spent on the reductions of one step.
struct ReduceTimes {
  double comm_s = 0;               // from the first bucket's start to the last one's completion
  double exposed_comm_s = 0;       // time the caller waited for collectives to complete
  int64_t overlapped_buckets = 0;  // buckets whose exchange started while backward ran
};

class GradReducer final : private NodeObserver {
 public:
  /// params: the model's parameters in parameter order (f32). Throws for a bad size.
  GradReducer(std::vector<Tensor*> params, Communicator& comm, BucketOptions opt = {});
  ~GradReducer() override;
  GradReducer(const GradReducer&) = delete;
  GradReducer& operator=(const GradReducer&) = delete;

  /// The next backward is the step's last: take each gradient as it is computed and start
  /// buckets during backward (first: that backward is also the step's first micro-batch).
  /// accumulate() ends the watch. divisor > 0 (reduce()'s, known in advance): a bucket whose
  /// exchange completes during backward is divided at once and handed to the bucket listener,
  /// which can start its optimizer update while backward goes on.
  void overlap_next_backward(bool first, int64_t divisor = 0);
  /// Called with a bucket's index once its reduced gradient is final (this rank's shard, or with
  /// gather the whole bucket): in bucket order, once per bucket and step, during backward (see
  /// overlap_next_backward) or in reduce(), on the thread that completed it and under the
  /// reducer's lock (the listener must not call back into the reducer). Null: none.
  void set_bucket_listener(std::function<void(size_t)> listener);

  /// Adds every parameter's gradient to its bucket (first: copies instead) and clears the
  /// gradients. A parameter without a gradient adds nothing.
  void accumulate(bool first);
  /// Reduces every bucket over the ranks, divides by divisor and installs the results as the
  /// parameters' gradients (on parameters that had one on this rank).
  ReduceTimes reduce(int64_t divisor);

  /// Bucket b's parameters (indices into params, in the bucket's order).
  const std::vector<std::vector<size_t>>& buckets() const { return bucket_params_; }
  /// The flat layout: bucket b holds numel elements (its parameters at their offsets) padded
  /// to shard * world; rank r owns elements [r * shard, (r + 1) * shard).
  int64_t bucket_numel(size_t b) const { return buckets_[b].numel; }
  bool bucket_persistent(size_t b) const { return buckets_[b].persistent; }
  int64_t bucket_shard(size_t b) const { return buckets_[b].shard; }
  size_t bucket_of(size_t param) const { return bucket_of_[param]; }
  int64_t offset_of(size_t param) const {
    return buckets_[bucket_of_[param]].offsets[slot_of_[param]];
  }
  /// Whether parameter k had a gradient on this rank in the last step.
  bool received_gradient(size_t k) const { return had_grad_[k]; }
  /// The memory node of the bucket buffers (BucketOptions::buffers).
  Device buffers() const { return opt_.buffers; }
  /// The communicator for that memory (what the constructor was given), which the collectives
  /// on the flat buffers of the sharded optimizer and the gatherer use too.
  Communicator& communicator() const { return comm_; }
  /// After reduce(): the whole reduced bucket (with gather) and this rank's shard of it. The
  /// memory stays valid between steps (keep_buffers, or the shard without it).
  const Array& reduced_bucket(size_t b) const;
  /// This rank's shard as an array (shard elements) and its offset in the array's buffer.
  Array reduced_shard(size_t b) const;

 private:
  struct Bucket {
    std::vector<size_t> params;  // in reverse parameter order
    std::vector<int64_t> offsets;
    int64_t numel = 0, shard = 0;  // shard: ceil(numel / world) elements per rank
    bool persistent = false;       // its parameters have at most persist_numel elements
    Array acc, recv;               // acc: shard * world elements; recv: the same
    Array shard_grad;              // without keep_buffers: the reduced shard (shard elements)
  };
  void ensure_acc(Bucket& b);
  void add_grad(size_t param, bool first);
  void add_values(size_t param, const Array& src);  // src: f32, contiguous, numel elements
  void on_node(const Node& node, int64_t start_ns, int64_t end_ns) override;
  // Bucket pipeline, under mu_: start the exchanges of complete buckets in order; sum the
  // exchanges that completed (wait: block for each in turn).
  void start_ready_buckets();
  void sum_exchanged(bool wait, double* waited);
  // Under mu_, with divisor_ set: divides the summed buckets' shards, frees their exchange
  // buffers and hands them to the listener (without gather; with it, reduce() does after the
  // all-gather).
  void finish_summed();
  // ProgressMode::thread: polls under mu_ until stop_progress() (which rethrows its error).
  void progress_loop();
  void stop_progress();

  std::vector<Tensor*> params_;
  Communicator& comm_;
  BucketOptions opt_;
  std::vector<Bucket> buckets_;
  std::vector<std::vector<size_t>> bucket_params_;
  std::vector<size_t> bucket_of_, slot_of_;  // per parameter
  std::vector<bool> had_grad_;
  // The step's pipeline state.
  std::mutex mu_;
  bool watching_ = false, watch_first_ = false;
  std::vector<bool> taken_;      // per parameter: its gradient is in the bucket
  std::vector<size_t> missing_;  // per bucket: parameters not yet taken
  size_t next_start_ = 0, next_sum_ = 0, next_finish_ = 0;
  int64_t divisor_ = 0;  // reduce()'s divisor once known (0: not yet)
  std::function<void(size_t)> listener_;
  std::vector<WorkPtr> exchange_;
  int64_t overlapped_ = 0;
  bool started_any_ = false;
  std::chrono::steady_clock::time_point first_start_;
  std::thread progress_thread_;
  std::atomic<bool> progress_stop_{false};
  std::exception_ptr progress_error_;
};

}  // namespace hetrain::distributed
