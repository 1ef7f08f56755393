// f32 and bf16 convolution through oneDNN's convolution primitives (forward, backward data,
// backward weights) on plain NCHW / OIHW arrays. conv.cpp calls these first and falls back to its
// im2col + GEMM kernels (which also serve f64) when they return false: for shapes where
// oneDNN does not pay (1x1 kernels, fewer than 8 channels) or has only a reference kernel.
#pragma once

#include <cstdint>

#include "backends/cpu/path_choice.h"
#include "hetrain/base/dtype.h"

namespace hetrain::cpu {

/// Geometry of one 2-D convolution, groups = 1, no dilation.
struct ConvShape {
  int64_t N, C, H, W;  // input
  int64_t O, Ho, Wo;   // output
  int64_t kh, kw, sh, sw, ph, pw;
};

/// y (N, O, Ho, Wo) = conv(x, w) [+ b]; b may be null.
bool dnnl_conv_forward(const ConvShape& s, const float* x, const float* w, const float* b,
                       float* y);
/// dx (N, C, H, W) from gy (N, O, Ho, Wo) and w (O, C, kh, kw).
bool dnnl_conv_backward_data(const ConvShape& s, const float* gy, const float* w, float* dx);
/// dw (O, C, kh, kw) from x (N, C, H, W) and gy (N, O, Ho, Wo).
bool dnnl_conv_backward_weights(const ConvShape& s, const float* x, const float* gy, float* dw);

/// bf16, where the CPU computes in bf16 (AVX512-BF16 or AMX) and bf16_gemm_path() takes
/// oneDNN's bf16 kernels (dnnl_bf16_conv(); elsewhere callers convert to f32); f32
/// accumulation, bf16 outputs except the weight gradient, which is f32 (one rounding after the
/// chunks' sum, by the caller). False where oneDNN has no fast bf16 kernel for the shape.
bool dnnl_bf16_conv();
bool dnnl_conv_forward(const ConvShape& s, const BFloat16* x, const BFloat16* w, const BFloat16* b,
                       BFloat16* y);
bool dnnl_conv_backward_data(const ConvShape& s, const BFloat16* gy, const BFloat16* w,
                             BFloat16* dx);
bool dnnl_conv_backward_weights(const ConvShape& s, const BFloat16* x, const BFloat16* gy,
                                float* dw);

/// Turns the oneDNN path off (true) or back on; for tests and benchmarks that compare it with the
/// im2col kernels. Also off when the environment sets HETRAIN_CONV_DNNL=0.
void set_dnnl_conv_disabled(bool disabled);
bool dnnl_conv_disabled();
/// How many conv passes oneDNN has run in this process (tests check the path was taken).
int64_t dnnl_conv_runs();

/// Which f32 kernels a convolution pass tries first: the engine's own (Winograd, then the
/// direct kernels, then oneDNN) or oneDNN's (then the engine's own where oneDNN declines the
/// shape). HETRAIN_CONV_PATH=own|onednn where set, else the faster in this machine's device
/// profile ('hetrain bench' times both on convolution layers), else conv_rule_path().
enum class ConvPath { own, onednn };
ConvPath conv_path();
/// Where nothing was measured: the engine's own kernels, faster on AVX2 (fashion-cnn's f32 step
/// 63 ms against 68-73 ms with oneDNN first, Intel Xeon held to AVX2, docs/PERFORMANCE.md).
/// With AVX-512 oneDNN's were faster there (47 ms against 59), so 'hetrain bench' measures.
ConvPath conv_rule_path();
/// The choice behind conv_path() (paths numbered as ConvPath).
PathChoice& conv_choice();

}  // namespace hetrain::cpu
