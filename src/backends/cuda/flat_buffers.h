// What ZeRO's flat buffers need of the CUDA backend beyond api.h: elementwise sums and scaling
// on a device's stream, that stream for NCCL, and page-locked host memory for offload's
// copies. Plain C++ (no CUDA headers); compiled only with the backend (HETRAIN_HAVE_CUDA).
#pragma once

#include <cstddef>
#include <cstdint>

#include "hetrain/memory/allocator.h"

namespace hetrain::cuda {

/// Page-locked host memory for copies to and from device index (ZeRO offload's host copies):
/// its arrays are host memory (Device::cpu()), cached by size and counted by tag on their own;
/// a freed block is reused only once the work queued on the device's stream by then is done.
/// copy() (api.h) moves such a block without staging: to the device asynchronously (so the
/// host must not write the block until the stream has passed the copy), from it at once.
Allocator& pinned_host_allocator(int index);
/// Whether [p, p + bytes) lies in one live block of a pinned_host_allocator (copy() moves such
/// memory without staging; other page-locked memory, another library's, is staged).
bool is_pinned_block(const void* p, size_t bytes);

/// Elementwise work on f32 buffers of device index, queued on its stream in order with its
/// kernels and copies (nothing waits): dst[i] = dst[i] + src[i]; x[i] = x[i] / c (divide) or
/// x[i] * c; zeroes `bytes` bytes at p. Each element rounds as the CPU's f32 arithmetic does.
void add_f32(float* dst, const float* src, int64_t n, int index);
void scale_f32(float* x, float c, bool divide, int64_t n, int index);
void fill_zero(void* p, size_t bytes, int index);
/// Device index's stream (a cudaStream_t), for work on other streams that must be ordered
/// with its kernels (NCCL's collectives).
void* stream_handle(int index);

}  // namespace hetrain::cuda
