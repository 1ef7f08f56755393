// Vector kernels compiled for wider ISAs than the baseline (target attributes) and chosen at
// run time from cpu_features(), so the binary still runs on any x86-64.
#pragma once

#include <cstdint>

namespace hetrain::cpu {

/// y[i] = exp(x[i]) for n contiguous floats; a vector kernel where the CPU has AVX2 and FMA,
/// std::exp otherwise. Within 2 ulp of std::exp; inf, nan and subnormal results are exact
/// (lanes outside [-87, 88] go through std::exp).
void exp_f32(const float* x, float* y, int64_t n);

}  // namespace hetrain::cpu
