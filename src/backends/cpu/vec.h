// Vector kernels compiled for wider ISAs than the baseline (target attributes) and chosen at
// run time from cpu_features(), so the binary still runs on any x86-64.
#pragma once

#include <cstdint>

namespace hetrain::cpu {

/// IEEE binary16 <-> f32 for n contiguous values: F16C where the CPU has it (8 lanes per
/// instruction), the scalar half_to_float/float_to_half otherwise. Both round to nearest even;
/// the results are the same bits (NaN payloads aside).
void f16_to_f32(const uint16_t* x, float* y, int64_t n);
void f32_to_f16(const float* x, uint16_t* y, int64_t n);

}  // namespace hetrain::cpu
