// The CUDA backend as the rest of Hetrain sees it: device enumeration, memory nodes, copies
// and per-thread device binding. Plain C++ (no CUDA headers); compiled only when the build
// has the backend (HETRAIN_HAVE_CUDA), so callers guard their use with that macro.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "hetrain/memory/allocator.h"

namespace hetrain::cuda {

inline constexpr int kMaxDevices = kMaxCudaDevices;

/// Devices visible to this process: 0 without a driver or without a device (not an error).
int device_count();
/// "NVIDIA H200 (sm_90, 132 SMs, 139.8 GiB)"; throws for an absent device.
std::string device_name(int index);
/// The model name alone, "NVIDIA H200" (performance models are kept per GPU model).
std::string device_model(int index);
/// One line for `hetrain --version`: runtime and driver versions and the devices found (or
/// why none was).
std::string describe();
/// Throws the "no such CUDA device" error, listing `found` (the devices the caller has).
[[noreturn]] void fail_no_device(int index, const std::string& found);
/// Throws that error, listing cpu and this process's CUDA devices, unless index names one.
void check_device(int index);

/// The caching allocator of device index's memory node (created on first use).
Allocator& device_allocator(int index);
/// Bytes currently allocated (not cached) on all CUDA devices together.
int64_t memory_in_use();

/// Copies bytes between memory nodes, at least one of them a CUDA device: host to device
/// goes through a pinned staging buffer, asynchronously on the device's stream (later work
/// on that stream sees the data); device to host waits until the bytes have arrived.
void copy(const void* src, Device src_dev, void* dst, Device dst_dev, size_t bytes);

/// Makes device index current on the calling thread (a device worker does this once).
void bind_thread(int index);
/// Waits until all work queued on device index's stream has finished; rethrows a kernel's
/// asynchronous error as an Error.
void synchronize(int index);

}  // namespace hetrain::cuda
