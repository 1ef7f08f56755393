// GradReducer: buckets of gradients reduced over the ranks in a fixed order.
#include "hetrain/distributed/grad_reducer.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "hetrain/base/error.h"
#include "hetrain/graph/ops.h"

namespace hetrain::distributed {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

Array host_f32(int64_t n, MemoryTag tag) {
  Array a;
  a.shape = {n};
  a.dtype = Dtype::f32;
  a.tag = tag;
  a.allocate();
  if (n > 0) std::memset(a.raw(), 0, a.nbytes());
  return a;
}

/// A gradient's values as contiguous host f32 (a copy only when it is not already so).
struct HostGrad {
  Tensor holder;
  std::vector<float> copy;
  const float* data = nullptr;
};
HostGrad host_values(const Tensor& g) {
  HostGrad h;
  g.eval();
  const Array& a = g.array();
  if (a.dtype == Dtype::f32 && a.contiguous() && a.device().kind == DeviceKind::cpu) {
    h.holder = g;
    h.data = a.data<float>();
  } else {
    h.copy = g.to_vector<float>();
    h.data = h.copy.data();
  }
  return h;
}

}  // namespace

GradReducer::GradReducer(std::vector<Tensor*> params, Communicator& comm, BucketOptions opt)
    : params_(std::move(params)), comm_(comm) {
  if (!(opt.bucket_mb > 0) || !(opt.first_bucket_mb > 0))
    fail("[ddp] bucket sizes must be positive, got --bucket-mb ", opt.bucket_mb,
         " (first bucket ", opt.first_bucket_mb, " MiB)");
  const int world = comm.size();
  const auto cap_of = [&](size_t bucket) {
    const double mb = bucket == 0 ? std::min(opt.first_bucket_mb, opt.bucket_mb) : opt.bucket_mb;
    return std::max<int64_t>(1, static_cast<int64_t>(mb * 1024 * 1024 / sizeof(float)));
  };
  bucket_of_.assign(params_.size(), 0);
  slot_of_.assign(params_.size(), 0);
  had_grad_.assign(params_.size(), false);
  // Reverse parameter order: backward produces the last layers' gradients first.
  for (size_t k = params_.size(); k-- > 0;) {
    const Tensor& p = *params_[k];
    if (p.dtype() != Dtype::f32)
      fail("[ddp] parameter ", k, " is ", dtype_name(p.dtype()), "; data parallel needs f32");
    const int64_t n = p.numel();
    if (buckets_.empty() ||
        (buckets_.back().numel > 0 && buckets_.back().numel + n > cap_of(buckets_.size() - 1)))
      buckets_.emplace_back();
    Bucket& b = buckets_.back();
    bucket_of_[k] = buckets_.size() - 1;
    slot_of_[k] = b.params.size();
    b.params.push_back(k);
    b.offsets.push_back(b.numel);
    b.numel += n;
  }
  for (Bucket& b : buckets_) {
    b.shard = (b.numel + world - 1) / world;
    b.acc = host_f32(b.shard * world, MemoryTag::gradients);
    b.recv = host_f32(b.shard * world, MemoryTag::gradients);
    bucket_params_.push_back(b.params);
  }
}

void GradReducer::add_grad(size_t k, bool first) {
  if (first) had_grad_[k] = false;
  const Tensor g = params_[k]->grad();
  if (!g.defined()) return;
  if (g.shape() != params_[k]->shape())
    fail("[ddp] gradient of parameter ", k, " has shape ", shape_str(g.shape()),
         ", the parameter ", shape_str(params_[k]->shape()));
  Bucket& b = buckets_[bucket_of_[k]];
  float* dst = b.acc.data<float>() + b.offsets[slot_of_[k]];
  const HostGrad h = host_values(g);
  const int64_t n = g.numel();
  if (!had_grad_[k]) {
    std::memcpy(dst, h.data, static_cast<size_t>(n) * sizeof(float));
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i] += h.data[i];  // micro-batch order
  }
  had_grad_[k] = true;
  params_[k]->zero_grad();
}

void GradReducer::accumulate(bool first) {
  for (size_t k = params_.size(); k-- > 0;) add_grad(k, first);
}

ReduceTimes GradReducer::reduce(int64_t divisor) {
  if (divisor < 1) fail("[ddp] reduce: divisor must be >= 1, got ", divisor);
  const int world = comm_.size(), me = comm_.rank();
  const float d = static_cast<float>(divisor);
  ReduceTimes t;
  const auto t0 = Clock::now();
  // Parameters without a gradient here add zeros to the other ranks' sums.
  for (size_t k = 0; k < params_.size(); ++k)
    if (!had_grad_[k]) {
      Bucket& b = buckets_[bucket_of_[k]];
      std::memset(b.acc.data<float>() + b.offsets[slot_of_[k]], 0,
                  static_cast<size_t>(params_[k]->numel()) * sizeof(float));
    }
  std::vector<WorkPtr> exchange(buckets_.size()), gather(buckets_.size());
  CollectiveContext ctx = comm_.context();
  for (size_t i = 0; i < buckets_.size(); ++i) {
    ctx.what = "all_to_all of gradient bucket " + std::to_string(i);
    comm_.set_context(ctx);
    exchange[i] = comm_.iall_to_all(buckets_[i].acc.raw(), buckets_[i].recv.raw(),
                                    buckets_[i].shard, Dtype::f32);
  }
  for (size_t i = 0; i < buckets_.size(); ++i) {
    Bucket& b = buckets_[i];
    const auto w0 = Clock::now();
    exchange[i]->wait();
    t.exposed_comm_s += seconds_since(w0);
    // This rank's shard: blocks from ranks 0..N-1 summed in rank order, then divided.
    float* out = b.acc.data<float>() + me * b.shard;
    const float* in = b.recv.data<float>();
    std::memcpy(out, in, static_cast<size_t>(b.shard) * sizeof(float));
    for (int r = 1; r < world; ++r) {
      const float* blk = in + r * b.shard;
      for (int64_t j = 0; j < b.shard; ++j) out[j] += blk[j];
    }
    for (int64_t j = 0; j < b.shard; ++j) out[j] = out[j] / d;
    ctx.what = "all_gather of gradient bucket " + std::to_string(i);
    comm_.set_context(ctx);
    // The gathered shards land in recv (acc is the send buffer).
    gather[i] = comm_.iall_gather(out, b.recv.raw(), b.shard, Dtype::f32);
  }
  for (size_t i = 0; i < buckets_.size(); ++i) {
    const auto w0 = Clock::now();
    gather[i]->wait();
    t.exposed_comm_s += seconds_since(w0);
  }
  t.comm_s = seconds_since(t0);
  for (size_t k = 0; k < params_.size(); ++k) {
    if (!had_grad_[k]) continue;
    const Bucket& b = buckets_[bucket_of_[k]];
    params_[k]->set_grad(from_blob(b.recv.data<float>() + b.offsets[slot_of_[k]],
                                   params_[k]->shape(), Dtype::f32));
  }
  return t;
}

}  // namespace hetrain::distributed
