// DataLoader: seeded per-epoch permutations, drop_last, exact (epoch, position) state, and a
// background thread that keeps the next batches ready.
#include <algorithm>
#include <utility>

#include "hetrain/base/error.h"
#include "hetrain/memory/allocator.h"
#include "hetrain/training/data.h"

namespace hetrain::data {

namespace {

// Batches the worker keeps ready ahead of the caller.
constexpr size_t kPrefetchDepth = 2;

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// PCG32 (XSH-RR, O'Neill 2014), seeded as the reference pcg32_srandom_r.
class Pcg32 {
 public:
  Pcg32(uint64_t initstate, uint64_t initseq) : inc_((initseq << 1u) | 1u) {
    next();
    state_ += initstate;
    next();
  }
  uint32_t next() {
    const uint64_t old = state_;
    state_ = old * 6364136223846793005ull + inc_;
    const uint32_t xorshifted = static_cast<uint32_t>(((old >> 18u) ^ old) >> 27u);
    const uint32_t rot = static_cast<uint32_t>(old >> 59u);
    return (xorshifted >> rot) | (xorshifted << ((32u - rot) & 31u));
  }
  /// Uniform in [0, bound), bound <= 2^32, by Lemire's multiply-and-reject (unbiased).
  uint32_t below(uint64_t bound) {
    uint64_t m = uint64_t{next()} * bound;
    auto low = static_cast<uint32_t>(m);
    if (low < bound) {
      const auto threshold = static_cast<uint32_t>((uint64_t{1} << 32) % bound);
      while (low < threshold) {
        m = uint64_t{next()} * bound;
        low = static_cast<uint32_t>(m);
      }
    }
    return static_cast<uint32_t>(m >> 32);
  }

 private:
  uint64_t state_ = 0;
  uint64_t inc_;
};

// The order epoch `epoch` visits n examples: Fisher-Yates (from the back) over the identity,
// drawing from PCG32 with state splitmix64(seed ^ splitmix64(epoch)) and stream epoch.
std::vector<int64_t> permutation(int64_t n, uint64_t seed, int64_t epoch) {
  std::vector<int64_t> order(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) order[i] = i;
  const auto e = static_cast<uint64_t>(epoch);
  Pcg32 rng(splitmix64(seed ^ splitmix64(e)), e);
  for (int64_t i = n - 1; i > 0; --i) {
    const int64_t j = rng.below(static_cast<uint64_t>(i) + 1);
    std::swap(order[i], order[j]);
  }
  return order;
}

}  // namespace

DataLoader::DataLoader(std::shared_ptr<const Dataset> ds, int64_t batch_size, bool shuffle,
                       uint64_t seed, bool drop_last, bool prefetch)
    : ds_(std::move(ds)),
      batch_size_(batch_size),
      shuffle_(shuffle),
      seed_(seed),
      prefetch_(prefetch),
      shard_count_(batch_size) {
  if (!ds_) fail("[data] DataLoader: no dataset");
  if (batch_size < 1) fail("[data] DataLoader: batch size must be >= 1, got ", batch_size);
  const int64_t n = ds_->size();
  if (shuffle && n > (int64_t{1} << 32))
    fail("[data] DataLoader: cannot shuffle ", n, " examples (at most 2^32)");
  batches_per_epoch_ = drop_last ? n / batch_size : (n + batch_size - 1) / batch_size;
  if (batches_per_epoch_ == 0)
    fail("[data] DataLoader: ", ds_->describe(), ": ", n, " examples make no ",
         drop_last ? "full " : "", "batch of ", batch_size);
}

DataLoader::~DataLoader() { stop_worker(); }

std::vector<int64_t> DataLoader::epoch_order(int64_t epoch) const {
  if (epoch < 0) fail("[data] DataLoader: negative epoch ", epoch);
  if (shuffle_) return permutation(ds_->size(), seed_, epoch);
  std::vector<int64_t> order(static_cast<size_t>(ds_->size()));
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int64_t>(i);
  return order;
}

void DataLoader::set_shard(int64_t offset, int64_t count, int64_t micro) {
  if (micro < 1 || count < 1 || offset < 0 || offset + count > batch_size_ || count % micro != 0)
    fail("[data] DataLoader: cannot split examples [", offset, ", ", offset + count,
         ") of a batch of ", batch_size_, " into ", micro, " equal micro-batches");
  stop_worker();
  shard_offset_ = offset;
  shard_count_ = count;
  micro_ = micro;
}

std::vector<Batch> DataLoader::produce(int64_t epoch, int64_t position) {
  if (order_epoch_ != epoch) {
    order_ = epoch_order(epoch);
    order_epoch_ = epoch;
  }
  const auto n = static_cast<int64_t>(order_.size());
  const int64_t begin = std::min(n, position * batch_size_ + shard_offset_);
  const int64_t end = std::min(n, begin + shard_count_);
  const int64_t per = (shard_count_ + micro_ - 1) / micro_;
  // Batches are inputs to the step's activations; tag them so whatever thread makes them.
  MemoryTagScope tag(MemoryTag::activations);
  std::vector<Batch> out;
  for (int64_t b = begin; b < end || (out.empty() && b == end); b += per) {
    const std::vector<int64_t> indices(order_.begin() + b, order_.begin() + std::min(end, b + per));
    out.push_back(ds_->make_batch(indices));
  }
  return out;
}

Batch DataLoader::next() {
  std::vector<Batch> b = next_micro();
  HT_ASSERT(b.size() == 1);
  return std::move(b[0]);
}

std::vector<Batch> DataLoader::next_micro() {
  std::vector<Batch> batch;
  if (!prefetch_) {
    batch = produce(epoch_, position_);
  } else {
    if (!worker_.joinable()) start_worker();
    Slot slot;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return !queue_.empty(); });
      slot = std::move(queue_.front());
      queue_.pop_front();
    }
    cv_.notify_all();
    HT_ASSERT(slot.epoch == epoch_ && slot.position == position_);
    if (slot.error) {
      // The worker stopped at the failed batch; the next call retries from here.
      stop_worker();
      std::rethrow_exception(slot.error);
    }
    batch = std::move(slot.batches);
  }
  if (++position_ == batches_per_epoch_) {
    position_ = 0;
    ++epoch_;
  }
  return batch;
}

void DataLoader::seek(int64_t epoch, int64_t position) {
  if (epoch < 0 || position < 0 || position > batches_per_epoch_)
    fail("[data] DataLoader: cannot seek to epoch ", epoch, " position ", position, " (",
         batches_per_epoch_, " batches per epoch)");
  stop_worker();
  if (position == batches_per_epoch_) {
    position = 0;
    ++epoch;
  }
  epoch_ = epoch;
  position_ = position;
}

void DataLoader::start_worker() {
  stop_ = false;
  queue_.clear();
  worker_ = std::thread([this, e = epoch_, p = position_] { worker_loop(e, p); });
}

void DataLoader::stop_worker() {
  if (!worker_.joinable()) return;
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  worker_.join();
  queue_.clear();
  stop_ = false;
}

// Makes consecutive batches from (epoch, position), the loader state when next() started it.
void DataLoader::worker_loop(int64_t epoch, int64_t position) {
  while (true) {
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stop_ || queue_.size() < kPrefetchDepth; });
      if (stop_) return;
    }
    Slot slot{epoch, position, {}, nullptr};
    try {
      slot.batches = produce(epoch, position);
    } catch (...) {
      slot.error = std::current_exception();
    }
    const bool failed = slot.error != nullptr;
    {
      std::lock_guard lock(mu_);
      if (stop_) return;
      queue_.push_back(std::move(slot));
    }
    cv_.notify_all();
    if (failed) return;
    if (++position == batches_per_epoch_) {
      position = 0;
      ++epoch;
    }
  }
}

std::vector<Batch> DataLoader::all_batches(const Dataset& ds, int64_t batch_size) {
  if (batch_size < 1) fail("[data] all_batches: batch size must be >= 1, got ", batch_size);
  std::vector<Batch> out;
  const int64_t n = ds.size();
  for (int64_t begin = 0; begin < n; begin += batch_size) {
    std::vector<int64_t> indices;
    for (int64_t i = begin; i < std::min(n, begin + batch_size); ++i) indices.push_back(i);
    out.push_back(ds.make_batch(indices));
  }
  return out;
}

}  // namespace hetrain::data
