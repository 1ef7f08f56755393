// Vector kernels compiled for wider ISAs than the baseline (target attributes) and chosen at
// run time from cpu_features(), so the binary still runs on any x86-64.
#pragma once

#include <cstdint>

namespace hetrain::cpu {

/// y[i] = exp(x[i]) for n contiguous floats; a vector kernel where the CPU has AVX2 and FMA,
/// std::exp otherwise. Within 2 ulp of std::exp; inf, nan and subnormal results are exact
/// (lanes outside [-87, 88] go through std::exp).
void exp_f32(const float* x, float* y, int64_t n);

/// IEEE binary16 <-> f32 for n contiguous values: F16C where the CPU has it (8 lanes per
/// instruction), the scalar half_to_float/float_to_half otherwise. Both round to nearest even;
/// the results are the same bits (NaN payloads aside).
void f16_to_f32(const uint16_t* x, float* y, int64_t n);
void f32_to_f16(const float* x, uint16_t* y, int64_t n);

}  // namespace hetrain::cpu
