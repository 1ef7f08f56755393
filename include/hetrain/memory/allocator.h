// Allocators with statistics. Every memory figure Hetrain reports comes from these counters.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "hetrain/base/dtype.h"
#include "hetrain/base/error.h"
#include "hetrain/base/shape.h"
#include "hetrain/memory/device.h"

namespace hetrain {

enum class MemoryTag : uint8_t {
  parameters,
  gradients,
  optimizer_state,
  activations,
  workspace,
  communication,  // buffers of collectives (gradient exchange, gathers)
};
inline constexpr int kNumMemoryTags = 6;
std::string_view memory_tag_name(MemoryTag t);

struct MemoryStats {
  std::array<int64_t, kNumMemoryTags> current{};
  std::array<int64_t, kNumMemoryTags> peak{};
  int64_t current_total = 0;
  int64_t peak_total = 0;
  /// Live bytes by tag when the total last reached peak_total: what the peak was made of.
  std::array<int64_t, kNumMemoryTags> at_peak{};

  /// Counts delta bytes (negative when freed) under tag, and the peaks with them.
  void count(MemoryTag tag, int64_t delta) {
    const auto i = static_cast<size_t>(tag);
    current[i] += delta;
    current_total += delta;
    peak[i] = std::max(peak[i], current[i]);
    if (current_total > peak_total) {
      peak_total = current_total;
      at_peak = current;
    }
  }
  /// The peaks restart from what is live now.
  void reset_peaks() {
    peak = current;
    peak_total = current_total;
    at_peak = current;
    peak_reserved = reserved;
  }
  int64_t reserved = 0;  // bytes held by the allocator, cached blocks included
  int64_t peak_reserved = 0;
  int64_t allocations = 0;
  int64_t cache_hits = 0;
};

class Allocator;

/// Hetrain's out-of-memory error: an allocation would pass a device's capacity (the CPU's
/// --memory-budget, a sim device's mem=, a GPU's memory). The message names the device, the
/// request, the live bytes by tag and the largest tensors alive.
class OutOfMemoryError : public Error {
 public:
  explicit OutOfMemoryError(const std::string& what) : Error(what) {}
};

/// What this thread is allocating, for out-of-memory reports: the op whose kernel runs (set
/// by the executor) and the array's shape and dtype (set by Array::allocate). Restored on
/// scope exit. The op name must outlive the scope (Primitive::name() strings do).
class AllocationSiteScope {
 public:
  explicit AllocationSiteScope(const char* op);
  AllocationSiteScope(const Shape* shape, Dtype dtype);
  ~AllocationSiteScope();
  AllocationSiteScope(const AllocationSiteScope&) = delete;
  AllocationSiteScope& operator=(const AllocationSiteScope&) = delete;

 private:
  const char* prev_op_;
  const Shape* prev_shape_;
  Dtype prev_dtype_;
};

/// Observes every change of an allocator's counters (the profiler's memory timeline). Called
/// with the allocator's lock held, on the thread that allocated or freed: it must be quick
/// and must not allocate through the same allocator.
class MemoryObserver {
 public:
  virtual ~MemoryObserver() = default;
  /// `tag` changed by `delta` bytes; `stats` holds the counters after the change.
  virtual void on_memory(MemoryTag tag, int64_t delta, const MemoryStats& stats) = 0;
};

/// A block of device memory. Freed (returned to its allocator's cache) when the last
/// reference goes away.
class Buffer {
 public:
  Buffer(Allocator* owner, void* ptr, size_t bytes, size_t capacity, MemoryTag tag)
      : owner_(owner), ptr_(ptr), bytes_(bytes), capacity_(capacity), tag_(tag) {}
  ~Buffer();
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() const { return ptr_; }
  size_t bytes() const { return bytes_; }
  MemoryTag tag() const { return tag_; }
  /// Moves this buffer's bytes to another tag in the statistics (e.g. a computed gradient).
  void retag(MemoryTag tag);
  Device device() const;

 private:
  Allocator* owner_;
  void* ptr_;
  size_t bytes_;
  size_t capacity_;
  MemoryTag tag_;
};

/// A caching allocator's reuse rule: takes from `cache` (free blocks by capacity) the smallest
/// block of at least `cap` and at most `max_cap` bytes and sets cap to its capacity; nullptr when
/// there is none (cap unchanged).
inline void* take_cached(std::multimap<size_t, void*>& cache, size_t& cap, size_t max_cap) {
  auto it = cache.lower_bound(cap);
  if (it == cache.end() || it->first > max_cap) return nullptr;
  cap = it->first;
  void* p = it->second;
  cache.erase(it);
  return p;
}

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual std::shared_ptr<Buffer> allocate(size_t bytes, MemoryTag tag) = 0;
  virtual Device device() const = 0;
  virtual MemoryStats stats() const = 0;
  virtual void reset_peak() = 0;
  /// Releases cached blocks back to the system.
  virtual void empty_cache() = 0;
  /// Installs an observer of the counters (nullptr removes it; off by default). Not owned.
  virtual void set_observer(MemoryObserver* obs) = 0;
  /// Limits the live bytes (bytes asked for by the buffers alive) to `bytes` (0: no limit):
  /// an allocation that would pass it throws OutOfMemoryError. `origin` says where the limit
  /// came from, for the message ("--memory-budget"). Cached blocks are given back to the
  /// system first when the reserved bytes would pass it. Default: throws (no limit here).
  virtual void set_capacity(int64_t bytes, const std::string& origin);
  /// The limit set by set_capacity (0: none).
  virtual int64_t capacity() const { return 0; }

 protected:
  friend class Buffer;
  virtual void release(void* ptr, size_t bytes, size_t capacity, MemoryTag tag) = 0;
  virtual void retag(void* ptr, size_t bytes, MemoryTag from, MemoryTag to) = 0;
};

/// Host memory: 64-byte aligned blocks, cached by rounded size so a training loop that
/// allocates the same shapes each step stops calling the system allocator. A sim device's
/// memory node is a HostAllocator of its own (separate blocks and statistics), so data on
/// it is reached only through a copy between memory nodes.
class HostAllocator final : public Allocator {
 public:
  explicit HostAllocator(Device device = Device::cpu()) : device_(device) {}
  ~HostAllocator() override;
  std::shared_ptr<Buffer> allocate(size_t bytes, MemoryTag tag) override;
  Device device() const override { return device_; }
  MemoryStats stats() const override;
  void reset_peak() override;
  void empty_cache() override;
  void set_observer(MemoryObserver* obs) override;
  void set_capacity(int64_t bytes, const std::string& origin) override;
  int64_t capacity() const override;

 private:
  /// A buffer alive, for out-of-memory reports.
  struct LiveBlock {
    size_t bytes = 0;
    MemoryTag tag = MemoryTag::activations;
    const char* op = nullptr;
    Dtype dtype = Dtype::f32;
    uint8_t ndim = 0;  // dims kept: up to kMaxDims (more: marked "...")
    static constexpr int kMaxDims = 6;
    std::array<int64_t, kMaxDims> dims{};
  };
  void release(void* ptr, size_t bytes, size_t capacity, MemoryTag tag) override;
  void retag(void* ptr, size_t bytes, MemoryTag from, MemoryTag to) override;
  void count(MemoryTag tag, int64_t delta);
  /// Caller holds mu_: frees cached blocks (largest first) until `cap` more bytes fit in the
  /// capacity or the cache is empty.
  void trim_cache_for(size_t cap);
  /// Caller holds mu_: the out-of-memory message for a request of `bytes` with tag.
  std::string oom_message(size_t bytes, MemoryTag tag) const;

  Device device_;
  mutable std::mutex mu_;
  std::multimap<size_t, void*> cache_;
  std::unordered_map<void*, LiveBlock> live_;
  MemoryStats stats_;
  MemoryObserver* observer_ = nullptr;
  int64_t capacity_ = 0;
  std::string capacity_origin_;
};

HostAllocator& host_allocator();

/// Highest sim device index + 1.
inline constexpr int kMaxSimDevices = 8;
/// Highest CUDA device index + 1 that Hetrain handles.
inline constexpr int kMaxCudaDevices = 16;
/// The devices this build and machine have, for error messages: "cpu, sim:0 .. sim:7,
/// cuda:0" (the CUDA part says when there is no device or no backend).
std::string devices_found();
/// Throws an Error naming d and listing devices_found() unless d exists here (a CUDA
/// device of this machine, a sim device in range, the CPU).
void require_device(Device d);

/// The allocator of a device's memory node: the host allocator for the CPU, one allocator
/// per sim device, the CUDA backend's caching allocator per GPU. Throws (naming the device
/// and the devices found) for a device this build or machine has no memory for.
Allocator& allocator_for(Device d);
/// Bytes currently held in memory nodes other than the host's (sim and CUDA devices).
int64_t device_memory_in_use();

/// Sets the device whose memory node Array::allocate uses on this thread (the executor's
/// workers set it to the device running the node); restored on scope exit.
class AllocationDeviceScope {
 public:
  explicit AllocationDeviceScope(Device d);
  /// An allocator of the caller's own (the memory model measures a kernel's scratch on one).
  explicit AllocationDeviceScope(Allocator& a);
  ~AllocationDeviceScope();
  AllocationDeviceScope(const AllocationDeviceScope&) = delete;
  AllocationDeviceScope& operator=(const AllocationDeviceScope&) = delete;
  static Allocator& current();

 private:
  Allocator* prev_;
};

/// Sets the tag new allocations on this thread receive; restored on scope exit.
class MemoryTagScope {
 public:
  explicit MemoryTagScope(MemoryTag t);
  ~MemoryTagScope();
  static MemoryTag current();

 private:
  MemoryTag prev_;
};

}  // namespace hetrain
