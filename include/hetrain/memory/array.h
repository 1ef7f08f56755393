// A strided view of a buffer: what kernels read and write. Knows nothing of graphs.
#pragma once

#include <memory>

#include "hetrain/base/dtype.h"
#include "hetrain/base/shape.h"
#include "hetrain/memory/allocator.h"

namespace hetrain {

struct Array {
  Shape shape;
  Dtype dtype = Dtype::f32;
  Strides strides;     // elements; valid once the array holds data
  int64_t offset = 0;  // elements from the buffer start
  MemoryTag tag = MemoryTag::activations;
  std::shared_ptr<Buffer> buffer;

  bool has_data() const { return buffer != nullptr; }
  int64_t numel() const { return hetrain::numel(shape); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
  bool contiguous() const { return is_contiguous(shape, strides); }
  void* raw() const {
    return static_cast<char*>(buffer->data()) + offset * static_cast<int64_t>(dtype_size(dtype));
  }
  template <class T>
  T* data() const {
    return static_cast<T*>(raw());
  }
  /// Gives this array a fresh contiguous buffer from the host allocator, with its tag.
  void allocate();
  /// Makes this array a view of src's buffer.
  void view_of(const Array& src, Strides st, int64_t off) {
    buffer = src.buffer;
    strides = std::move(st);
    offset = off;
  }
};

}  // namespace hetrain
