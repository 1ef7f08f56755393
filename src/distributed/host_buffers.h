// Host f32 buffers shared by the gradient reducer and the sharded optimizer.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "hetrain/graph/tensor.h"

namespace hetrain::distributed {

/// A zeroed contiguous host f32 array of n elements with the given tag.
inline Array host_f32(int64_t n, MemoryTag tag) {
  Array a;
  a.shape = {n};
  a.dtype = Dtype::f32;
  a.tag = tag;
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
