#include "hetrain/memory/allocator.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <new>

#include "hetrain/base/byte_size.h"
#include "hetrain/base/error.h"
#if HETRAIN_HAVE_CUDA
#include "backends/cuda/api.h"
#endif

namespace hetrain {

namespace {
std::atomic<int64_t> g_device_bytes{0};  // bytes held in non-host memory nodes
}

std::string_view memory_tag_name(MemoryTag t) {
  switch (t) {
    case MemoryTag::parameters:
      return "parameters";
    case MemoryTag::gradients:
      return "gradients";
    case MemoryTag::optimizer_state:
      return "optimizer_state";
    case MemoryTag::activations:
      return "activations";
    case MemoryTag::workspace:
      return "workspace";
    case MemoryTag::communication:
      return "communication";
  }
  return "?";
}

std::string Device::str() const {
  switch (kind) {
    case DeviceKind::cpu:
      return "cpu";
    case DeviceKind::cuda:
      return "cuda:" + std::to_string(index);
    case DeviceKind::sim:
      return "sim:" + std::to_string(index);
  }
  return "?";
}

Device Device::parse(const std::string& s) {
  const Device d = parse_name(s);
  require_device(d);
  return d;
}

std::string devices_found() {
  std::string s = "cpu, sim:0 .. sim:" + std::to_string(kMaxSimDevices - 1);
#if HETRAIN_HAVE_CUDA
  const int n = cuda::device_count();
  for (int i = 0; i < n; ++i) s += ", cuda:" + std::to_string(i);
  if (n == 0) s += " (no CUDA device)";
#else
  s += " (no CUDA backend in this build)";
#endif
  return s;
}

void require_device(Device d) {
  switch (d.kind) {
    case DeviceKind::cpu:
      if (d.index != 0)
        fail("[device] cpu:", d.index, " is not present; devices found: ", devices_found());
      return;
    case DeviceKind::sim:
      if (d.index >= kMaxSimDevices)
        fail("[device] sim:", d.index, " is out of range; devices found: ", devices_found());
      return;
    case DeviceKind::cuda:
#if HETRAIN_HAVE_CUDA
      if (d.index >= cuda::device_count()) cuda::fail_no_device(d.index, devices_found());
      return;
#else
      fail("[device] cuda:", d.index, " requested but this build has no CUDA backend ",
           "(configured with HETRAIN_CUDA=OFF or without a CUDA toolkit); devices found: ",
           devices_found());
#endif
  }
}

Device Device::parse_name(const std::string& s) {
  auto colon = s.find(':');
  std::string kind = s.substr(0, colon);
  int index = 0;
  if (colon != std::string::npos) {
    try {
      size_t used = 0;
      index = std::stoi(s.substr(colon + 1), &used);
      if (used != s.size() - colon - 1 || index < 0) throw std::invalid_argument("");
    } catch (const std::exception&) {
      fail("[device] bad device '", s, "': the index after ':' must be a number >= 0");
    }
  }
  if (kind == "cpu") return {DeviceKind::cpu, index};
  if (kind == "cuda") return {DeviceKind::cuda, index};
  if (kind == "sim") return {DeviceKind::sim, index};
  fail("[device] unknown device '", s, "'; expected cpu, cuda:N or sim:N");
}

Buffer::~Buffer() { owner_->release(ptr_, bytes_, capacity_, tag_); }

void Buffer::retag(MemoryTag tag) {
  if (tag == tag_) return;
  owner_->retag(ptr_, bytes_, tag_, tag);
  tag_ = tag;
}

Device Buffer::device() const { return owner_->device(); }

namespace {
size_t round_capacity(size_t bytes) {
  // Round to 64 bytes below 1 MiB, then to 1/8 of the power of two, so cached blocks get
  // reused across slightly different sizes without wasting more than 12.5%.
  if (bytes <= (1u << 20)) return std::max<size_t>(64, (bytes + 63) & ~size_t{63});
  size_t p = size_t{1} << (63 - __builtin_clzll(bytes));
  size_t step = p / 8;
  return (bytes + step - 1) / step * step;
}
}  // namespace

HostAllocator::~HostAllocator() { empty_cache(); }

void HostAllocator::count(MemoryTag tag, int64_t delta) {
  if (device_.kind != DeviceKind::cpu) g_device_bytes.fetch_add(delta, std::memory_order_relaxed);
  stats_.count(tag, delta);
  if (observer_) observer_->on_memory(tag, delta, stats_);
}

void HostAllocator::set_observer(MemoryObserver* obs) {
  std::lock_guard<std::mutex> lk(mu_);
  observer_ = obs;
}

namespace {
thread_local const char* g_site_op = nullptr;
thread_local const Shape* g_site_shape = nullptr;
thread_local Dtype g_site_dtype = Dtype::f32;
}  // namespace

AllocationSiteScope::AllocationSiteScope(const char* op)
    : prev_op_(g_site_op), prev_shape_(g_site_shape), prev_dtype_(g_site_dtype) {
  g_site_op = op;
}
AllocationSiteScope::AllocationSiteScope(const Shape* shape, Dtype dtype)
    : prev_op_(g_site_op), prev_shape_(g_site_shape), prev_dtype_(g_site_dtype) {
  g_site_shape = shape;
  g_site_dtype = dtype;
}
AllocationSiteScope::~AllocationSiteScope() {
  g_site_op = prev_op_;
  g_site_shape = prev_shape_;
  g_site_dtype = prev_dtype_;
}

void Allocator::set_capacity(int64_t bytes, const std::string& origin) {
  if (bytes != 0)
    fail("[memory] ", origin, ": ", device().str(), "'s allocator takes no capacity limit");
}

void HostAllocator::set_capacity(int64_t bytes, const std::string& origin) {
  if (bytes < 0) fail("[memory] ", origin, ": a capacity must be >= 0 bytes, got ", bytes);
  std::lock_guard<std::mutex> lk(mu_);
  capacity_ = bytes;
  capacity_origin_ = origin;
}

int64_t HostAllocator::capacity() const {
  std::lock_guard<std::mutex> lk(mu_);
  return capacity_;
}

void HostAllocator::trim_cache_for(size_t cap) {
  while (!cache_.empty() && stats_.reserved + static_cast<int64_t>(cap) > capacity_) {
    auto last = std::prev(cache_.end());
    std::free(last->second);
    stats_.reserved -= static_cast<int64_t>(last->first);
    cache_.erase(last);
  }
}

std::string HostAllocator::oom_message(size_t bytes, MemoryTag tag) const {
  std::string m = "[memory] out of memory on " + device_.str() + ": " +
                  (g_site_op ? std::string(g_site_op) + " asks " : "asking ") +
                  format_bytes(static_cast<int64_t>(bytes)) + " (" + std::to_string(bytes) +
                  " bytes) for " + std::string(memory_tag_name(tag)) + " while " +
                  format_bytes(stats_.current_total) + " is live of its " +
                  format_bytes(capacity_) + " capacity (" + capacity_origin_ + "); live by tag:";
  for (int t = 0; t < kNumMemoryTags; ++t)
    m += std::string(t ? ", " : " ") + std::string(memory_tag_name(static_cast<MemoryTag>(t))) +
         " " + format_bytes(stats_.current[static_cast<size_t>(t)]);
  std::vector<const LiveBlock*> blocks;
  blocks.reserve(live_.size());
  for (const auto& [p, b] : live_) blocks.push_back(&b);
  const size_t show = std::min<size_t>(5, blocks.size());
  std::partial_sort(blocks.begin(), blocks.begin() + static_cast<std::ptrdiff_t>(show),
                    blocks.end(),
                    [](const LiveBlock* a, const LiveBlock* b) { return a->bytes > b->bytes; });
  m += "; largest tensors alive:";
  for (size_t i = 0; i < show; ++i) {
    const LiveBlock& b = *blocks[i];
    m += std::string(i ? ", " : " ") + format_bytes(static_cast<int64_t>(b.bytes)) + " " +
         std::string(memory_tag_name(b.tag));
    if (b.ndim > 0 || b.op) {
      m += " " + std::string(dtype_name(b.dtype)) + " (";
      for (int d = 0; d < std::min<int>(b.ndim, LiveBlock::kMaxDims); ++d)
        m += (d ? ", " : "") + std::to_string(b.dims[static_cast<size_t>(d)]);
      m += b.ndim > LiveBlock::kMaxDims ? ", ...)" : ")";
    }
    if (b.op) m += " from " + std::string(b.op);
  }
  if (blocks.empty()) m += " none";
  return m + "; lower the batch size, use --recompute, or raise the capacity";
}

std::shared_ptr<Buffer> HostAllocator::allocate(size_t bytes, MemoryTag tag) {
  size_t cap = round_capacity(bytes);
  void* p = nullptr;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (capacity_ > 0 && stats_.current_total + static_cast<int64_t>(bytes) > capacity_)
      throw OutOfMemoryError(oom_message(bytes, tag));
    // Take a cached block up to twice the size asked for.
    p = take_cached(cache_, cap, cap * 2);
    if (p) {
      ++stats_.cache_hits;
    } else if (capacity_ > 0) {
      trim_cache_for(cap);
    }
    ++stats_.allocations;
    count(tag, static_cast<int64_t>(bytes));
  }
  if (!p) {
    p = std::aligned_alloc(64, cap);
    if (!p) {
      std::lock_guard<std::mutex> lk(mu_);
      count(tag, -static_cast<int64_t>(bytes));
      throw OutOfMemoryError("[memory] out of host memory: the system refused " +
                             format_bytes(static_cast<int64_t>(cap)) + " for " +
                             std::string(memory_tag_name(tag)) + " on " + device_.str());
    }
    std::lock_guard<std::mutex> lk(mu_);
    stats_.reserved += static_cast<int64_t>(cap);
    stats_.peak_reserved = std::max(stats_.peak_reserved, stats_.reserved);
  }
  LiveBlock b{.bytes = bytes, .tag = tag, .op = g_site_op, .dtype = g_site_dtype};
  if (g_site_shape) {
    b.ndim = static_cast<uint8_t>(std::min<size_t>(g_site_shape->size(), 255));
    for (size_t d = 0; d < std::min<size_t>(g_site_shape->size(), LiveBlock::kMaxDims); ++d)
      b.dims[d] = (*g_site_shape)[d];
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    live_[p] = b;
  }
  return std::make_shared<Buffer>(this, p, bytes, cap, tag);
}

void HostAllocator::release(void* ptr, size_t bytes, size_t capacity, MemoryTag tag) {
  std::lock_guard<std::mutex> lk(mu_);
  count(tag, -static_cast<int64_t>(bytes));
  live_.erase(ptr);
  cache_.emplace(capacity, ptr);
}

void HostAllocator::retag(void* ptr, size_t bytes, MemoryTag from, MemoryTag to) {
  std::lock_guard<std::mutex> lk(mu_);
  count(from, -static_cast<int64_t>(bytes));
  count(to, static_cast<int64_t>(bytes));
  if (auto it = live_.find(ptr); it != live_.end()) it->second.tag = to;
}

MemoryStats HostAllocator::stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  return stats_;
}

void HostAllocator::reset_peak() {
  std::lock_guard<std::mutex> lk(mu_);
  stats_.reset_peaks();
}

void HostAllocator::empty_cache() {
  std::lock_guard<std::mutex> lk(mu_);
  for (auto& [cap, p] : cache_) {
    std::free(p);
    stats_.reserved -= static_cast<int64_t>(cap);
  }
  cache_.clear();
}

HostAllocator& host_allocator() {
  // Never destroyed: buffers held by static tensors may be released during exit.
  static HostAllocator* a = new HostAllocator();
  return *a;
}

Allocator& allocator_for(Device d) {
  switch (d.kind) {
    case DeviceKind::cpu:
      return host_allocator();
    case DeviceKind::sim: {
      if (d.index < 0 || d.index >= kMaxSimDevices)
        fail("[device] sim:", d.index,
             " is out of range; sim devices are sim:0 to sim:", kMaxSimDevices - 1);
      // Never destroyed, like the host allocator.
      static std::array<HostAllocator*, kMaxSimDevices> sims = [] {
        std::array<HostAllocator*, kMaxSimDevices> a{};
        for (int i = 0; i < kMaxSimDevices; ++i)
          a[static_cast<size_t>(i)] = new HostAllocator({DeviceKind::sim, i});
        return a;
      }();
      return *sims[static_cast<size_t>(d.index)];
    }
    case DeviceKind::cuda:
#if HETRAIN_HAVE_CUDA
      return cuda::device_allocator(d.index);
#else
      break;
#endif
  }
  fail("[device] ", d.str(), " has no memory node in this build (no CUDA backend)");
}

int64_t device_memory_in_use() {
  int64_t n = g_device_bytes.load(std::memory_order_relaxed);
#if HETRAIN_HAVE_CUDA
  n += cuda::memory_in_use();
#endif
  return n;
}

namespace {
thread_local MemoryTag g_tag = MemoryTag::activations;
thread_local Allocator* g_alloc = nullptr;  // nullptr: the host allocator
}  // namespace

AllocationDeviceScope::AllocationDeviceScope(Device d) : prev_(g_alloc) {
  g_alloc = d.kind == DeviceKind::cpu ? nullptr : &allocator_for(d);
}
AllocationDeviceScope::AllocationDeviceScope(Allocator& a) : prev_(g_alloc) { g_alloc = &a; }
AllocationDeviceScope::~AllocationDeviceScope() { g_alloc = prev_; }
Allocator& AllocationDeviceScope::current() { return g_alloc ? *g_alloc : host_allocator(); }

MemoryTagScope::MemoryTagScope(MemoryTag t) : prev_(g_tag) { g_tag = t; }
MemoryTagScope::~MemoryTagScope() { g_tag = prev_; }
MemoryTag MemoryTagScope::current() { return g_tag; }

}  // namespace hetrain
