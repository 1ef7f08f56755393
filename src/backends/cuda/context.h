// Per-device state of the CUDA backend: the stream all of a device's kernels and copies are
// queued on, a cuBLASLt handle and its workspace. Created on first use, never destroyed
// (tensors held in statics may free device memory during exit).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <string>

namespace hetrain::cuda {

struct DeviceContext {
  int index = 0;
  cudaDeviceProp props{};
  /// Kernels and copies of this device, in the order the runtime queues them. One stream
  /// keeps the caching allocator's reuse safe without cross-stream events.
  cudaStream_t stream = nullptr;
  cublasLtHandle_t lt = nullptr;
  void* lt_workspace = nullptr;  // cuBLASLt scratch, on this device
  size_t lt_workspace_bytes = 0;
};

/// The context of device index (throws naming the devices found when it is absent).
DeviceContext& context(int index);
/// The context of the calling thread's current device.
DeviceContext& current_context();

/// Sets the current device for a scope and restores the previous one.
class DeviceGuard {
 public:
  explicit DeviceGuard(int index);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = -1;
};

}  // namespace hetrain::cuda
