// Data-parallel gradient reduction with a fixed summation order, so that N ranks give the same
// bits as one process accumulating the same N micro-batches.
//
//   GradReducer reducer(model.parameters(), comm, {.bucket_mb = 25, .first_bucket_mb = 1});
//   for (int k = 0; k < K; ++k) {
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
#pragma once

#include <cstdint>
#include <vector>

#include "hetrain/distributed/communicator.h"
#include "hetrain/graph/tensor.h"
#include "hetrain/memory/array.h"

namespace hetrain::distributed {

struct BucketOptions {
  double bucket_mb = 25;       // MiB of f32 gradients per bucket
  double first_bucket_mb = 1;  // the first bucket (the last parameters), reduced soonest
};

/// Time spent on the reductions of one step.
struct ReduceTimes {
  double comm_s = 0;          // from the first bucket's start to the last one's completion
  double exposed_comm_s = 0;  // time the caller waited for collectives to complete
};

class GradReducer {
 public:
  /// params: the model's parameters in parameter order (f32). Throws for a bad size.
  GradReducer(std::vector<Tensor*> params, Communicator& comm, BucketOptions opt = {});

  /// Adds every parameter's gradient to its bucket (first: copies instead) and clears the
  /// gradients. A parameter without a gradient adds nothing.
  void accumulate(bool first);
  /// Reduces every bucket over the ranks, divides by divisor and installs the results as the
  /// parameters' gradients (on parameters that had one on this rank).
  ReduceTimes reduce(int64_t divisor);

  /// Bucket b's parameters (indices into params, in the bucket's order).
  const std::vector<std::vector<size_t>>& buckets() const { return bucket_params_; }

 private:
  struct Bucket {
    std::vector<size_t> params;  // in reverse parameter order
    std::vector<int64_t> offsets;
    int64_t numel = 0, shard = 0;  // shard: ceil(numel / world) elements per rank
    Array acc, recv;               // acc: shard * world elements; recv: the same
  };
  void add_grad(size_t param, bool first);

  std::vector<Tensor*> params_;
  Communicator& comm_;
  std::vector<Bucket> buckets_;
  std::vector<std::vector<size_t>> bucket_params_;
  std::vector<size_t> bucket_of_, slot_of_;  // per parameter
  std::vector<bool> had_grad_;
};

}  // namespace hetrain::distributed
