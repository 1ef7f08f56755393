// Flat f32 buffers shared by the gradient reducer, the sharded optimizer and the gatherer, and
// the few operations they do on them, one mechanism for every memory node: the host reads the
// CPU's and sim devices' memory in place (memcpy and loops), and queues a GPU's work on its
// stream (copies and the CUDA backend's elementwise kernels). Each element rounds the same way
// on both (f32 add, multiply, divide), so the bits are the node's policy, not its result.
#pragma once

#include <cstdint>
#include <vector>

#include "hetrain/base/error.h"
#include "hetrain/graph/tensor.h"
#include "hetrain/memory/allocator.h"

namespace hetrain::distributed {

/// Whether the host reads and writes d's memory in place (the CPU and sim devices; not a GPU).
inline bool host_addressable(Device d) { return d.kind != DeviceKind::cuda; }
/// Whether the memory of a and b is reached by the same pointers (the same GPU, or host memory).
inline bool same_memory(Device a, Device b) {
  return host_addressable(a) ? host_addressable(b) : a == b;
}

/// A zeroed contiguous f32 array of n elements with the given tag in the memory node of `home`.
Array flat_f32(int64_t n, MemoryTag tag, Device home = Device::cpu());
/// A zeroed contiguous f32 array of n elements in host memory for copies to and from `node`:
/// page-locked memory of the CUDA backend for a GPU (its copies skip the staging buffer and run
/// asynchronously), the host allocator's otherwise.
Array staging_f32(int64_t n, MemoryTag tag, Device node);
/// The host allocator that staging_f32 uses for `node` (its statistics count those copies).
Allocator& staging_allocator(Device node);

/// Elements [off, off + n) of a contiguous f32 array (offsets in elements from a's start).
/// dst = 0.
void zero_f32(const Array& dst, int64_t off, int64_t n);
/// dst = src, between any memory nodes.
void copy_f32(const Array& dst, int64_t doff, const Array& src, int64_t soff, int64_t n);
/// dst = dst + src (src copied to dst's node first when the two do not share memory).
void add_f32(const Array& dst, int64_t doff, const Array& src, int64_t soff, int64_t n);
/// x = x / c (divide) or x * c.
void scale_f32(const Array& x, int64_t off, int64_t n, float c, bool divide);
/// a itself when `node` reads it in place (same_memory), else a contiguous copy of its n
/// elements there (tag communication): what a collective on `node`'s memory is given.
Array on_node(const Array& a, int64_t n, Device node);
/// t's values as a contiguous f32 array (t's own when it is one, else a contiguous copy on t's
/// device).
Array f32_array(const Tensor& t);

/// A tensor's values as contiguous host f32 (copied only when they are not already so).
struct HostValues {
  Tensor holder;
  std::vector<float> copy;
  const float* data = nullptr;
};
inline HostValues host_values(const Tensor& t) {
  HostValues h;
  t.eval();
  const Array& a = t.array();
  if (a.dtype == Dtype::f32 && a.contiguous() && a.device().kind == DeviceKind::cpu) {
    h.holder = t;
    h.data = a.data<float>();
  } else {
    h.copy = t.to_vector<float>();
    h.data = h.copy.data();
  }
  return h;
}

}  // namespace hetrain::distributed
