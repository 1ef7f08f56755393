// Winograd f32 convolution for 3x3 kernels at stride 1 on AVX2 + FMA (register tiles at AVX-512
// width where the CPU has it), on plain NCHW / OIHW arrays: F(2x2, 3x3), 16 transformed products
// per 2x2 output tile instead of 36, and on outputs 20 or more wide (13 to 16 in the forward
// passes) F(4x4, 3x3), 36 per 4x4 tile instead of 144. The transforms cost most where channels are
// few (16), where it gains least over the direct kernels. Each function returns false when it does
// not apply (a kernel other than 3x3, stride other than 1, padding other than 0 or 1 per side,
// images so large that one image's transformed arrays pass 8 MiB, a CPU without AVX2/FMA, or
// HETRAIN_CONV_WINOGRAD=0 in the environment), and the caller falls back to another path. Inputs
// are added up in another order than a direct convolution, so results differ from it by rounding
// (about 1e-6 of the output's scale with 2x2 tiles, 5e-6 with 4x4).
#pragma once

#include "backends/cpu/conv_dnnl.h"

namespace hetrain::cpu {

/// y (N, O, Ho, Wo) = conv(x, w) [+ b]; b may be null.
bool winograd_conv_forward(const ConvShape& s, const float* x, const float* w, const float* b,
                           float* y);
/// dx (N, C, H, W) from gy (N, O, Ho, Wo) and w (O, C, 3, 3), plus addend (of dx's shape) where
/// not null, added as dx is written.
bool winograd_conv_backward_data(const ConvShape& s, const float* gy, const float* w, float* dx,
                                 const float* addend = nullptr);
/// dw (O, C, 3, 3) from x (N, C, H, W) and gy (N, O, Ho, Wo).
bool winograd_conv_backward_weights(const ConvShape& s, const float* x, const float* gy, float* dw);

/// Turns the Winograd path off (true) or back on, for tests and benchmarks that compare paths.
/// Also off when the environment sets HETRAIN_CONV_WINOGRAD=0.
void set_winograd_conv_disabled(bool disabled);
/// How many conv passes the Winograd kernels have run in this process.
int64_t winograd_conv_runs();
/// The output tile size of the three passes: 0 (the default) picks it by the output width (the
/// input's for the input gradient), 2 or 4 forces F(2x2, 3x3) or F(4x4, 3x3), for tests and
/// benchmarks that compare them.
void set_winograd_tile_size(int64_t m);

}  // namespace hetrain::cpu
