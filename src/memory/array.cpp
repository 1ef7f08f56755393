#include "hetrain/memory/array.h"

#include <atomic>
#include <cstring>

#include "hetrain/base/error.h"

namespace hetrain {

void Array::allocate() {
  strides = contiguous_strides(shape);
  offset = 0;
  buffer = AllocationDeviceScope::current().allocate(std::max<size_t>(nbytes(), 1), tag);
}

namespace {
std::atomic<int64_t> g_copies{0};
std::atomic<int64_t> g_copy_bytes{0};
}  // namespace

Array copy_to_device(const Array& src, Device dst) {
  if (!src.has_data()) fail("[copy] cannot copy an array without data to ", dst.str());
  Array out = src;
  Allocator& alloc = allocator_for(dst);
  if (src.contiguous()) {
    const size_t n = src.nbytes();
    out.buffer = alloc.allocate(std::max<size_t>(n, 1), src.buffer->tag());
    out.strides = contiguous_strides(src.shape);
    out.offset = 0;
    if (n) std::memcpy(out.buffer->data(), src.raw(), n);
    g_copy_bytes.fetch_add(static_cast<int64_t>(n), std::memory_order_relaxed);
  } else {
    const size_t n = src.buffer->bytes();
    out.buffer = alloc.allocate(std::max<size_t>(n, 1), src.buffer->tag());
    if (n) std::memcpy(out.buffer->data(), src.buffer->data(), n);
    g_copy_bytes.fetch_add(static_cast<int64_t>(n), std::memory_order_relaxed);
  }
  g_copies.fetch_add(1, std::memory_order_relaxed);
  return out;
}

TransferStats transfer_stats() { return {g_copies.load(), g_copy_bytes.load()}; }
void reset_transfer_stats() {
  g_copies = 0;
  g_copy_bytes = 0;
}

}  // namespace hetrain
