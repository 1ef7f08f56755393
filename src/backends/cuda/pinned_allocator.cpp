// Page-locked host memory per CUDA device (cudaHostAlloc): the host side of ZeRO offload's
// copies, which the device's copy engine reads and writes directly.
#include <algorithm>
#include <array>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "backends/cuda/api.h"
#include "backends/cuda/check.h"
#include "backends/cuda/context.h"
#include "backends/cuda/flat_buffers.h"
#include "hetrain/base/error.h"

namespace hetrain::cuda {

namespace {

/// Every live block of every device's pinned allocator (base -> capacity), cached ones
/// included, for is_pinned_block.
struct BlockRegistry {
  std::mutex mu;
  std::map<const char*, size_t> blocks;
};
BlockRegistry& registry() {
  static BlockRegistry* r = new BlockRegistry();  // never destroyed, like the allocators
  return *r;
}
void register_block(void* p, size_t cap) {
  BlockRegistry& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  r.blocks[static_cast<const char*>(p)] = cap;
}
void unregister_block(void* p) {
  BlockRegistry& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  r.blocks.erase(static_cast<const char*>(p));
}

/// Blocks cached by capacity (rounded up to 4 KiB pages). A freed block may still be read or
/// written by a copy queued on the device's stream (a host-to-device copy from it returns at
/// once): it waits behind an event recorded on that stream, and is reused once that completed.
class PinnedHostAllocator final : public Allocator {
 public:
  explicit PinnedHostAllocator(int index) : index_(index) {}
  std::shared_ptr<Buffer> allocate(size_t bytes, MemoryTag tag) override {
    size_t cap = (std::max<size_t>(bytes, 1) + 4095) & ~size_t{4095};
    void* p = nullptr;
    {
      std::lock_guard<std::mutex> lk(mu_);
      reclaim();
      p = take_cached(cache_, cap, cap * 2);
      if (p) ++stats_.cache_hits;
    }
    if (!p) {
      // Portable: page-locked for every device's context, not only the current one.
      HT_CUDA_CHECK(cudaHostAlloc(&p, cap, cudaHostAllocPortable));
      register_block(p, cap);
      std::lock_guard<std::mutex> lk(mu_);
      stats_.reserved += static_cast<int64_t>(cap);
      stats_.peak_reserved = std::max(stats_.peak_reserved, stats_.reserved);
    }
    std::lock_guard<std::mutex> lk(mu_);
    ++stats_.allocations;
    count(tag, static_cast<int64_t>(bytes));
    return std::make_shared<Buffer>(this, p, bytes, cap, tag);
  }
  // Host memory: what holds an array here reads it in place.
  Device device() const override { return Device::cpu(); }
  MemoryStats stats() const override {
    std::lock_guard<std::mutex> lk(mu_);
    return stats_;
  }
  void reset_peak() override {
    std::lock_guard<std::mutex> lk(mu_);
    stats_.reset_peaks();
  }
  void empty_cache() override {
    std::lock_guard<std::mutex> lk(mu_);
    reclaim();
    while (!cache_.empty()) {  // each block leaves the cache before it is freed
      const auto [cap, p] = *cache_.begin();
      cache_.erase(cache_.begin());
      unregister_block(p);
      stats_.reserved -= static_cast<int64_t>(cap);
      HT_CUDA_CHECK(cudaFreeHost(p));
    }
  }
  void set_observer(MemoryObserver* obs) override {
    std::lock_guard<std::mutex> lk(mu_);
    observer_ = obs;
  }

 private:
  struct Pending {
    cudaEvent_t event;
    void* ptr;
    size_t cap;
  };
  // From Buffer's destructor: must not throw. Without an event (a failed call), the stream is
  // drained instead.
  void release(void* ptr, size_t bytes, size_t capacity, MemoryTag tag) override {
    cudaEvent_t ev = nullptr;
    int prev = -1;
    const bool switched = cudaGetDevice(&prev) == cudaSuccess && prev != index_ &&
                          cudaSetDevice(index_) == cudaSuccess;
    try {
      cudaStream_t s = context(index_).stream;
      if (cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) != cudaSuccess ||
          cudaEventRecord(ev, s) != cudaSuccess) {
        (void)cudaGetLastError();
        if (ev) (void)cudaEventDestroy(ev);
        ev = nullptr;
        (void)cudaStreamSynchronize(s);
        (void)cudaGetLastError();
      }
    } catch (...) {  // no context: nothing was queued that could read the block
      ev = nullptr;
    }
    if (switched) (void)cudaSetDevice(prev);
    std::lock_guard<std::mutex> lk(mu_);
    count(tag, -static_cast<int64_t>(bytes));
    if (ev)
      pending_.push_back({ev, ptr, capacity});
    else
      cache_.emplace(capacity, ptr);
  }
  void retag(void* /*ptr*/, size_t bytes, MemoryTag from, MemoryTag to) override {
    std::lock_guard<std::mutex> lk(mu_);
    count(from, -static_cast<int64_t>(bytes));
    count(to, static_cast<int64_t>(bytes));
  }
  // Caller holds mu_.
  void count(MemoryTag tag, int64_t delta) {
    stats_.count(tag, delta);
    if (observer_) observer_->on_memory(tag, delta, stats_);
  }
  // Caller holds mu_: blocks whose last queued copy has completed go back to the cache.
  void reclaim() {
    for (auto it = pending_.begin(); it != pending_.end();) {
      const cudaError_t e = cudaEventQuery(it->event);
      if (e == cudaErrorNotReady) {
        ++it;
        continue;
      }
      if (e != cudaSuccess) (void)cudaGetLastError();  // resurfaces at the next sync
      (void)cudaEventDestroy(it->event);
      cache_.emplace(it->cap, it->ptr);
      it = pending_.erase(it);
    }
  }

  int index_;
  mutable std::mutex mu_;
  std::multimap<size_t, void*> cache_;
  std::deque<Pending> pending_;
  MemoryStats stats_;
  MemoryObserver* observer_ = nullptr;
};

}  // namespace

bool is_pinned_block(const void* p, size_t bytes) {
  BlockRegistry& r = registry();
  const char* c = static_cast<const char*>(p);
  std::lock_guard<std::mutex> lk(r.mu);
  auto it = r.blocks.upper_bound(c);  // the first block after p
  if (it == r.blocks.begin()) return false;
  --it;
  return c >= it->first && c + bytes <= it->first + it->second;
}

Allocator& pinned_host_allocator(int index) {
  check_device(index);
  static std::mutex mu;
  static std::array<PinnedHostAllocator*, kMaxDevices> allocators{};
  std::lock_guard<std::mutex> lk(mu);
  PinnedHostAllocator*& a = allocators[static_cast<size_t>(index)];
  if (!a) a = new PinnedHostAllocator(index);  // never destroyed, like the device allocators
  return *a;
}

}  // namespace hetrain::cuda
