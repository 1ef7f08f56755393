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
  /// The device whose memory node holds the data (the CPU for an array without data).
  Device device() const { return buffer ? buffer->device() : Device::cpu(); }
  /// Makes this array a view of src's buffer.
  void view_of(const Array& src, Strides st, int64_t off) {
    buffer = src.buffer;
    strides = std::move(st);
    offset = off;
  }
};

/// Copies src's data into dst's memory node: a real copy, counted in transfer_stats(). A
/// contiguous array moves nbytes() and lands contiguous; a strided view moves its whole
/// buffer and keeps its strides and offset (no gather kernel here). To or from a CUDA device
/// the bytes go through pinned staging on the device's stream: a copy to the GPU is ordered
/// before the device's later kernels, a copy to the host returns once the data has arrived.
Array copy_to_device(const Array& src, Device dst);

struct TransferStats {
  int64_t copies = 0;
  int64_t bytes = 0;
};
/// Copies between memory nodes since the process started (or the last reset).
TransferStats transfer_stats();
void reset_transfer_stats();

}  // namespace hetrain
