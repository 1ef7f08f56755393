// ZeRO stages 0-3 over the GradReducer's flat bucket layout: one mechanism, the stage a policy.
//
//   GradReducer reducer(model.parameters(), comm, ShardedOptimizer::bucket_options(stage, 25));
//   ShardedOptimizer opt(model.named_parameters(), reducer, comm, stage, make_adamw, &loaded);
//   ... forward/backward, reducer.accumulate(), reducer.reduce(N * K) ...
//   opt.clip_grad_norm(1.0);   // fixed chunks, summed in a fixed order
//   opt.step();                // this rank's shard, then the updated shards all-gathered
//   opt.zero_grad();
//
// The model's parameters become views into contiguous flat buffers, one per gradient bucket
// (the bucket's parameters at their offsets, padded to shard * N elements). The optimizer
// works on one "shard parameter" per bucket, a view of the elements this rank owns, with the
// reduced gradients as its gradient:
//   stage 0  every rank owns the whole bucket; gradients all-gathered (plain data parallel);
//   stage 1  rank r owns elements [r * shard, (r + 1) * shard) and keeps their optimizer state;
//            the full gradient buffer stays (it accumulates the micro-batches);
//   stage 2  as 1, and the full gradient buffer exists only during the step: a rank keeps
//            only its shard of the reduced gradients;
//   stage 3  as 2, and the flat buffers hold only this rank's shard: the model's parameters
//            are leaves without data that the ParamGatherer (distributed/param_gatherer.h)
//            all-gathers, bucket by bucket, just before the nodes that read them, and frees
//            after (forward and backward alike); the gradients are reduced after backward.
// After the update the owned shards are all-gathered into the flat parameters (not at stage
// 3: the next eval gathers what it reads). Every
// optimizer update is elementwise, so each element sees the same operations in every stage;
// the global norm for clipping is the sum of fixed chunks of kNormChunk elements (shards are
// padded to a multiple of it), each chunk's squares summed in f64 in element order and the
// chunks in (bucket, position) order: the same number in every stage and at every rank count.
//
// Updates go bucket by bucket, in bucket order, and each bucket's new values go back into the
// flat parameters (an all-gather in flight, or a copy) while the next bucket is updated.
// Streaming (stream_next_step(), which the trainer arms under offload): stages 1-2 reduce each
// bucket during backward (GradReducer::overlap_next_backward with the divisor), and the bucket
// listener hands it at once to a worker thread that runs its update on the optimizer's home (the
// host) while backward produces the next buckets; the gradients cross to the host per bucket,
// as the update's copy tasks read them. The new values wait in a host staging buffer (tag
// communication) until step(), since backward may still read the old parameters (dX = dY W
// after dW), and go back to the device there, bucket by bucket. Clipping by global norm and the
// grad scaler's inf/NaN check need every gradient before any update, so with either the trainer
// does not stream: the updates then run in step(), after the norm, in the same per-bucket order.
// The bits are the same either way (each update is elementwise; the same kernels on the same
// values).
#pragma once

#include <array>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "hetrain/distributed/communicator.h"
#include "hetrain/distributed/grad_reducer.h"
#include "hetrain/memory/allocator.h"
#include "hetrain/training/checkpoint_piece.h"
#include "hetrain/training/optim.h"

namespace hetrain::distributed {

/// Elements per chunk of the clipping norm.
inline constexpr int64_t kNormChunk = 1024;

/// The optimizer that updates the shard parameters (AdamW, SGD: any elementwise update).
using OptimizerFactory =
    std::function<std::unique_ptr<optim::Optimizer>(optim::NamedParams params)>;

class ParamGatherer;

/// Where the model states live (a policy over the same flat buffers; the trainer derives it from
/// --state-device and --offload): each is the host or the state device. The collectives on the
/// flat buffers run on the reducer's communicator (GradReducer::communicator), the one for the
/// state device's memory: the run's own for host memory (the CPU, a sim device, read in place),
/// NCCL for a GPU (whose sums run on its stream); what lives elsewhere (offloaded parameter
/// shards, the host's new values) is copied to that memory for a collective. The host-side
/// collectives (the clipping norm's chunks, the overflow flag, state_dict) use `comm`.
///   no offload                  everything on the state device (the host without one)
///   --offload optimizer         the optimizer state (and the step, run by the trainer) on the host
///   --offload optimizer+params  stage 3: the parameter shards on the host too; the buckets
///                               gathered for the nodes that read them still go to the device
/// The gradients' home is the reducer's (BucketOptions::buffers).
struct StateHomes {
  Device parameters = Device::cpu();  // the flat parameter buffers (stage 3: this rank's shards)
  Device optimizer = Device::cpu();   // the optimizer state: counted in model_state_bytes()
  Device gathered = Device::cpu();    // stage 3: the whole buckets the gatherer all-gathers
};

class ShardedOptimizer final : public optim::Optimizer {
 public:
  /// The reducer's options for a stage (bucket sizes in MiB as GradReducer's).
  /// persist_numel: stage 3 keeps parameters of at most this many elements whole, in buckets of
  /// their own with stage 2's layout (0: none).
  static BucketOptions bucket_options(int stage, double bucket_mb, double first_bucket_mb = 1,
                                      int64_t persist_numel = 0);

  /// params: the model's named parameters, in the order the reducer was given them. loaded:
  /// an optimizer over the same parameters whose state (a checkpoint's) is taken over, or null.
  /// homes: where the parameters live and stage 3 gathers them (StateHomes).
  ShardedOptimizer(optim::NamedParams params, GradReducer& reducer, Communicator& comm, int stage,
                   const OptimizerFactory& make, const optim::Optimizer* loaded,
                   StateHomes homes = {});
  ~ShardedOptimizer() override;

  void step() override;
  const char* name() const override { return inner_->name(); }
  void zero_grad() override;
  double clip_grad_norm(double max_norm) override;
  /// Stages 1-2: the logical or of every rank's answer (an all-reduce), since each rank checks
  /// only its shard of the gradients.
  bool any_nonfinite(bool local) override;
  /// Per model parameter ("exp_avg.<param>", ...), gathered from every rank's shard.
  std::map<std::string, Tensor> state_dict() const override;
  void load_state_dict(const std::map<std::string, Tensor>& state, int64_t steps) override;

  /// This rank's part of a sharded checkpoint (training/checkpoint.h): elements
  /// [rank * shard, (rank + 1) * shard) of every bucket, as pieces of the model's parameters
  /// (part "model") and of their optimizer state (part "train_state", named as state_dict()
  /// names them). Every rank's pieces together cover each tensor once, at any stage.
  std::vector<training::checkpoint::Piece> checkpoint_pieces() const;
  /// The tensors of the optimizer state those pieces make up: name -> layout (f32, the
  /// parameter's shape), as state_dict() would return them.
  std::map<std::string, training::checkpoint::TensorLayout> state_layout() const;

  /// Offload: updates the next step's buckets as the reducer finishes them, during backward, on
  /// a worker thread (on homes.optimizer). Call after set_lr and before the step's last backward;
  /// step() ends it and must follow (another stream before it is an error). Returns whether it
  /// streams (stages 1-2, whose buckets are reduced during backward; then give the reducer the
  /// divisor in overlap_next_backward).
  bool stream_next_step();
  /// Buckets the last step's stream updated before step() was called.
  int64_t streamed_buckets() const { return streamed_last_; }
  /// Buckets updated so far in this step (safe from any thread: tests watch it during backward).
  int64_t buckets_updated() const;

  int stage() const { return stage_; }
  /// Whether step() reads the allocators' statistics for model_state_bytes() (off by default:
  /// every home device's statistics, every step; the trainer turns it on for a JSON log).
  void measure_model_states(bool on) { measure_model_states_ = on; }
  /// Bytes by memory tag live on this rank just before an optimizer update (the model states'
  /// moment), the largest seen since construction while measured (zeros unless
  /// measure_model_states): the host's and the homes' devices' together.
  const std::array<int64_t, kNumMemoryTags>& model_state_bytes() const { return at_update_; }
  /// The part of model_state_bytes() on the state device (zeros when the homes are the host).
  const std::array<int64_t, kNumMemoryTags>& device_model_state_bytes() const {
    return at_update_device_;
  }
  /// Elements of padding in the flat buffers (all buckets, shard * N - numel).
  int64_t padding() const;
  /// Elements of the buckets kept whole under stage 3 (persistent parameters and their padding).
  int64_t persistent_elements() const;
  /// Stage 3: gathers every bucket once more and makes the parameters ordinary views of the
  /// whole buckets again (for what reads them after training: evaluation, export); no update
  /// may follow. A no-op at other stages.
  void unshard_parameters();
  /// Stage 3: the gatherer (null at other stages or once unsharded).
  const ParamGatherer* gatherer() const { return gatherer_.get(); }

 private:
  void attach_grads();
  void take_model_state_bytes();
  struct Stream;  // the streaming worker (sharded_optimizer.cpp)
  // The reducer's bucket listener while streaming (under the reducer's lock).
  void bucket_ready(size_t b);
  void stream_loop();
  // Ends the stream (the worker finishes its bucket) and rethrows the worker's error.
  void stop_stream();
  // The inner optimizer's update of bucket b; staged: its new values into staged_[b], and
  // shard_[b] a view of the flat buffer again (backward may still read the flat buffer).
  void update_bucket(size_t b, bool staged);
  // The element range of bucket b this rank updates.
  int64_t own_begin(size_t b) const;
  int64_t own_count(size_t b) const;
  // The element of bucket b where flat_[b] starts (stage 3: this rank's shard; else 0).
  int64_t flat_base(size_t b) const;
  // Stage 3 and not a persistent bucket: the flat buffer holds only the shard.
  bool sharded_bucket(size_t b) const;

  optim::NamedParams model_params_;
  GradReducer& reducer_;
  Communicator& comm_;
  int stage_;
  StateHomes homes_;
  std::vector<Array> flat_;    // per bucket: the parameters, shard * N elements
  std::vector<Tensor> shard_;  // per bucket: the view this rank updates
  std::unique_ptr<optim::Optimizer> inner_;
  std::array<int64_t, kNumMemoryTags> at_update_{};
  std::array<int64_t, kNumMemoryTags> at_update_device_{};
  bool measure_model_states_ = false;
  std::unique_ptr<ParamGatherer> gatherer_;  // stage 3
  std::unique_ptr<Stream> stream_;
  std::vector<Array> staged_;  // per bucket: a streamed update's new values until step()
  int64_t streamed_last_ = 0;
};

}  // namespace hetrain::distributed
