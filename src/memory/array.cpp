#include "hetrain/memory/array.h"

#include <atomic>
#include <cstring>

#include "hetrain/base/error.h"
#if HETRAIN_HAVE_CUDA
#include "backends/cuda/api.h"
#endif

namespace hetrain {

void Array::allocate() {
  strides = contiguous_strides(shape);
  offset = 0;
  AllocationSiteScope site(&shape, dtype);  // for an out-of-memory report
  buffer = AllocationDeviceScope::current().allocate(std::max<size_t>(nbytes(), 1), tag);
}

namespace {
std::atomic<int64_t> g_copies{0};
std::atomic<int64_t> g_copy_bytes{0};

/// Copies n bytes between memory nodes: memcpy between host-memory nodes (cpu, sim), the
/// CUDA backend when either side is a GPU.
void copy_bytes(const void* src, Device src_dev, void* dst, Device dst_dev, size_t n) {
  if (!n) return;
  if (src_dev.kind == DeviceKind::cuda || dst_dev.kind == DeviceKind::cuda) {
#if HETRAIN_HAVE_CUDA
    cuda::copy(src, src_dev, dst, dst_dev, n);
    return;
#else
    fail("[copy] ", src_dev.str(), " -> ", dst_dev.str(), ": no CUDA backend in this build");
#endif
  }
  std::memcpy(dst, src, n);
}
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
    copy_bytes(src.raw(), src.device(), out.buffer->data(), dst, n);
    g_copy_bytes.fetch_add(static_cast<int64_t>(n), std::memory_order_relaxed);
  } else {
    const size_t n = src.buffer->bytes();
    out.buffer = alloc.allocate(std::max<size_t>(n, 1), src.buffer->tag());
    copy_bytes(src.buffer->data(), src.device(), out.buffer->data(), dst, n);
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
