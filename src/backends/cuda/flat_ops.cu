// Elementwise updates of flat f32 buffers (ZeRO's gradient sums and scaling): the rounded
// intrinsics keep each element's arithmetic the CPU's (no contraction into an FMA).
#include "backends/cuda/check.h"
#include "backends/cuda/context.h"
#include "backends/cuda/flat_buffers.h"

namespace hetrain::cuda {

namespace {

constexpr int kThreads = 256;

int blocks_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<int>(b < 65535 ? b : 65535);
}

__global__ void add_f32_kernel(float* dst, const float* src, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    dst[i] = __fadd_rn(dst[i], src[i]);
}

__global__ void scale_f32_kernel(float* x, float c, bool divide, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    x[i] = divide ? __fdiv_rn(x[i], c) : __fmul_rn(x[i], c);
}

}  // namespace

void add_f32(float* dst, const float* src, int64_t n, int index) {
  if (n <= 0) return;
  DeviceGuard guard(index);
  add_f32_kernel<<<blocks_for(n), kThreads, 0, context(index).stream>>>(dst, src, n);
  HT_CUDA_CHECK_LAUNCH("add_f32_kernel");
}

void scale_f32(float* x, float c, bool divide, int64_t n, int index) {
  if (n <= 0) return;
  DeviceGuard guard(index);
  scale_f32_kernel<<<blocks_for(n), kThreads, 0, context(index).stream>>>(x, c, divide, n);
  HT_CUDA_CHECK_LAUNCH("scale_f32_kernel");
}

void fill_zero(void* p, size_t bytes, int index) {
  if (bytes == 0) return;
  DeviceGuard guard(index);
  HT_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, context(index).stream));
}

void* stream_handle(int index) { return context(index).stream; }

}  // namespace hetrain::cuda
