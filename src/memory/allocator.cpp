#include "hetrain/memory/allocator.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <new>

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
    case MemoryTag::parameters: return "parameters";
    case MemoryTag::gradients: return "gradients";
    case MemoryTag::optimizer_state: return "optimizer_state";
    case MemoryTag::activations: return "activations";
    case MemoryTag::workspace: return "workspace";
  }
  return "?";
}

std::string Device::str() const {
  switch (kind) {
    case DeviceKind::cpu: return "cpu";
    case DeviceKind::cuda: return "cuda:" + std::to_string(index);
    case DeviceKind::sim: return "sim:" + std::to_string(index);
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
  owner_->retag(bytes_, tag_, tag);
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
  auto i = static_cast<size_t>(tag);
  stats_.current[i] += delta;
  stats_.current_total += delta;
  stats_.peak[i] = std::max(stats_.peak[i], stats_.current[i]);
  stats_.peak_total = std::max(stats_.peak_total, stats_.current_total);
  if (observer_) observer_->on_memory(tag, delta, stats_);
}

void HostAllocator::set_observer(MemoryObserver* obs) {
  std::lock_guard<std::mutex> lk(mu_);
  observer_ = obs;
}

std::shared_ptr<Buffer> HostAllocator::allocate(size_t bytes, MemoryTag tag) {
  size_t cap = round_capacity(bytes);
  void* p = nullptr;
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = cache_.lower_bound(cap);
    // Take a cached block up to twice the size asked for.
    if (it != cache_.end() && it->first <= cap * 2) {
      cap = it->first;
      p = it->second;
      cache_.erase(it);
      ++stats_.cache_hits;
    }
    ++stats_.allocations;
    count(tag, static_cast<int64_t>(bytes));
  }
  if (!p) {
    p = std::aligned_alloc(64, cap);
    if (!p) {
      std::lock_guard<std::mutex> lk(mu_);
      count(tag, -static_cast<int64_t>(bytes));
      fail("[memory] out of host memory allocating ", bytes, " bytes for ", memory_tag_name(tag));
    }
    std::lock_guard<std::mutex> lk(mu_);
    stats_.reserved += static_cast<int64_t>(cap);
  }
  return std::make_shared<Buffer>(this, p, bytes, cap, tag);
}

void HostAllocator::release(void* ptr, size_t bytes, size_t capacity, MemoryTag tag) {
  std::lock_guard<std::mutex> lk(mu_);
  count(tag, -static_cast<int64_t>(bytes));
  cache_.emplace(capacity, ptr);
}

void HostAllocator::retag(size_t bytes, MemoryTag from, MemoryTag to) {
  std::lock_guard<std::mutex> lk(mu_);
  count(from, -static_cast<int64_t>(bytes));
  count(to, static_cast<int64_t>(bytes));
}

MemoryStats HostAllocator::stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  return stats_;
}

void HostAllocator::reset_peak() {
  std::lock_guard<std::mutex> lk(mu_);
  stats_.peak = stats_.current;
  stats_.peak_total = stats_.current_total;
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
    case DeviceKind::cpu: return host_allocator();
    case DeviceKind::sim: {
      if (d.index < 0 || d.index >= kMaxSimDevices)
        fail("[device] sim:", d.index, " is out of range; sim devices are sim:0 to sim:",
             kMaxSimDevices - 1);
      // Never destroyed, like the host allocator.
      static std::array<HostAllocator*, kMaxSimDevices> sims = [] {
        std::array<HostAllocator*, kMaxSimDevices> a{};
        for (int i = 0; i < kMaxSimDevices; ++i) a[static_cast<size_t>(i)] = new HostAllocator({DeviceKind::sim, i});
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
AllocationDeviceScope::~AllocationDeviceScope() { g_alloc = prev_; }
Allocator& AllocationDeviceScope::current() { return g_alloc ? *g_alloc : host_allocator(); }

MemoryTagScope::MemoryTagScope(MemoryTag t) : prev_(g_tag) { g_tag = t; }
MemoryTagScope::~MemoryTagScope() { g_tag = prev_; }
MemoryTag MemoryTagScope::current() { return g_tag; }

}  // namespace hetrain
