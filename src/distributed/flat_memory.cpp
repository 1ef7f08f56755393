// The flat buffers' operations (host_buffers.h): in place on host memory, queued on the
// device's stream for a GPU.
#include <cstring>

#include "distributed/host_buffers.h"

#if HETRAIN_HAVE_CUDA
#include "backends/cuda/api.h"
#include "backends/cuda/flat_buffers.h"
#endif

namespace hetrain::distributed {

namespace {

float* at(const Array& a, int64_t off) { return a.data<float>() + off; }

#if !HETRAIN_HAVE_CUDA
[[noreturn]] void no_cuda(Device d) {
  fail("[zero] ", d.str(), ": this build has no CUDA backend for ZeRO's buffers on a GPU");
}
#endif

/// n zeroed f32 elements from `allocator`, not the calling thread's (an executor worker's).
Array zeroed_f32(int64_t n, MemoryTag tag, Allocator& allocator) {
  Array a;
  a.shape = {n};
  a.dtype = Dtype::f32;
  a.tag = tag;
  a.strides = {1};
  {
    AllocationDeviceScope on(allocator);
    a.allocate();
  }
  zero_f32(a, 0, n);
  return a;
}

}  // namespace

Array flat_f32(int64_t n, MemoryTag tag, Device home) {
  return zeroed_f32(n, tag, allocator_for(home));
}

Allocator& staging_allocator(Device node) {
  if (host_addressable(node)) return host_allocator();
#if HETRAIN_HAVE_CUDA
  return cuda::pinned_host_allocator(node.index);
#else
  no_cuda(node);
#endif
}

Array staging_f32(int64_t n, MemoryTag tag, Device node) {
  return zeroed_f32(n, tag, staging_allocator(node));
}

void zero_f32(const Array& dst, int64_t off, int64_t n) {
  if (n <= 0) return;
  const Device d = dst.device();
  if (host_addressable(d)) {
    std::memset(at(dst, off), 0, static_cast<size_t>(n) * sizeof(float));
    return;
  }
#if HETRAIN_HAVE_CUDA
  cuda::fill_zero(at(dst, off), static_cast<size_t>(n) * sizeof(float), d.index);
#else
  no_cuda(d);
#endif
}

void copy_f32(const Array& dst, int64_t doff, const Array& src, int64_t soff, int64_t n) {
  if (n <= 0) return;
  const Device dd = dst.device(), sd = src.device();
  // The same elements (a shard updated in place in its flat buffer): nothing to copy, and a
  // device's copy engine must not be given overlapping ranges.
  if (same_memory(dd, sd) && at(dst, doff) == at(src, soff)) return;
  if (host_addressable(dd) && host_addressable(sd)) {
    std::memmove(at(dst, doff), at(src, soff), static_cast<size_t>(n) * sizeof(float));
    return;
  }
#if HETRAIN_HAVE_CUDA
  // Host memory as the CPU's node: the backend tells a GPU from the host by kind.
  cuda::copy(at(src, soff), host_addressable(sd) ? Device::cpu() : sd, at(dst, doff),
             host_addressable(dd) ? Device::cpu() : dd, static_cast<size_t>(n) * sizeof(float));
#else
  no_cuda(host_addressable(dd) ? sd : dd);
#endif
}

void add_f32(const Array& dst, int64_t doff, const Array& src, int64_t soff, int64_t n) {
  if (n <= 0) return;
  const Device d = dst.device();
  if (!same_memory(d, src.device())) {
    const Array near = on_node(src, soff + n, d);
    add_f32(dst, doff, near, soff, n);
    return;
  }
  if (host_addressable(d)) {
    float* y = at(dst, doff);
    const float* x = at(src, soff);
    for (int64_t i = 0; i < n; ++i) y[i] += x[i];
    return;
  }
#if HETRAIN_HAVE_CUDA
  cuda::add_f32(at(dst, doff), at(src, soff), n, d.index);
#else
  no_cuda(d);
#endif
}

void scale_f32(const Array& x, int64_t off, int64_t n, float c, bool divide) {
  if (n <= 0) return;
  const Device d = x.device();
  if (host_addressable(d)) {
    float* v = at(x, off);
    if (divide) {
      for (int64_t i = 0; i < n; ++i) v[i] = v[i] / c;
    } else {
      for (int64_t i = 0; i < n; ++i) v[i] = v[i] * c;
    }
    return;
  }
#if HETRAIN_HAVE_CUDA
  cuda::scale_f32(at(x, off), c, divide, n, d.index);
#else
  no_cuda(d);
#endif
}

Array on_node(const Array& a, int64_t n, Device node) {
  if (same_memory(a.device(), node)) return a;
  Array out = flat_f32(n, MemoryTag::communication, node);
  copy_f32(out, 0, a, 0, n);
  return out;
}

Array f32_array(const Tensor& t) {
  t.eval();
  const Array& a = t.array();
  if (a.dtype == Dtype::f32 && a.contiguous()) return a;
  const std::vector<float> v = t.to_vector<float>();
  Array out = flat_f32(static_cast<int64_t>(v.size()), a.tag, Device::cpu());
  std::memcpy(out.raw(), v.data(), v.size() * sizeof(float));
  return out;
}

}  // namespace hetrain::distributed
