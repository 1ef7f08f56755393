// Direct f32 convolution for strides 1 and 2 on AVX2 + FMA (register tiles at AVX-512 width where
// the CPU has it), on plain NCHW / OIHW arrays, without im2col and without layout reorders.
// conv.cpp tries it first; each function returns false when it does not apply (other strides,
// padding over kernel - 1, a 1x1 stride-1 kernel, images or outputs narrower than 12 (7 for a
// stride-2 forward larger than 1x1), or a CPU without AVX2/FMA), and the caller falls back to
// oneDNN or im2col + GEMM.
#pragma once

#include "backends/cpu/conv_dnnl.h"

namespace hetrain::cpu {

/// A second convolution of the same input (a ResNet shortcut's 1x1 beside its 3x3), which the
/// kernels below take in the same pass over the phase planes where s and this.s have stride 2
/// both ways, the same output size and this one's window inside s's (its taps are some of s's
/// taps). Its shape, and per pass: the forward reads w and writes its y to out; the input
/// gradient reads gy and w; the weight gradient reads gy and writes its dw to out. A pass with
/// a second convolution counts as two in direct_conv_runs.
struct SecondConv {
  ConvShape s;
  const float* gy = nullptr;
  const float* w = nullptr;
  float* out = nullptr;
};

/// y (N, O, Ho, Wo) = conv(x, w) [+ b]; b may be null. With second, its output too.
bool direct_conv_forward(const ConvShape& s, const float* x, const float* w, const float* b,
                         float* y, const SecondConv* second = nullptr);
/// dx (N, C, H, W) from gy (N, O, Ho, Wo) and w (O, C, kh, kw), plus addend (of dx's shape)
/// where not null, added as dx is written. With second, dx is the sum of both convolutions'
/// input gradients (plus addend). With mask (of dx's shape; stride 2 only), dx is zero where
/// mask is not > 0: relu_grad(mask, dx), a ResNet block output's relu.
bool direct_conv_backward_data(const ConvShape& s, const float* gy, const float* w, float* dx,
                               const float* addend = nullptr, const SecondConv* second = nullptr,
                               const float* mask = nullptr);
/// dw (O, C, kh, kw) from x (N, C, H, W) and gy (N, O, Ho, Wo). With second, its dw too.
bool direct_conv_backward_weights(const ConvShape& s, const float* x, const float* gy, float* dw,
                                  const SecondConv* second = nullptr);

/// Turns the direct path off (true) or back on, for tests and benchmarks that compare paths.
/// Also off when the environment sets HETRAIN_CONV_DIRECT=0.
void set_direct_conv_disabled(bool disabled);
/// How many conv passes the direct kernels have run in this process.
int64_t direct_conv_runs();

}  // namespace hetrain::cpu
