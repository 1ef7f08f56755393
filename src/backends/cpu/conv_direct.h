// Direct f32 convolution for strides 1 and 2 on AVX2 + FMA, on plain NCHW / OIHW arrays, without
// im2col and without layout reorders. conv.cpp tries it first; each function returns false when
// it does not apply (other strides, padding over kernel - 1, a 1x1 stride-1 kernel, images or
// outputs narrower than 12 (7 for a stride-2 forward larger than 1x1), or a CPU without
// AVX2/FMA), and the caller falls back to oneDNN or im2col + GEMM.
#pragma once

#include "backends/cpu/conv_dnnl.h"

namespace hetrain::cpu {

/// y (N, O, Ho, Wo) = conv(x, w) [+ b]; b may be null.
bool direct_conv_forward(const ConvShape& s, const float* x, const float* w, const float* b,
                         float* y);
/// dx (N, C, H, W) from gy (N, O, Ho, Wo) and w (O, C, kh, kw), plus addend (of dx's shape)
/// where not null, added as dx is written.
bool direct_conv_backward_data(const ConvShape& s, const float* gy, const float* w, float* dx,
                               const float* addend = nullptr);
/// A second convolution of the same input: its shape, output gradient and weights.
struct SecondConv {
  ConvShape s;
  const float* gy;
  const float* w;
};
/// dx of both convolutions, summed (plus addend where not null), in one pass: s and second.s
/// stride 2 both ways with the same output size, second's window inside s's (a ResNet
/// shortcut's 1x1 and its 3x3 sibling). Its taps join the phase planes of s's input gradient.
/// Counts as two passes in direct_conv_runs.
bool direct_conv_backward_data(const ConvShape& s, const float* gy, const float* w, float* dx,
                               const float* addend, const SecondConv& second);
/// dw (O, C, kh, kw) from x (N, C, H, W) and gy (N, O, Ho, Wo).
bool direct_conv_backward_weights(const ConvShape& s, const float* x, const float* gy, float* dw);

/// Turns the direct path off (true) or back on, for tests and benchmarks that compare paths.
/// Also off when the environment sets HETRAIN_CONV_DIRECT=0.
void set_direct_conv_disabled(bool disabled);
/// How many conv passes the direct kernels have run in this process.
int64_t direct_conv_runs();

}  // namespace hetrain::cpu
