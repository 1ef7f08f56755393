// The caching device allocator (one per CUDA device) and pinned host staging buffers.
#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <sstream>

#include "backends/cuda/api.h"
#include "backends/cuda/check.h"
#include "backends/cuda/context.h"
#include "backends/cuda/flat_buffers.h"
#include "hetrain/base/error.h"

namespace hetrain::cuda {

namespace {
std::atomic<int64_t> g_in_use{0};  // bytes allocated on all CUDA devices

size_t round_capacity(size_t bytes) {
  // 512-byte granules below 1 MiB (cudaMalloc aligns to 256), then 1/8 of the power of two,
  // like the host allocator: cached blocks get reused across slightly different sizes.
  if (bytes <= (size_t{1} << 20)) return std::max<size_t>(512, (bytes + 511) & ~size_t{511});
  const size_t p = size_t{1} << (63 - __builtin_clzll(bytes));
  const size_t step = p / 8;
  return (bytes + step - 1) / step * step;
}

std::string mib(int64_t bytes) {
  std::ostringstream os;
  os.precision(1);
  os << std::fixed << static_cast<double>(bytes) / (1024.0 * 1024.0) << " MiB";
  return os.str();
}

/// Device memory of one CUDA device. Blocks return to a cache keyed by capacity; all of a
/// device's work runs on its one stream, so a block freed by the host after its last kernel
/// was queued may be handed to a kernel queued later (stream order makes that safe).
class CudaAllocator final : public Allocator {
 public:
  explicit CudaAllocator(int index) : index_(index) {}
  std::shared_ptr<Buffer> allocate(size_t bytes, MemoryTag tag) override {
    size_t cap = round_capacity(bytes);
    void* p = nullptr;
    {
      std::lock_guard<std::mutex> lk(mu_);
      // A cached block up to 1.5 times the size asked for (device memory is scarcer).
      p = take_cached(cache_, cap, cap + cap / 2);
      if (p) ++stats_.cache_hits;
    }
    if (!p) p = device_malloc(cap, bytes, tag);
    std::lock_guard<std::mutex> lk(mu_);
    ++stats_.allocations;
    count(tag, static_cast<int64_t>(bytes));
    return std::make_shared<Buffer>(this, p, bytes, cap, tag);
  }
  Device device() const override { return {DeviceKind::cuda, index_}; }
  MemoryStats stats() const override {
    std::lock_guard<std::mutex> lk(mu_);
    return stats_;
  }
  void reset_peak() override {
    std::lock_guard<std::mutex> lk(mu_);
    stats_.reset_peaks();
  }
  void empty_cache() override {
    std::multimap<size_t, void*> blocks;
    {
      std::lock_guard<std::mutex> lk(mu_);
      blocks.swap(cache_);
    }
    if (blocks.empty()) return;
    DeviceGuard guard(index_);
    // Queued kernels may still use a cached block's memory (it was released when its last
    // use was queued): wait for them before giving it back.
    HT_CUDA_CHECK(cudaDeviceSynchronize());
    for (auto& [cap, p] : blocks) {
      HT_CUDA_CHECK(cudaFree(p));
      std::lock_guard<std::mutex> lk(mu_);
      stats_.reserved -= static_cast<int64_t>(cap);
    }
  }
  void set_observer(MemoryObserver* obs) override {
    std::lock_guard<std::mutex> lk(mu_);
    observer_ = obs;
  }

 private:
  void release(void* ptr, size_t bytes, size_t capacity, MemoryTag tag) override {
    std::lock_guard<std::mutex> lk(mu_);
    count(tag, -static_cast<int64_t>(bytes));
    cache_.emplace(capacity, ptr);
  }
  void retag(void* /*ptr*/, size_t bytes, MemoryTag from, MemoryTag to) override {
    std::lock_guard<std::mutex> lk(mu_);
    count(from, -static_cast<int64_t>(bytes));
    count(to, static_cast<int64_t>(bytes));
  }
  // Caller holds mu_.
  void count(MemoryTag tag, int64_t delta) {
    g_in_use.fetch_add(delta, std::memory_order_relaxed);
    stats_.count(tag, delta);
    if (observer_) observer_->on_memory(tag, delta, stats_);
  }

  /// cudaMalloc of cap bytes; on out-of-memory frees the cache and retries once, then
  /// throws an Error naming the device, the request and the counters.
  void* device_malloc(size_t cap, size_t bytes, MemoryTag tag) {
    DeviceGuard guard(index_);
    void* p = nullptr;
    cudaError_t e = cudaMalloc(&p, cap);
    if (e == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      empty_cache();
      e = cudaMalloc(&p, cap);
    }
    if (e == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      fail_out_of_memory(bytes, tag);
    }
    HT_CUDA_CHECK(e);
    std::lock_guard<std::mutex> lk(mu_);
    stats_.reserved += static_cast<int64_t>(cap);
    stats_.peak_reserved = std::max(stats_.peak_reserved, stats_.reserved);
    return p;
  }

  [[noreturn]] void fail_out_of_memory(size_t bytes, MemoryTag tag) {
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) (void)cudaGetLastError();
    const MemoryStats s = stats();
    std::ostringstream os;
    os << "[memory] out of memory on cuda:" << index_ << " allocating " << bytes << " bytes ("
       << mib(static_cast<int64_t>(bytes)) << ") for " << memory_tag_name(tag)
       << "; allocated by Hetrain " << mib(s.current_total) << " (";
    for (int t = 0; t < kNumMemoryTags; ++t)
      os << (t ? ", " : "") << memory_tag_name(static_cast<MemoryTag>(t)) << " "
         << mib(s.current[static_cast<size_t>(t)]);
    os << "), reserved " << mib(s.reserved) << "; the device has "
       << mib(static_cast<int64_t>(free_b)) << " free of " << mib(static_cast<int64_t>(total_b));
    throw OutOfMemoryError(os.str());
  }

  int index_;
  mutable std::mutex mu_;
  std::multimap<size_t, void*> cache_;
  MemoryStats stats_;
  MemoryObserver* observer_ = nullptr;
};

/// A page-locked staging block for a transfer with device index, from its pinned allocator
/// (flat_buffers.h): freed, it is reused only once the work then queued on the device's stream
/// (the copy that reads it) is done.
std::shared_ptr<Buffer> staging(int index, size_t bytes) {
  return pinned_host_allocator(index).allocate(bytes, MemoryTag::workspace);
}

void device_to_host(const void* src, int index, void* dst, size_t bytes) {
  DeviceContext& c = context(index);
  DeviceGuard guard(index);
  if (is_pinned_block(dst, bytes)) {  // page-locked already: no staging
    HT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, c.stream));
    HT_CUDA_CHECK(cudaStreamSynchronize(c.stream));
    return;
  }
  const std::shared_ptr<Buffer> stage = staging(index, bytes);
  HT_CUDA_CHECK(cudaMemcpyAsync(stage->data(), src, bytes, cudaMemcpyDeviceToHost, c.stream));
  HT_CUDA_CHECK(cudaStreamSynchronize(c.stream));
  std::memcpy(dst, stage->data(), bytes);
}

void host_to_device(const void* src, void* dst, int index, size_t bytes) {
  DeviceContext& c = context(index);
  DeviceGuard guard(index);
  // A block of pinned_host_allocator: its release waits for this stream, and its users do not
  // write it again while it is alive (flat_buffers.h). Other page-locked memory (another
  // library's) is staged as pageable memory is: its owner may rewrite or free it at once.
  if (is_pinned_block(src, bytes)) {
    HT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c.stream));
    return;
  }
  const std::shared_ptr<Buffer> stage = staging(index, bytes);
  std::memcpy(stage->data(), src, bytes);
  HT_CUDA_CHECK(cudaMemcpyAsync(dst, stage->data(), bytes, cudaMemcpyHostToDevice, c.stream));
}
}  // namespace

Allocator& device_allocator(int index) {
  check_device(index);
  static std::mutex mu;
  static std::array<CudaAllocator*, kMaxDevices> allocators{};
  std::lock_guard<std::mutex> lk(mu);
  CudaAllocator*& a = allocators[static_cast<size_t>(index)];
  if (!a) a = new CudaAllocator(index);  // never destroyed, like the host allocator
  return *a;
}

int64_t memory_in_use() { return g_in_use.load(std::memory_order_relaxed); }

void copy(const void* src, Device src_dev, void* dst, Device dst_dev, size_t bytes) {
  if (bytes == 0) return;
  const bool from_cuda = src_dev.kind == DeviceKind::cuda;
  const bool to_cuda = dst_dev.kind == DeviceKind::cuda;
  HT_ASSERT(from_cuda || to_cuda);
  if (from_cuda && to_cuda) {
    if (src_dev.index == dst_dev.index) {
      DeviceContext& c = context(dst_dev.index);
      DeviceGuard guard(dst_dev.index);
      HT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, c.stream));
      return;
    }
    // Between two GPUs through the host: correct everywhere (peer access is an optimisation
    // for later). The source's stream is drained, the destination's stream orders the rest.
    const std::shared_ptr<Buffer> stage = staging(src_dev.index, bytes);
    device_to_host(src, src_dev.index, stage->data(), bytes);
    host_to_device(stage->data(), dst, dst_dev.index, bytes);
    synchronize(dst_dev.index);
    return;
  }
  if (from_cuda) {
    device_to_host(src, src_dev.index, dst, bytes);
  } else {
    host_to_device(src, dst, dst_dev.index, bytes);
  }
}

}  // namespace hetrain::cuda
