// Checked calls into the CUDA runtime and cuBLAS(Lt): a failure throws hetrain::Error with
// the call, file:line and the library's own error name and text.
//
//   HT_CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, stream));
//   my_kernel<<<grid, block, 0, stream>>>(...);
//   HT_CUDA_CHECK_LAUNCH("my_kernel");
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

namespace hetrain::cuda {

[[noreturn]] void fail_cuda(cudaError_t e, const char* call, const char* file, int line);
[[noreturn]] void fail_cublas(cublasStatus_t s, const char* call, const char* file, int line);

inline void check_cuda(cudaError_t e, const char* call, const char* file, int line) {
  if (e != cudaSuccess) fail_cuda(e, call, file, line);
}
inline void check_cublas(cublasStatus_t s, const char* call, const char* file, int line) {
  if (s != CUBLAS_STATUS_SUCCESS) fail_cublas(s, call, file, line);
}

}  // namespace hetrain::cuda

#define HT_CUDA_CHECK(call) ::hetrain::cuda::check_cuda((call), #call, __FILE__, __LINE__)
#define HT_CUBLAS_CHECK(call) ::hetrain::cuda::check_cublas((call), #call, __FILE__, __LINE__)
/// After a kernel launch: reports a bad launch configuration at the launch site.
#define HT_CUDA_CHECK_LAUNCH(name) \
  ::hetrain::cuda::check_cuda(cudaGetLastError(), "launch of " name, __FILE__, __LINE__)
