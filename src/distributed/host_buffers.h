// Flat f32 buffers shared by the gradient reducer, the sharded optimizer and the gatherer.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "hetrain/base/error.h"
#include "hetrain/graph/tensor.h"
#include "hetrain/memory/allocator.h"

namespace hetrain::distributed {

/// A zeroed contiguous f32 array of n elements with the given tag in the memory node of `home`
/// (the host, or a sim device: memory the collectives and the reducer's sums read in place).
inline Array flat_f32(int64_t n, MemoryTag tag, Device home = Device::cpu()) {
  HT_ASSERT(home.kind != DeviceKind::cuda);  // refused before (resolve_state_device)
  Array a;
  a.shape = {n};
  a.dtype = Dtype::f32;
  a.tag = tag;
  AllocationDeviceScope on(home);  // not the calling thread's device (an executor worker's)
  a.allocate();
  if (n > 0) std::memset(a.raw(), 0, a.nbytes());
  return a;
}

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
