// GradReducer: buckets of gradients reduced over the ranks in a fixed order.
#include "hetrain/distributed/grad_reducer.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <utility>

#include "distributed/host_buffers.h"
#include "hetrain/base/error.h"
#include "hetrain/graph/ops.h"

namespace hetrain::distributed {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

}  // namespace

GradReducer::GradReducer(std::vector<Tensor*> params, Communicator& comm, BucketOptions opt)
    : params_(std::move(params)), comm_(comm), opt_(opt) {
  if (!(opt.bucket_mb > 0) || !(opt.first_bucket_mb > 0))
    fail("[ddp] bucket sizes must be positive, got --bucket-mb ", opt.bucket_mb, " (first bucket ",
         opt.first_bucket_mb, " MiB)");
  const int world = comm.size();
  const auto cap_of = [&](size_t bucket) {
    const double mb = bucket == 0 ? std::min(opt.first_bucket_mb, opt.bucket_mb) : opt.bucket_mb;
    return std::max<int64_t>(1, static_cast<int64_t>(mb * 1024 * 1024 / sizeof(float)));
  };
  bucket_of_.assign(params_.size(), 0);
  slot_of_.assign(params_.size(), 0);
  had_grad_.assign(params_.size(), false);
  taken_.assign(params_.size(), false);
  // Reverse parameter order: backward produces the last layers' gradients first. Persistent
  // parameters (persist_numel) fill buckets of their own, in the same order.
  size_t open[2] = {SIZE_MAX, SIZE_MAX};  // the bucket being filled: ordinary, persistent
  for (size_t k = params_.size(); k-- > 0;) {
    const Tensor& p = *params_[k];
    if (p.dtype() != Dtype::f32)
      fail("[ddp] parameter ", k, " is ", dtype_name(p.dtype()), "; data parallel needs f32");
    const int64_t n = p.numel();
    const bool persist = opt.persist_numel > 0 && n <= opt.persist_numel;
    size_t& cur = open[persist ? 1 : 0];
    if (cur == SIZE_MAX || (buckets_[cur].numel > 0 && buckets_[cur].numel + n > cap_of(cur))) {
      cur = buckets_.size();
      buckets_.emplace_back();
      buckets_.back().persistent = persist;
    }
    Bucket& b = buckets_[cur];
    bucket_of_[k] = cur;
    slot_of_[k] = b.params.size();
    b.params.push_back(k);
    b.offsets.push_back(b.numel);
    b.numel += n;
  }
  const int64_t mult = opt.shard_multiple;
  for (Bucket& b : buckets_) {
    b.shard = ((b.numel + world - 1) / world + mult - 1) / mult * mult;
    if (opt.keep_buffers)
      b.acc = flat_f32(b.shard * world, MemoryTag::gradients, opt_.buffers);
    else
      b.shard_grad = flat_f32(b.shard, MemoryTag::gradients, opt_.buffers);
    bucket_params_.push_back(b.params);
  }
  missing_.assign(buckets_.size(), 0);
}

GradReducer::~GradReducer() {
  if (watching_) remove_node_observer(this);
  if (progress_thread_.joinable()) {
    progress_stop_ = true;
    progress_thread_.join();
  }
}

void GradReducer::progress_loop() {
  try {
    while (!progress_stop_) {
      {
        std::lock_guard lock(mu_);
        sum_exchanged(false, nullptr);
      }
      // A short sleep leaves the lock and the cores to backward between polls.
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  } catch (...) {
    progress_error_ = std::current_exception();
  }
}

// Called without mu_ held (the loop takes it).
void GradReducer::stop_progress() {
  if (!progress_thread_.joinable()) return;
  progress_stop_ = true;
  progress_thread_.join();
  if (progress_error_) std::rethrow_exception(std::exchange(progress_error_, nullptr));
}

// Without keep_buffers the full buffer exists only during a step (a communication buffer).
void GradReducer::ensure_acc(Bucket& b) {
  if (!b.acc.has_data())
    b.acc = flat_f32(b.shard * comm_.size(), MemoryTag::communication, opt_.buffers);
}

const Array& GradReducer::reduced_bucket(size_t b) const {
  HT_ASSERT(opt_.gather && buckets_[b].acc.has_data());
  return buckets_[b].acc;
}

Array GradReducer::reduced_shard(size_t b) const {
  const Bucket& bk = buckets_[b];
  if (!opt_.keep_buffers) return bk.shard_grad;
  Array a = bk.acc;
  a.shape = {bk.shard};
  a.offset += comm_.rank() * bk.shard;
  return a;
}

void GradReducer::add_values(size_t k, const Array& src) {
  Bucket& b = buckets_[bucket_of_[k]];
  ensure_acc(b);
  const int64_t off = b.offsets[slot_of_[k]], n = params_[k]->numel();
  if (!had_grad_[k]) {
    copy_f32(b.acc, off, src, 0, n);
  } else {
    add_f32(b.acc, off, src, 0, n);  // micro-batch order
  }
  had_grad_[k] = true;
}

void GradReducer::add_grad(size_t k, bool first) {
  if (first) had_grad_[k] = false;
  const Tensor g = params_[k]->grad();
  if (!g.defined()) return;
  if (g.shape() != params_[k]->shape())
    fail("[ddp] gradient of parameter ", k, " has shape ", shape_str(g.shape()), ", the parameter ",
         shape_str(params_[k]->shape()));
  add_values(k, f32_array(g));
  params_[k]->zero_grad();
}

void GradReducer::set_bucket_listener(std::function<void(size_t)> listener) {
  std::lock_guard lock(mu_);
  listener_ = std::move(listener);
}

void GradReducer::overlap_next_backward(bool first, int64_t divisor) {
  if (!opt_.overlap) return;  // accumulate() takes the gradients after backward
  if (divisor < 0) fail("[ddp] overlap: divisor must be >= 0, got ", divisor);
  std::lock_guard lock(mu_);
  HT_ASSERT(!watching_);
  watch_first_ = first;
  if (first) std::fill(had_grad_.begin(), had_grad_.end(), false);
  std::fill(taken_.begin(), taken_.end(), false);
  for (size_t i = 0; i < buckets_.size(); ++i) missing_[i] = buckets_[i].params.size();
  next_start_ = next_sum_ = next_finish_ = 0;
  divisor_ = divisor;
  exchange_.clear();
  exchange_.resize(buckets_.size());
  overlapped_ = 0;
  started_any_ = false;
  watching_ = true;
  add_node_observer(this);
  if (opt_.progress == ProgressMode::thread) {
    progress_stop_ = false;
    progress_thread_ = std::thread([this] { progress_loop(); });
  }
}

// Runs on the executor's threads after each node: takes a parameter's gradient as soon as its
// node has run, starts complete buckets, and polls the exchanges in flight.
void GradReducer::on_node(const Node& node, int64_t, int64_t) {
  std::lock_guard lock(mu_);
  if (!watching_) return;
  for (size_t k = 0; k < params_.size(); ++k) {
    if (taken_[k]) continue;
    const Tensor& g = params_[k]->node()->grad;
    if (g.node() != &node) continue;
    const Array& a = node.outs[static_cast<size_t>(g.index())];
    // Other layouts, and memory other than the buffers' (a GPU's for host buffers, the host's
    // for a GPU's), are taken after backward (accumulate()); a sim device's memory is the
    // host's. On a GPU the sum is queued on its stream after the node's kernels.
    if (!a.has_data() || a.dtype != Dtype::f32 || !a.contiguous() ||
        !same_memory(a.device(), opt_.buffers) || a.shape != params_[k]->shape())
      continue;
    add_values(k, a);
    taken_[k] = true;
    --missing_[bucket_of_[k]];
  }
  const size_t before = next_start_;
  start_ready_buckets();
  overlapped_ += static_cast<int64_t>(next_start_ - before);
  if (opt_.progress == ProgressMode::executor) sum_exchanged(false, nullptr);
}

void GradReducer::start_ready_buckets() {
  CollectiveContext ctx = comm_.context();
  while (next_start_ < buckets_.size() && missing_[next_start_] == 0) {
    Bucket& b = buckets_[next_start_];
    ensure_acc(b);
    if (!b.recv.has_data())
      b.recv = flat_f32(b.shard * comm_.size(), MemoryTag::communication, opt_.buffers);
    // Parameters without a gradient here add zeros to the other ranks' sums.
    for (size_t s = 0; s < b.params.size(); ++s)
      if (!had_grad_[b.params[s]]) zero_f32(b.acc, b.offsets[s], params_[b.params[s]]->numel());
    if (!started_any_) first_start_ = Clock::now();
    started_any_ = true;
    ctx.what = "all_to_all of gradient bucket " + std::to_string(next_start_);
    comm_.set_context(ctx);
    exchange_[next_start_] = comm_.iall_to_all(b.acc.raw(), b.recv.raw(), b.shard, Dtype::f32);
    ++next_start_;
  }
}

void GradReducer::sum_exchanged(bool wait, double* waited) {
  const int world = comm_.size(), me = comm_.rank();
  while (next_sum_ < next_start_) {
    WorkPtr& w = exchange_[next_sum_];
    if (wait) {
      const auto w0 = Clock::now();
      w->wait();
      *waited += seconds_since(w0);
    } else if (!w->test()) {
      return;
    }
    // This rank's shard: blocks from ranks 0..N-1 summed in rank order (divided in reduce()).
    Bucket& b = buckets_[next_sum_];
    copy_f32(b.acc, me * b.shard, b.recv, 0, b.shard);
    for (int r = 1; r < world; ++r) add_f32(b.acc, me * b.shard, b.recv, r * b.shard, b.shard);
    ++next_sum_;
  }
  if (divisor_ > 0) finish_summed();
}

void GradReducer::finish_summed() {
  const float d = static_cast<float>(divisor_);
  const int me = comm_.rank();
  for (; next_finish_ < next_sum_; ++next_finish_) {
    Bucket& b = buckets_[next_finish_];
    scale_f32(b.acc, me * b.shard, b.shard, d, true);
    b.recv = Array{};           // the exchange's buffer lives only while the bucket is reduced
    if (opt_.gather) continue;  // reduce() all-gathers it, then hands it on
    if (!opt_.keep_buffers) {
      copy_f32(b.shard_grad, 0, b.acc, me * b.shard, b.shard);
      b.acc = Array{};
    }
    if (listener_) listener_(next_finish_);
  }
}

void GradReducer::accumulate(bool first) {
  stop_progress();
  std::lock_guard lock(mu_);
  if (watching_) {
    remove_node_observer(this);
    watching_ = false;
    // Gradients the executor's watch could not take (other layouts or devices).
    for (size_t k = params_.size(); k-- > 0;) {
      if (taken_[k]) {
        params_[k]->zero_grad();
        continue;
      }
      add_grad(k, false);
      taken_[k] = true;
      --missing_[bucket_of_[k]];
    }
    return;
  }
  for (size_t k = params_.size(); k-- > 0;) add_grad(k, first);
  // Not overlapped: every bucket starts in reduce().
  for (size_t i = 0; i < buckets_.size(); ++i) missing_[i] = 0;
  next_start_ = next_sum_ = next_finish_ = 0;
  divisor_ = 0;
  exchange_.clear();
  exchange_.resize(buckets_.size());
  overlapped_ = 0;
  started_any_ = false;
}

ReduceTimes GradReducer::reduce(int64_t divisor) {
  if (divisor < 1) fail("[ddp] reduce: divisor must be >= 1, got ", divisor);
  std::lock_guard lock(mu_);
  HT_ASSERT(!watching_);
  HT_ASSERT(divisor_ == 0 || divisor_ == divisor);
  const int me = comm_.rank();
  ReduceTimes t;
  t.overlapped_buckets = overlapped_;
  if (!started_any_) first_start_ = Clock::now();
  // Buckets summed from here on (and those summed before the divisor was known) are finished
  // as they come.
  divisor_ = divisor;
  finish_summed();
  start_ready_buckets();
  HT_ASSERT(next_start_ == buckets_.size());
  sum_exchanged(true, &t.exposed_comm_s);
  HT_ASSERT(next_finish_ == buckets_.size());
  divisor_ = 0;
  if (opt_.gather) {
    // Each rank's shard, copied out (MPI's buffers may not overlap), gathered into acc.
    std::vector<WorkPtr> gather(buckets_.size());
    std::vector<Array> mine(buckets_.size());
    CollectiveContext ctx = comm_.context();
    for (size_t i = 0; i < buckets_.size(); ++i) {
      Bucket& b = buckets_[i];
      mine[i] = flat_f32(b.shard, MemoryTag::communication, opt_.buffers);
      copy_f32(mine[i], 0, b.acc, me * b.shard, b.shard);
      ctx.what = "all_gather of gradient bucket " + std::to_string(i);
      comm_.set_context(ctx);
      gather[i] = comm_.iall_gather(mine[i].raw(), b.acc.raw(), b.shard, Dtype::f32);
    }
    for (size_t i = 0; i < buckets_.size(); ++i) {
      const auto w0 = Clock::now();
      gather[i]->wait();
      t.exposed_comm_s += seconds_since(w0);
    }
  }
  t.comm_s = seconds_since(first_start_);
  if (opt_.gather)
    for (size_t i = 0; i < buckets_.size(); ++i) {
      Bucket& b = buckets_[i];
      if (!opt_.keep_buffers) {
        copy_f32(b.shard_grad, 0, b.acc, me * b.shard, b.shard);
        b.acc = Array{};
      }
      if (listener_) listener_(i);
    }
  if (!opt_.install_grads) return t;
  HT_ASSERT(opt_.gather);
  for (size_t k = 0; k < params_.size(); ++k) {
    if (!had_grad_[k]) continue;
    const Bucket& b = buckets_[bucket_of_[k]];
    if (host_addressable(opt_.buffers)) {
      params_[k]->set_grad(
          from_blob(b.acc.data<float>() + b.offsets[slot_of_[k]], params_[k]->shape(), Dtype::f32));
    } else {  // a copy on the device, as from_blob copies on the host
      Array g = flat_f32(params_[k]->numel(), MemoryTag::gradients, opt_.buffers);
      copy_f32(g, 0, b.acc, b.offsets[slot_of_[k]], params_[k]->numel());
      g.shape = params_[k]->shape();
      g.strides = contiguous_strides(g.shape);
      params_[k]->set_grad(make_leaf(std::move(g)));
    }
  }
  return t;
}

}  // namespace hetrain::distributed
