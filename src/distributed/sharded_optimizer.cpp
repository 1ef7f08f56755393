// ShardedOptimizer: ZeRO stages 0-2 on flat bucket buffers.
#include "hetrain/distributed/sharded_optimizer.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <set>
#include <thread>
#include <utility>

#include "distributed/host_buffers.h"
#include "hetrain/base/error.h"
#include "hetrain/base/thread_pool.h"
#include "hetrain/distributed/param_gatherer.h"
#include "hetrain/graph/ops.h"
#include "hetrain/runtime/eval.h"

namespace hetrain::distributed {

namespace {

/// A leaf tensor over elements [off, off + numel(shape)) of a flat f32 array (no copy).
Tensor view_leaf(const Array& flat, int64_t off, const Shape& shape, bool requires_grad) {
  Array a;
  a.shape = shape;
  a.dtype = Dtype::f32;
  a.tag = flat.tag;
  a.view_of(flat, contiguous_strides(shape), flat.offset + off);
  Tensor t = make_leaf(std::move(a));
  if (requires_grad) t.requires_grad_(true);
  return t;
}

/// A parameter leaf without data (stage 3): the gatherer gives it data while it is read, on
/// `home` (the node's device, where the scheduler runs what reads it).
Tensor sharded_leaf(const Shape& shape, Device home) {
  Array a;
  a.shape = shape;
  a.dtype = Dtype::f32;
  a.tag = MemoryTag::parameters;
  a.strides = contiguous_strides(shape);
  Tensor t = make_leaf(std::move(a));
  t.node()->sharded = true;
  t.node()->device = home;
  t.requires_grad_(true);
  return t;
}

std::string shard_name(size_t b) { return "zero_bucket_" + std::to_string(b); }

}  // namespace

// The stream's worker lives as long as the optimizer; between steps it sleeps.
struct ShardedOptimizer::Stream {
  std::mutex mu;
  std::condition_variable wake;   // the worker: a bucket is ready, or quit
  std::condition_variable idle;   // step(): the worker finished its bucket
  std::deque<size_t> ready;       // buckets whose gradients are final, not yet taken
  std::vector<char> updated;      // per bucket: updated in this step
  std::atomic<int64_t> count{0};  // buckets updated in this step
  int64_t streamed = 0;           // of them, by the worker
  bool armed = false, busy = false, quit = false;
  std::exception_ptr error;
  std::thread worker;
};

BucketOptions ShardedOptimizer::bucket_options(int stage, double bucket_mb, double first_bucket_mb,
                                               int64_t persist_numel) {
  if (stage < 0 || stage > 3) fail("[zero] stage must be 0, 1, 2 or 3, got ", stage);
  BucketOptions o;
  o.bucket_mb = bucket_mb;
  o.first_bucket_mb = first_bucket_mb;
  o.gather = stage == 0;
  o.keep_buffers = stage < 2;
  o.install_grads = false;
  // Stage 3's gathers are the only collectives during backward, so that every rank issues
  // them in the same order; the gradients are reduced after it.
  o.overlap = stage < 3;
  if (persist_numel < 0)
    fail("[zero] param-persistence-threshold must be >= 0, got ", persist_numel);
  o.persist_numel = stage == 3 ? persist_numel : 0;
  // Shards hold whole norm chunks, so a rank's chunks are the same as stage 0's.
  o.shard_multiple = stage == 0 ? 1 : kNormChunk;
  return o;
}

ShardedOptimizer::ShardedOptimizer(optim::NamedParams params, GradReducer& reducer,
                                   Communicator& comm, int stage, const OptimizerFactory& make,
                                   const optim::Optimizer* loaded, StateHomes homes)
    : Optimizer({}, 0.0),
      model_params_(std::move(params)),
      reducer_(reducer),
      comm_(comm),
      stage_(stage),
      homes_(homes),
      stream_(std::make_unique<Stream>()) {
  if (stage < 0 || stage > 3) fail("[zero] stage must be 0, 1, 2 or 3, got ", stage);
  const size_t nb = reducer.buckets().size();
  // The parameters move into the flat buffers and become views of them (stage 3: the flat
  // buffers hold this rank's shard, and the parameters become leaves the gatherer fills).
  flat_.resize(nb);
  for (size_t b = 0; b < nb; ++b)
    flat_[b] = flat_f32(reducer.bucket_shard(b) * (sharded_bucket(b) ? 1 : comm.size()),
                        MemoryTag::parameters, homes.parameters);
  std::vector<ParamGatherer::Bucket> gathered(stage == 3 ? nb : 0);
  for (size_t k = 0; k < model_params_.size(); ++k) {
    Tensor& p = *model_params_[k].second;
    if (p.dtype() != Dtype::f32)
      fail("[zero] parameter '", model_params_[k].first, "' is ", dtype_name(p.dtype()),
           "; the sharded optimizer needs f32 parameters");
    const Array v = f32_array(p);
    const size_t b = reducer.bucket_of(k);
    const int64_t off = reducer.offset_of(k), base = flat_base(b);
    // The parameter's elements that fall in the flat buffer.
    const int64_t lo = std::max(off, base), hi = std::min(off + p.numel(), base + flat_[b].numel());
    if (lo < hi) copy_f32(flat_[b], lo - base, v, lo - off, hi - lo);
    if (sharded_bucket(b)) {
      p = sharded_leaf(p.shape(), homes.gathered);
      gathered[b].leaves.emplace_back(p.node(), off);
    } else {
      p = view_leaf(flat_[b], off, p.shape(), true);
    }
  }
  shard_.resize(nb);
  optim::NamedParams shard_params;
  for (size_t b = 0; b < nb; ++b) {
    shard_[b] = view_leaf(flat_[b], own_begin(b) - flat_base(b), {own_count(b)}, true);
    shard_params.emplace_back(shard_name(b), &shard_[b]);
  }
  if (stage == 3) {
    // A persistent bucket's entry has no leaves: nothing reads it.
    for (size_t b = 0; b < nb; ++b) gathered[b].shard = flat_[b];
    gatherer_ = std::make_unique<ParamGatherer>(reducer.communicator(), std::move(gathered),
                                                homes.gathered);
  }
  inner_ = make(shard_params);
  params_ = shard_params;
  lr_ = inner_->lr();
  if (loaded) {
    lr_ = loaded->lr();
    load_state_dict(loaded->state_dict(), loaded->steps());
  }
  attach_grads();
  stream_->updated.assign(nb, 0);
  staged_.resize(nb);
}

// The reducer may be gone (the trainer's dies first): only the worker is ended here.
ShardedOptimizer::~ShardedOptimizer() {
  {
    std::lock_guard lk(stream_->mu);
    stream_->quit = true;
  }
  stream_->wake.notify_all();
  if (stream_->worker.joinable()) stream_->worker.join();
}

int64_t ShardedOptimizer::buckets_updated() const { return stream_->count.load(); }

bool ShardedOptimizer::stream_next_step() {
  if (stage_ != 1 && stage_ != 2) return false;
  stop_stream();
  if (stream_->count > 0)
    fail("[zero] a streamed step's updates were not completed by step() before the next stream");
  inner_->set_lr(lr_);
  {
    std::lock_guard lk(stream_->mu);
    stream_->armed = true;
  }
  reducer_.set_bucket_listener([this](size_t b) { bucket_ready(b); });
  if (!stream_->worker.joinable()) stream_->worker = std::thread([this] { stream_loop(); });
  return true;
}

void ShardedOptimizer::bucket_ready(size_t b) {
  // A bucket with a parameter that had no gradient is left to step(), which refuses it.
  for (size_t k : reducer_.buckets()[b])
    if (!reducer_.received_gradient(k)) return;
  {
    std::lock_guard lk(stream_->mu);
    if (!stream_->armed) return;
    stream_->ready.push_back(b);
  }
  stream_->wake.notify_one();
}

void ShardedOptimizer::stream_loop() {
  Stream& s = *stream_;
  SerialScope serial;  // one core: backward keeps the pool
  DeviceScope on(homes_.optimizer);
  for (;;) {
    size_t b = 0;
    {
      std::unique_lock lk(s.mu);
      s.wake.wait(lk, [&] { return s.quit || (s.armed && !s.ready.empty()); });
      if (s.quit) return;
      b = s.ready.front();
      s.ready.pop_front();
      s.busy = true;
    }
    std::exception_ptr error;
    try {
      update_bucket(b, true);
    } catch (...) {
      error = std::current_exception();
    }
    {
      std::lock_guard lk(s.mu);
      s.busy = false;
      if (error) {
        s.error = error;
        s.armed = false;  // step() updates what is left, and rethrows
      } else {
        s.updated[b] = 1;
        ++s.streamed;
        ++s.count;
      }
    }
    s.idle.notify_all();
  }
}

void ShardedOptimizer::stop_stream() {
  Stream& s = *stream_;
  std::exception_ptr error;
  {
    std::unique_lock lk(s.mu);
    s.armed = false;
    s.ready.clear();  // step() takes what the worker did not
    s.idle.wait(lk, [&] { return !s.busy; });
    error = std::exchange(s.error, nullptr);
  }
  reducer_.set_bucket_listener(nullptr);
  if (error) std::rethrow_exception(error);
}

void ShardedOptimizer::update_bucket(size_t b, bool staged) {
  const Device node = flat_[b].device();
  if (host_addressable(homes_.optimizer) && !host_addressable(node)) {
    // Offload from a GPU: the shard and its gradient cross to the host once each, into
    // page-locked copies that the host's optimizer reads (host memory it reads in place).
    const int64_t n = own_count(b);
    Array values = staging_f32(n, MemoryTag::communication, node);
    copy_f32(values, 0, flat_[b], own_begin(b) - flat_base(b), n);
    Tensor host = make_leaf(std::move(values));
    host.requires_grad_(true);
    if (const Tensor g = shard_[b].grad(); g.defined()) {
      Array grad = staging_f32(n, MemoryTag::communication, node);
      copy_f32(grad, 0, f32_array(g), 0, n);
      host.set_grad(make_leaf(std::move(grad)));
    }
    shard_[b] = host;
  }
  inner_->update({b});
  if (!staged) return;
  // The new values wait in host memory (page-locked for a GPU: step() copies them without
  // staging).
  staged_[b] = staging_f32(own_count(b), MemoryTag::communication, node);
  copy_f32(staged_[b], 0, f32_array(shard_[b]), 0, own_count(b));
  shard_[b] = view_leaf(flat_[b], own_begin(b) - flat_base(b), {own_count(b)}, true);
}

int64_t ShardedOptimizer::own_begin(size_t b) const {
  return stage_ == 0 ? 0 : comm_.rank() * reducer_.bucket_shard(b);
}

bool ShardedOptimizer::sharded_bucket(size_t b) const {
  return stage_ == 3 && !reducer_.bucket_persistent(b);
}

int64_t ShardedOptimizer::flat_base(size_t b) const {
  return sharded_bucket(b) ? comm_.rank() * reducer_.bucket_shard(b) : 0;
}

int64_t ShardedOptimizer::persistent_elements() const {
  int64_t n = 0;
  for (size_t b = 0; b < flat_.size(); ++b)
    if (stage_ == 3 && !sharded_bucket(b)) n += reducer_.bucket_shard(b) * comm_.size();
  return n;
}

void ShardedOptimizer::unshard_parameters() {
  if (!gatherer_) return;
  gatherer_.reset();
  for (size_t b = 0; b < flat_.size(); ++b) {
    if (!sharded_bucket(b)) continue;  // already whole
    // On the collectives' memory (the host for host memory, as before the GPU's).
    Communicator& fc = reducer_.communicator();
    const Device node = reducer_.buffers();
    Array full = flat_f32(reducer_.bucket_shard(b) * comm_.size(), MemoryTag::parameters,
                          host_addressable(node) ? Device::cpu() : node);
    const Array send = on_node(flat_[b], own_count(b), node);
    CollectiveContext ctx = comm_.context();
    ctx.what = "all_gather of parameter bucket " + std::to_string(b) + " (unsharding)";
    fc.set_context(ctx);
    fc.all_gather(send.raw(), full.raw(), own_count(b), Dtype::f32);
    for (size_t k : reducer_.buckets()[b]) {
      Tensor& p = *model_params_[k].second;
      p = view_leaf(full, reducer_.offset_of(k), p.shape(), true);
    }
  }
}

int64_t ShardedOptimizer::own_count(size_t b) const {
  return stage_ == 0 ? reducer_.bucket_shard(b) * comm_.size() : reducer_.bucket_shard(b);
}

int64_t ShardedOptimizer::padding() const {
  int64_t pad = 0;
  for (size_t b = 0; b < flat_.size(); ++b)
    pad += reducer_.bucket_shard(b) * comm_.size() - reducer_.bucket_numel(b);
  return pad;
}

void ShardedOptimizer::attach_grads() {
  for (size_t b = 0; b < shard_.size(); ++b) {
    Array g = stage_ == 0 ? reducer_.reduced_bucket(b) : reducer_.reduced_shard(b);
    shard_[b].set_grad(make_leaf(std::move(g)));
  }
}

void ShardedOptimizer::zero_grad() {
  for (Tensor& s : shard_) s.zero_grad();
  attach_grads();
}

double ShardedOptimizer::clip_grad_norm(double max_norm) {
  NoGradScope ng;
  // This rank's chunks, bucket by bucket in element order.
  std::vector<double> partial;
  std::vector<size_t> base(shard_.size());
  for (size_t b = 0; b < shard_.size(); ++b) {
    base[b] = partial.size();
    const int64_t n = own_count(b), chunks = (n + kNormChunk - 1) / kNormChunk;
    partial.resize(partial.size() + static_cast<size_t>(chunks), 0.0);
    const Tensor g = shard_[b].grad();
    if (!g.defined()) continue;
    const HostValues v = host_values(g);
    double* out = partial.data() + base[b];
    const float* x = v.data;
    parallel_for(chunks, 1, [=](int64_t lo, int64_t hi) {
      for (int64_t c = lo; c < hi; ++c) {
        double s = 0;
        const int64_t end = std::min(n, (c + 1) * kNormChunk);
        for (int64_t i = c * kNormChunk; i < end; ++i)
          s += static_cast<double>(x[i]) * static_cast<double>(x[i]);
        out[c] = s;
      }
    });
  }
  // The chunks in (bucket, position) order: under stages 1-2 rank r's chunks of a bucket come
  // after rank r-1's, which is where stage 0 has them.
  double total = 0;
  const int world = comm_.size();
  if (stage_ == 0 || world == 1) {
    for (double s : partial) total += s;
  } else {
    std::vector<double> all(partial.size() * static_cast<size_t>(world));
    CollectiveContext ctx = comm_.context();
    ctx.what = "all_gather of the gradient norm's chunks";
    comm_.set_context(ctx);
    comm_.all_gather(partial.data(), all.data(), static_cast<int64_t>(partial.size()), Dtype::f64);
    for (size_t b = 0; b < shard_.size(); ++b) {
      const size_t count = (b + 1 < shard_.size() ? base[b + 1] : partial.size()) - base[b];
      for (int r = 0; r < world; ++r)
        for (size_t c = 0; c < count; ++c) total += all[r * partial.size() + base[b] + c];
    }
  }
  const double norm = std::sqrt(total);
  const double coef = max_norm / (norm + 1e-6);
  if (coef < 1.0) {
    // In place on the reduced gradients (a copy only for gradients elsewhere, e.g. unscaled).
    const float c = static_cast<float>(coef);
    for (Tensor& s : shard_) {
      const Tensor g = s.grad();
      if (!g.defined()) continue;
      g.eval();
      const Array& a = g.array();
      if (a.dtype == Dtype::f32 && a.contiguous() && a.device().kind == DeviceKind::cpu) {
        float* x = a.data<float>();
        parallel_for(a.numel(), 1 << 14, [=](int64_t lo, int64_t hi) {
          for (int64_t i = lo; i < hi; ++i) x[i] = x[i] * c;
        });
      } else if (a.dtype == Dtype::f32 && a.contiguous() && !host_addressable(a.device())) {
        scale_f32(a, 0, a.numel(), c, false);  // on the GPU's stream, the same rounding
      } else {
        std::vector<float> v = g.to_vector<float>();
        for (float& x : v) x = x * c;
        s.set_grad(from_vector(v, g.shape()).eval());
      }
    }
  }
  return norm;
}

bool ShardedOptimizer::any_nonfinite(bool local) {
  if (stage_ == 0 || comm_.size() == 1) return local;  // every rank has every gradient
  int32_t flag = local ? 1 : 0;
  CollectiveContext ctx = comm_.context();
  ctx.what = "all_reduce of the gradients' overflow flag";
  comm_.set_context(ctx);
  comm_.all_reduce(&flag, 1, Dtype::i32, ReduceOp::max);
  return flag != 0;
}

// The model states' moment: parameters, reduced gradients and optimizer state all live, on the
// host and on the devices they call home.
void ShardedOptimizer::take_model_state_bytes() {
  std::array<int64_t, kNumMemoryTags> on_devices{};
  std::vector<Device> counted{Device::cpu()};
  for (Device d : {homes_.parameters, homes_.optimizer, homes_.gathered, reducer_.buffers()})
    if (std::find(counted.begin(), counted.end(), d) == counted.end()) {
      counted.push_back(d);
      const MemoryStats st = allocator_for(d).stats();
      for (size_t t = 0; t < on_devices.size(); ++t) on_devices[t] += st.current[t];
    }
  MemoryStats host = host_allocator().stats();
  if (!host_addressable(reducer_.buffers())) {  // host copies in page-locked memory
    const MemoryStats pinned = staging_allocator(reducer_.buffers()).stats();
    for (size_t t = 0; t < host.current.size(); ++t) host.current[t] += pinned.current[t];
  }
  for (size_t t = 0; t < at_update_.size(); ++t) {
    at_update_[t] = std::max(at_update_[t], host.current[t] + on_devices[t]);
    at_update_device_[t] = std::max(at_update_device_[t], on_devices[t]);
  }
}

void ShardedOptimizer::step() {
  stop_stream();
  for (size_t k = 0; k < model_params_.size(); ++k)
    if (!reducer_.received_gradient(k))
      fail("[zero] parameter '", model_params_[k].first,
           "' received no gradient in this step; the sharded optimizer updates whole buckets "
           "and needs a gradient for every parameter");
  if (measure_model_states_) take_model_state_bytes();
  inner_->set_lr(lr_);
  // Bucket by bucket: what the stream did not update is updated here, and each bucket's new
  // values go into the flat parameters (every rank's shard, gathered) while the next one is.
  Stream& s = *stream_;
  // The all-gathers run on the collectives' memory (the reducer's): what is elsewhere (the
  // host's new values for a GPU's buffers, parameters offloaded to the host) is copied there.
  Communicator& fc = reducer_.communicator();
  const Device node = reducer_.buffers();
  std::vector<Array> sends(shard_.size()), recvs(shard_.size());
  std::vector<WorkPtr> works(shard_.size());
  CollectiveContext ctx = comm_.context();
  for (size_t b = 0; b < shard_.size(); ++b) {
    if (sharded_bucket(b) && !gatherer_)
      fail("[zero] an update after the parameters were unsharded");
    Array fresh;
    if (s.updated[b]) {
      fresh = staged_[b];
    } else {
      update_bucket(b, false);
      ++s.count;
      fresh = f32_array(shard_[b]);
    }
    if (stage_ == 0 || sharded_bucket(b)) {  // the flat buffer is what this rank updates
      copy_f32(flat_[b], 0, fresh, 0, own_count(b));
      continue;
    }
    sends[b] = on_node(fresh, own_count(b), node);
    recvs[b] = same_memory(flat_[b].device(), node)
                   ? flat_[b]
                   : flat_f32(flat_[b].numel(), MemoryTag::communication, node);
    ctx.what = "all_gather of parameter bucket " + std::to_string(b);
    fc.set_context(ctx);
    works[b] = fc.iall_gather(sends[b].raw(), recvs[b].raw(), own_count(b), Dtype::f32);
  }
  for (size_t b = 0; b < shard_.size(); ++b) {
    if (works[b]) works[b]->wait();
    if (works[b] && recvs[b].buffer != flat_[b].buffer)
      copy_f32(flat_[b], 0, recvs[b], 0, flat_[b].numel());
    shard_[b] = view_leaf(flat_[b], own_begin(b) - flat_base(b), {own_count(b)}, true);
    staged_[b] = Array{};
  }
  streamed_last_ = std::exchange(s.streamed, 0);
  std::fill(s.updated.begin(), s.updated.end(), 0);
  s.count = 0;
  inner_->count_step();
  // The parameters are views of the flat buffers just written: their copies on other devices
  // (a GPU's or a sim device's, for the nodes the scheduler placed there) hold last step's
  // values.
  for (const auto& [name, p] : model_params_) values_changed(*p);
  ++steps_;
}

std::map<std::string, Tensor> ShardedOptimizer::state_dict() const {
  std::map<std::string, Tensor> out;
  const int world = comm_.size();
  for (const auto& [key, t] : inner_->state_dict()) {
    const std::string slot = key.substr(0, key.find('.'));
    const std::string bname = key.substr(key.find('.') + 1);
    size_t b = 0;
    while (b < shard_.size() && shard_name(b) != bname) ++b;
    HT_ASSERT(b < shard_.size());
    const HostValues v = host_values(t);
    std::vector<float> full(static_cast<size_t>(reducer_.bucket_shard(b) * world));
    if (stage_ == 0) {
      std::memcpy(full.data(), v.data, full.size() * 4);
    } else {
      CollectiveContext ctx = comm_.context();
      ctx.what = "all_gather of optimizer state " + key;
      comm_.set_context(ctx);
      comm_.all_gather(v.data, full.data(), own_count(b), Dtype::f32);
    }
    for (size_t k : reducer_.buckets()[b]) {
      const Tensor& p = *model_params_[k].second;
      out[slot + "." + model_params_[k].first] =
          from_blob(full.data() + reducer_.offset_of(k), p.shape(), Dtype::f32).eval();
    }
  }
  return out;
}

std::vector<training::checkpoint::Piece> ShardedOptimizer::checkpoint_pieces() const {
  std::vector<training::checkpoint::Piece> out;
  const std::map<std::string, Tensor> state = inner_->state_dict();
  for (size_t b = 0; b < shard_.size(); ++b) {
    const int64_t lo = comm_.rank() * reducer_.bucket_shard(b), hi = lo + reducer_.bucket_shard(b);
    // The state slots of this bucket's shard ("exp_avg", ...), over [own_begin, + own_count).
    std::vector<std::pair<std::string, HostValues>> slots;
    for (const auto& [key, t] : state)
      if (key.substr(key.find('.') + 1) == shard_name(b))
        slots.emplace_back(key.substr(0, key.find('.')), host_values(t));
    // The flat buffer's values on the host (in place there; a copy of a device's).
    const HostValues flat = host_values(view_leaf(flat_[b], 0, {flat_[b].numel()}, false));
    const float* params = flat.data;
    for (size_t k : reducer_.buckets()[b]) {
      const auto& [pname, p] = model_params_[k];
      const int64_t off = reducer_.offset_of(k);
      const int64_t begin = std::max(off, lo), end = std::min(off + p->numel(), hi);
      if (begin >= end) continue;
      out.push_back({"model", pname, begin - off,
                     from_blob(params + (begin - flat_base(b)), {end - begin}, Dtype::f32)});
      for (const auto& [slot, v] : slots)
        out.push_back({"train_state", slot + "." + pname, begin - off,
                       from_blob(v.data + (begin - own_begin(b)), {end - begin}, Dtype::f32)});
    }
  }
  for (auto& piece : out) piece.values.eval();
  return out;
}

std::map<std::string, training::checkpoint::TensorLayout> ShardedOptimizer::state_layout() const {
  std::set<std::string> slots;
  for (const auto& [key, t] : inner_->state_dict()) slots.insert(key.substr(0, key.find('.')));
  std::map<std::string, training::checkpoint::TensorLayout> out;
  for (const std::string& slot : slots)
    for (const auto& [pname, p] : model_params_) out[slot + "." + pname] = {Dtype::f32, p->shape()};
  return out;
}

void ShardedOptimizer::load_state_dict(const std::map<std::string, Tensor>& state, int64_t steps) {
  // slot -> per bucket: this rank's range of the flat state, [own_begin, + own_count) (zeros in
  // the padding), and how many of the bucket's parameters were given. Only that range is held,
  // not the whole model's state.
  std::map<std::string, std::vector<std::vector<float>>> own;
  std::map<std::string, std::vector<size_t>> given;
  for (const auto& [key, t] : state) {
    const auto dot = key.find('.');
    if (dot == std::string::npos) fail("[optimizer] bad state entry '", key, "'");
    const std::string slot = key.substr(0, dot), pname = key.substr(dot + 1);
    size_t k = 0;
    while (k < model_params_.size() && model_params_[k].first != pname) ++k;
    if (k == model_params_.size())
      fail("[optimizer] state entry '", key, "' names no parameter of this model");
    const Tensor& p = *model_params_[k].second;
    if (t.shape() != p.shape() || t.dtype() != Dtype::f32)
      fail("[optimizer] state entry '", key, "' is ", dtype_name(t.dtype()), " ",
           shape_str(t.shape()), " but the parameter is f32 ", shape_str(p.shape()));
    auto& slot_own = own[slot];
    auto& slot_given = given[slot];
    if (slot_own.empty()) {
      slot_own.resize(shard_.size());
      slot_given.assign(shard_.size(), 0);
      for (size_t b = 0; b < shard_.size(); ++b)
        slot_own[b].assign(static_cast<size_t>(own_count(b)), 0.0f);
    }
    const size_t b = reducer_.bucket_of(k);
    const int64_t off = reducer_.offset_of(k), first = own_begin(b);
    const int64_t lo = std::max(off, first), hi = std::min(off + p.numel(), first + own_count(b));
    if (lo < hi) {
      const HostValues v = host_values(t);
      std::memcpy(slot_own[b].data() + (lo - first), v.data + (lo - off),
                  static_cast<size_t>(hi - lo) * 4);
    }
    ++slot_given[b];
  }
  std::map<std::string, Tensor> inner;
  for (const auto& [slot, buckets] : own)
    for (size_t b = 0; b < buckets.size(); ++b) {
      const size_t n = given[slot][b];
      if (n == 0) continue;
      if (n != reducer_.buckets()[b].size())
        fail("[optimizer] state '", slot, "' covers ", n, " of the ", reducer_.buckets()[b].size(),
             " parameters of gradient bucket ", b, "; the sharded optimizer needs all or none");
      inner[slot + "." + shard_name(b)] =
          from_blob(buckets[b].data(), {own_count(b)}, Dtype::f32).eval();
    }
  inner_->load_state_dict(inner, steps);
  steps_ = steps;
}

}  // namespace hetrain::distributed
