// Host-side helpers for the eval_cuda implementations: the current device's stream,
// elementwise iterations over arrays, device workspaces and strided copies.
#pragma once

#include <cuda_runtime_api.h>

#include <initializer_list>

#include "backends/cuda/kernels.h"
#include "hetrain/memory/array.h"

namespace hetrain::cuda {

/// The stream of the calling thread's current device (the one eval_cuda runs on).
cudaStream_t stream();
/// An iteration over shape for the given arrays (the output first, all of that shape):
/// size-1 dimensions dropped, dimensions that are contiguous in every operand merged.
Iter make_iter(const Shape& shape, std::initializer_list<const Array*> operands);
/// A fresh contiguous array on the current device (tag workspace unless given).
Array device_array(const Shape& shape, Dtype dt, MemoryTag tag = MemoryTag::workspace);
/// Copies x's elements into y (same shape, any strides, converting dtype), on the device.
void copy_strided(const Array& x, Array& y);
/// x when already contiguous, else a contiguous device copy.
Array contiguous(const Array& x);
/// Sets every byte of a's buffer view (a contiguous) to zero, asynchronously.
void zero(Array& a);

}  // namespace hetrain::cuda
