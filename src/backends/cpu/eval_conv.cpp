// CPU convolution and pooling. bf16 runs on oneDNN's bf16 kernels where the CPU computes in bf16
// (AVX512-BF16, AMX) and the node is a plain convolution. f32 (and f16/bf16 otherwise, converted
// to f32 around it) goes through the
// direct stride-1 and stride-2 kernels (conv_direct.cpp) where they apply, then oneDNN's
// convolution primitives (conv_dnnl.cpp); f64, and shapes neither has a fast kernel for, use im2col
// + GEMM per image (col2im for the input gradient).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <type_traits>
#include <utility>

#include "backends/cpu/compute_buffers.h"
#include "backends/cpu/conv_direct.h"
#include "backends/cpu/conv_dnnl.h"
#include "backends/cpu/conv_winograd.h"
#include "graph/prims/conv.h"
#include "hetrain/base/dispatch.h"
#include "hetrain/base/thread_pool.h"

namespace hetrain {

namespace {

using cpu::as_contiguous;
using cpu::compute_dtype;
using cpu::dispatch_compute;
using cpu::finish_output;
using cpu::gemm;
using cpu::start_output;
using cpu::workspace;

/// Floor division for a possibly negative numerator and a positive divisor.
int64_t floor_div(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

/// Output columns [lo, hi) whose input column ow*s - p + kj lies inside [0, W).
std::pair<int64_t, int64_t> valid_cols(int64_t W, int64_t Wo, int64_t s, int64_t p, int64_t kj) {
  const int64_t lo = std::clamp<int64_t>(-floor_div(kj - p, s), 0, Wo);
  const int64_t hi = std::clamp<int64_t>(floor_div(W - 1 + p - kj, s) + 1, lo, Wo);
  return {lo, hi};
}

struct ConvGeom {
  int64_t N, C, H, W, O, Ho, Wo, kh, kw;
  Window2d win;
  int64_t ckk() const { return C * kh * kw; }
  int64_t howo() const { return Ho * Wo; }
  /// 1x1, stride 1, no padding: the image itself is the column matrix.
  bool pointwise() const {
    return kh == 1 && kw == 1 && win.stride[0] == 1 && win.stride[1] == 1 && win.padding[0] == 0 &&
           win.padding[1] == 0;
  }
};

ConvGeom geom(const Shape& x, const Shape& y, const Window2d& win) {
  return {x[0], x[1], x[2], x[3], y[1], y[2], y[3], win.kernel[0], win.kernel[1], win};
}

cpu::ConvShape dnnl_shape(const ConvGeom& g) {
  const auto &s = g.win.stride, &p = g.win.padding;
  return {g.N, g.C, g.H, g.W, g.O, g.Ho, g.Wo, g.kh, g.kw, s[0], s[1], p[0], p[1]};
}

/// col (C*kh*kw, Ho*Wo) from one image x (C, H, W); zeros where the window hits padding.
template <class T>
void im2col(const T* x, T* col, const ConvGeom& g) {
  const int64_t s0 = g.win.stride[0], s1 = g.win.stride[1];
  const int64_t p0 = g.win.padding[0], p1 = g.win.padding[1];
  for (int64_t c = 0; c < g.C; ++c)
    for (int64_t ki = 0; ki < g.kh; ++ki)
      for (int64_t kj = 0; kj < g.kw; ++kj) {
        T* row = col + ((c * g.kh + ki) * g.kw + kj) * g.howo();
        const auto [lo, hi] = valid_cols(g.W, g.Wo, s1, p1, kj);
        for (int64_t oh = 0; oh < g.Ho; ++oh) {
          T* r = row + oh * g.Wo;
          const int64_t ih = oh * s0 - p0 + ki;
          if (ih < 0 || ih >= g.H) {
            std::fill(r, r + g.Wo, T(0));
            continue;
          }
          const T* xr = x + (c * g.H + ih) * g.W - p1 + kj;
          std::fill(r, r + lo, T(0));
          if (s1 == 1) {
            std::memcpy(r + lo, xr + lo, static_cast<size_t>(hi - lo) * sizeof(T));
          } else {
            for (int64_t ow = lo; ow < hi; ++ow) r[ow] = xr[ow * s1];
          }
          std::fill(r + hi, r + g.Wo, T(0));
        }
      }
}

/// Adds col (C*kh*kw, Ho*Wo) back into one image dx (C, H, W), which starts zeroed.
template <class T>
void col2im(const T* col, T* dx, const ConvGeom& g) {
  const int64_t s0 = g.win.stride[0], s1 = g.win.stride[1];
  const int64_t p0 = g.win.padding[0], p1 = g.win.padding[1];
  std::fill(dx, dx + g.C * g.H * g.W, T(0));
  for (int64_t c = 0; c < g.C; ++c)
    for (int64_t ki = 0; ki < g.kh; ++ki)
      for (int64_t kj = 0; kj < g.kw; ++kj) {
        const T* row = col + ((c * g.kh + ki) * g.kw + kj) * g.howo();
        const auto [lo, hi] = valid_cols(g.W, g.Wo, s1, p1, kj);
        for (int64_t oh = 0; oh < g.Ho; ++oh) {
          const int64_t ih = oh * s0 - p0 + ki;
          if (ih < 0 || ih >= g.H) continue;
          const T* r = row + oh * g.Wo;
          T* xr = dx + (c * g.H + ih) * g.W - p1 + kj;
          for (int64_t ow = lo; ow < hi; ++ow) xr[ow * s1] += r[ow];
        }
      }
}

/// Splits [0, n) images into one chunk per thread: each chunk owns its column buffer.
void for_image_chunks(int64_t n, const std::function<void(int64_t, int64_t, int64_t)>& fn) {
  const int64_t chunks = std::min<int64_t>(n, num_threads());
  parallel_for(chunks, 1, [&](int64_t cb, int64_t ce) {
    for (int64_t c = cb; c < ce; ++c) fn(c, c * n / chunks, (c + 1) * n / chunks);
  });
}

template <class T>
void conv_forward(const T* x, const T* w, const T* b, T* y, const ConvGeom& g, Dtype dt) {
  for_image_chunks(g.N, [&](int64_t, int64_t n0, int64_t n1) {
    Array col;
    if (!g.pointwise()) col = workspace({g.ckk(), g.howo()}, dt);
    for (int64_t n = n0; n < n1; ++n) {
      const T* xn = x + n * g.C * g.H * g.W;
      const T* cn = xn;
      if (!g.pointwise()) {
        im2col(xn, col.data<T>(), g);
        cn = col.data<T>();
      }
      T* yn = y + n * g.O * g.howo();
      gemm<T>(false, false, g.O, g.howo(), g.ckk(), T(1), w, g.ckk(), cn, g.howo(), T(0), yn,
              g.howo());
      if (b)
        for (int64_t o = 0; o < g.O; ++o)
          for (int64_t i = 0; i < g.howo(); ++i) yn[o * g.howo() + i] += b[o];
    }
  });
}

template <class T>
void conv_backward_input(const T* gy, const T* w, T* dx, const ConvGeom& g, Dtype dt) {
  for_image_chunks(g.N, [&](int64_t, int64_t n0, int64_t n1) {
    Array col;
    if (!g.pointwise()) col = workspace({g.ckk(), g.howo()}, dt);
    for (int64_t n = n0; n < n1; ++n) {
      const T* gn = gy + n * g.O * g.howo();
      T* dxn = dx + n * g.C * g.H * g.W;
      T* cn = g.pointwise() ? dxn : col.data<T>();
      gemm<T>(true, false, g.ckk(), g.howo(), g.O, T(1), w, g.ckk(), gn, g.howo(), T(0), cn,
              g.howo());
      if (!g.pointwise()) col2im(cn, dxn, g);
    }
  });
}

template <class T>
void conv_backward_weight(const T* x, const T* gy, T* dw, const ConvGeom& g, Dtype dt) {
  const int64_t chunks = std::min<int64_t>(g.N, num_threads());
  const int64_t wsize = g.O * g.ckk();
  // Chunk 0 accumulates into dw; the others into partial sums added at the end.
  Array partial;
  if (chunks > 1) partial = workspace({chunks - 1, wsize}, dt);
  for_image_chunks(g.N, [&](int64_t c, int64_t n0, int64_t n1) {
    T* acc = c == 0 ? dw : partial.data<T>() + (c - 1) * wsize;
    Array col;
    if (!g.pointwise()) col = workspace({g.ckk(), g.howo()}, dt);
    for (int64_t n = n0; n < n1; ++n) {
      const T* xn = x + n * g.C * g.H * g.W;
      const T* cn = xn;
      if (!g.pointwise()) {
        im2col(xn, col.data<T>(), g);
        cn = col.data<T>();
      }
      gemm<T>(false, true, g.O, g.ckk(), g.howo(), T(1), gy + n * g.O * g.howo(), g.howo(), cn,
              g.howo(), n == n0 ? T(0) : T(1), acc, g.ckk());
    }
  });
  for (int64_t c = 1; c < chunks; ++c) {
    const T* p = partial.data<T>() + (c - 1) * wsize;
    for (int64_t i = 0; i < wsize; ++i) dw[i] += p[i];
  }
}

/// f32 convolutions try Winograd (F(2x2,3x3) or F(4x4,3x3)) first, then the direct kernels
/// (strides 1 and 2), then oneDNN, then im2col + GEMM; each kernel declines shapes it cannot do.
/// Where cpu::conv_path() is onednn, oneDNN comes first, and two convolutions that the direct
/// stride-2 kernel would take in one pass (a residual block's shortcut) run one by one.
/// Winograd is skipped where a side has fewer than 8 channels: the transforms then outweigh the
/// products it saves (fashion-cnn's 1 -> 16 stem ran 1.7-2.5x slower than the direct kernels;
/// bench_conv BM_Conv/0, one thread).
bool winograd_pays(const cpu::ConvShape& s) { return std::min(s.C, s.O) >= 8; }
bool dnnl_first() { return cpu::conv_path() == cpu::ConvPath::onednn; }

/// y = conv(x, w) [+ b] in compute dtype dt on the first kernel that takes it.
void forward_any(const Array& x, const Array& w, const Array& b, Array& y, const ConvGeom& g,
                 Dtype dt) {
  dispatch_compute(dt, [&]<class T>() {
    const T* bp = b.has_data() ? b.data<T>() : nullptr;
    if constexpr (std::is_same_v<T, float>) {
      const cpu::ConvShape s = dnnl_shape(g);
      const bool first = dnnl_first();
      if ((first && cpu::dnnl_conv_forward(s, x.data<T>(), w.data<T>(), bp, y.data<T>())) ||
          (winograd_pays(s) &&
           cpu::winograd_conv_forward(s, x.data<T>(), w.data<T>(), bp, y.data<T>())) ||
          cpu::direct_conv_forward(s, x.data<T>(), w.data<T>(), bp, y.data<T>()) ||
          (!first && cpu::dnnl_conv_forward(s, x.data<T>(), w.data<T>(), bp, y.data<T>())))
        return;
    }
    conv_forward<T>(x.data<T>(), w.data<T>(), bp, y.data<T>(), g, dt);
  });
}

/// dw = the weight gradient from x and gy in compute dtype dt on the first kernel that takes it.
void backward_weight_any(const Array& x, const Array& gy, Array& dw, const ConvGeom& g, Dtype dt) {
  dispatch_compute(dt, [&]<class T>() {
    if (g.N == 0) {
      std::fill(dw.data<T>(), dw.data<T>() + dw.numel(), T(0));
      return;
    }
    if constexpr (std::is_same_v<T, float>) {
      const cpu::ConvShape s = dnnl_shape(g);
      const bool first = dnnl_first();
      if ((first && cpu::dnnl_conv_backward_weights(s, x.data<T>(), gy.data<T>(), dw.data<T>())) ||
          (winograd_pays(s) &&
           cpu::winograd_conv_backward_weights(s, x.data<T>(), gy.data<T>(), dw.data<T>())) ||
          cpu::direct_conv_backward_weights(s, x.data<T>(), gy.data<T>(), dw.data<T>()) ||
          (!first && cpu::dnnl_conv_backward_weights(s, x.data<T>(), gy.data<T>(), dw.data<T>())))
        return;
    }
    conv_backward_weight<T>(x.data<T>(), gy.data<T>(), dw.data<T>(), g, dt);
  });
}
// bf16 on oneDNN's bf16 kernels: inputs and outputs stay bf16 (f32 accumulation); the weight
// gradient is summed in f32 and rounded once. Each returns false where they do not run (no bf16
// unit, or no fast kernel for the shape): the caller then computes in f32.
bool forward_bf16(const std::vector<const Array*>& in, Array& y, const Window2d& win) {
  if (!cpu::dnnl_bf16_conv()) return false;
  Array x = as_contiguous(*in[0], Dtype::bf16), w = as_contiguous(*in[1], Dtype::bf16);
  Array b = in.size() > 2 ? as_contiguous(*in[2], Dtype::bf16) : Array();
  Array out = start_output(y, Dtype::bf16);
  return cpu::dnnl_conv_forward(dnnl_shape(geom(x.shape, y.shape, win)), x.data<BFloat16>(),
                                w.data<BFloat16>(), b.has_data() ? b.data<BFloat16>() : nullptr,
                                out.data<BFloat16>());
}
bool backward_input_bf16(const std::vector<const Array*>& in, Array& dx, const Window2d& win) {
  if (!cpu::dnnl_bf16_conv()) return false;
  Array gy = as_contiguous(*in[0], Dtype::bf16), w = as_contiguous(*in[1], Dtype::bf16);
  Array out = start_output(dx, Dtype::bf16);
  return cpu::dnnl_conv_backward_data(dnnl_shape(geom(dx.shape, gy.shape, win)),
                                      gy.data<BFloat16>(), w.data<BFloat16>(),
                                      out.data<BFloat16>());
}
bool backward_weight_bf16(const std::vector<const Array*>& in, Array& dw, const Window2d& win) {
  if (!cpu::dnnl_bf16_conv()) return false;
  Array x = as_contiguous(*in[0], Dtype::bf16), gy = as_contiguous(*in[1], Dtype::bf16);
  Array acc = start_output(dw, Dtype::f32);
  if (!cpu::dnnl_conv_backward_weights(dnnl_shape(geom(x.shape, gy.shape, win)), x.data<BFloat16>(),
                                       gy.data<BFloat16>(), acc.data<float>()))
    return false;
  finish_output(acc, dw);
  return true;
}
}  // namespace

void Conv2d::eval_cpu(const std::vector<const Array*>& in, const std::vector<Array*>& out) const {
  if (in[0]->dtype == Dtype::bf16 && !second_ && forward_bf16(in, *out[0], win_)) return;
  const Dtype dt = compute_dtype(in[0]->dtype);
  Array x = as_contiguous(*in[0], dt), w = as_contiguous(*in[1], dt);
  Array y = start_output(*out[0], dt);
  const ConvGeom g = geom(x.shape, y.shape, win_);
  if (second_) {
    // Both convolutions from one split of x into phase planes where the stride-2 direct kernel
    // takes them; one after the other elsewhere.
    Array w2 = as_contiguous(*in[2], dt), y2 = start_output(*out[1], dt);
    const ConvGeom g2 = geom(x.shape, y2.shape, *second_);
    const cpu::SecondConv second{dnnl_shape(g2), nullptr, w2.data<float>(), y2.data<float>()};
    if (dt != Dtype::f32 || dnnl_first() ||
        !cpu::direct_conv_forward(dnnl_shape(g), x.data<float>(), w.data<float>(), nullptr,
                                  y.data<float>(), &second)) {
      forward_any(x, w, Array(), y, g, dt);
      forward_any(x, w2, Array(), y2, g2, dt);
    }
    finish_output(y2, *out[1]);
  } else {
    Array b;
    if (in.size() > 2) b = as_contiguous(*in[2], dt);
    forward_any(x, w, b, y, g, dt);
  }
  finish_output(y, *out[0]);
}

void Conv2dBackwardInput::eval_cpu(const std::vector<const Array*>& in,
                                   const std::vector<Array*>& out) const {
  if (in[0]->dtype == Dtype::bf16 && !second_ && !addend_ && !mask_ &&
      backward_input_bf16(in, *out[0], win_))
    return;
  const Dtype dt = compute_dtype(in[0]->dtype);
  Array gy = as_contiguous(*in[0], dt), w = as_contiguous(*in[1], dt);
  Array r = addend_ ? as_contiguous(*in[second_ ? 4 : 2], dt) : Array();
  Array m = mask_ ? as_contiguous(*in.back(), dt) : Array();
  Array dx = start_output(*out[0], dt);
  const ConvGeom g = geom(dx.shape, gy.shape, win_);
  // The stride-2 direct kernel zeroes dx where the mask is not > 0 as it writes dx; elsewhere a
  // pass after it does.
  const float* mask = mask_ && dt == Dtype::f32 && g.win.stride[0] == 2 ? m.data<float>() : nullptr;
  bool done = false, masked = false;  // dx written; the mask applied to it
  if (second_) {
    // The stride-2 direct kernel takes both convolutions in one pass; elsewhere the second's
    // gradient (with the addend) is computed first and joins this one's as its addend.
    Array gy2 = as_contiguous(*in[2], dt), w2 = as_contiguous(*in[3], dt);
    const cpu::SecondConv second{dnnl_shape(geom(dx.shape, gy2.shape, *second_)), gy2.data<float>(),
                                 w2.data<float>()};
    done = dt == Dtype::f32 && !dnnl_first() &&
           cpu::direct_conv_backward_data(dnnl_shape(g), gy.data<float>(), w.data<float>(),
                                          dx.data<float>(), addend_ ? r.data<float>() : nullptr,
                                          &second, mask);
    masked = done && mask;
    if (!done) {
      Array sum;
      sum.shape = dx.shape;
      sum.dtype = dt;
      sum.tag = MemoryTag::workspace;
      std::vector<const Array*> in2{&gy2, &w2};
      if (addend_) in2.push_back(&r);
      Conv2dBackwardInput(*second_, in_hw_, addend_).eval_cpu(in2, {&sum});
      r = sum;
    }
  }
  dispatch_compute(dt, [&]<class T>() {
    T* dp = dx.data<T>();
    if (!done) {
      const T* rp = addend_ || second_ ? r.data<T>() : nullptr;
      bool added = false;
      if constexpr (std::is_same_v<T, float>) {
        // Winograd and the direct kernels add r as they write dx; the others after it.
        const cpu::ConvShape s = dnnl_shape(g);
        const bool first = dnnl_first();
        const auto dnnl = [&] {
          return cpu::dnnl_conv_backward_data(s, gy.data<T>(), w.data<T>(), dp);
        };
        if (first && dnnl()) {
          // oneDNN took it; r and the mask follow below
        } else if (winograd_pays(s) &&
                   cpu::winograd_conv_backward_data(s, gy.data<T>(), w.data<T>(), dp, rp)) {
          added = true;
        } else if (cpu::direct_conv_backward_data(s, gy.data<T>(), w.data<T>(), dp, rp, nullptr,
                                                  mask)) {
          added = true;
          masked = mask != nullptr;
        } else if (first || !dnnl()) {
          conv_backward_input<T>(gy.data<T>(), w.data<T>(), dp, g, dt);
        }
      } else {
        conv_backward_input<T>(gy.data<T>(), w.data<T>(), dp, g, dt);
      }
      if (rp && !added)
        parallel_for(dx.numel(), int64_t{1} << 14, [&](int64_t i0, int64_t i1) {
          for (int64_t i = i0; i < i1; ++i) dp[i] += rp[i];
        });
    }
    if (mask_ && !masked) {
      const T* mp = m.data<T>();
      parallel_for(dx.numel(), int64_t{1} << 14, [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i) dp[i] = mp[i] > T(0) ? dp[i] : T(0);
      });
    }
  });
  finish_output(dx, *out[0]);
}

void Conv2dBackwardWeight::eval_cpu(const std::vector<const Array*>& in,
                                    const std::vector<Array*>& out) const {
  if (in[0]->dtype == Dtype::bf16 && !second_ && backward_weight_bf16(in, *out[0], win_)) return;
  const Dtype dt = compute_dtype(in[0]->dtype);
  Array x = as_contiguous(*in[0], dt), gy = as_contiguous(*in[1], dt);
  Array dw = start_output(*out[0], dt);
  const ConvGeom g = geom(x.shape, gy.shape, win_);
  if (second_) {
    // As the forward: one split of x for both where the stride-2 direct kernel takes them.
    Array gy2 = as_contiguous(*in[2], dt), dw2 = start_output(*out[1], dt);
    const ConvGeom g2 = geom(x.shape, gy2.shape, *second_);
    const cpu::SecondConv second{dnnl_shape(g2), gy2.data<float>(), nullptr, dw2.data<float>()};
    if (dt != Dtype::f32 || g.N == 0 || dnnl_first() ||
        !cpu::direct_conv_backward_weights(dnnl_shape(g), x.data<float>(), gy.data<float>(),
                                           dw.data<float>(), &second)) {
      backward_weight_any(x, gy, dw, g, dt);
      backward_weight_any(x, gy2, dw2, g2, dt);
    }
    finish_output(dw2, *out[1]);
  } else {
    backward_weight_any(x, gy, dw, g, dt);
  }
  finish_output(dw, *out[0]);
}

// ---- pooling --------------------------------------------------------------------------------

void MaxPool2d::eval_cpu(const std::vector<const Array*>& in,
                         const std::vector<Array*>& out) const {
  Array x = contiguous_array(*in[0]);
  Array &y = *out[0], &idx = *out[1];
  y.allocate();
  idx.allocate();
  const int64_t planes = x.shape[0] * x.shape[1], H = x.shape[2], W = x.shape[3];
  const int64_t Ho = y.shape[2], Wo = y.shape[3];
  const auto& k = win_.kernel;
  const auto& s = win_.stride;
  const auto& p = win_.padding;
  dispatch_float(x.dtype, name(), [&]<class T>() {
    using C = compute_t<T>;
    const T* xp = x.data<T>();
    T* yp = y.data<T>();
    int64_t* ip = idx.data<int64_t>();
    parallel_for(planes, std::max<int64_t>(1, 16384 / std::max<int64_t>(H * W, 1)),
                 [&](int64_t b, int64_t e) {
                   for (int64_t pl = b; pl < e; ++pl) {
                     const T* xpl = xp + pl * H * W;
                     for (int64_t oh = 0; oh < Ho; ++oh)
                       for (int64_t ow = 0; ow < Wo; ++ow) {
                         C best = -std::numeric_limits<C>::infinity();
                         int64_t bi = -1;
                         const int64_t h0 = oh * s[0] - p[0], w0 = ow * s[1] - p[1];
                         bool nan = false;  // the first NaN is the maximum
                         for (int64_t ih = std::max<int64_t>(h0, 0);
                              !nan && ih < std::min(h0 + k[0], H); ++ih)
                           for (int64_t iw = std::max<int64_t>(w0, 0);
                                !nan && iw < std::min(w0 + k[1], W); ++iw) {
                             C v = to_compute(xpl[ih * W + iw]);
                             if (bi < 0 || v > best || std::isnan(v)) {
                               best = v;
                               bi = ih * W + iw;
                               nan = std::isnan(v);
                             }
                           }
                         const int64_t o = (pl * Ho + oh) * Wo + ow;
                         yp[o] = from_compute<T>(best);
                         ip[o] = bi;
                       }
                   }
                 });
  });
}

void MaxPool2dBackward::eval_cpu(const std::vector<const Array*>& in,
                                 const std::vector<Array*>& out) const {
  Array g = contiguous_array(*in[0]), idx = contiguous_array(*in[1]);
  Array& dx = *out[0];
  const Dtype dt = compute_dtype(dx.dtype);
  Array acc = start_output(dx, dt);
  const int64_t planes = g.shape[0] * g.shape[1], hw = in_hw_[0] * in_hw_[1];
  const int64_t ohw = g.shape[2] * g.shape[3];
  dispatch_float(g.dtype, name(), [&]<class T>() {
    using C = compute_t<T>;
    const T* gp = g.data<T>();
    const int64_t* ip = idx.data<int64_t>();
    C* dp = acc.data<C>();
    parallel_for(planes, std::max<int64_t>(1, 16384 / std::max<int64_t>(hw, 1)),
                 [&](int64_t b, int64_t e) {
                   for (int64_t pl = b; pl < e; ++pl) {
                     C* d = dp + pl * hw;
                     std::fill(d, d + hw, C(0));
                     for (int64_t o = 0; o < ohw; ++o)
                       d[ip[pl * ohw + o]] += to_compute(gp[pl * ohw + o]);
                   }
                 });
  });
  finish_output(acc, dx);
}

void AvgPool2d::eval_cpu(const std::vector<const Array*>& in,
                         const std::vector<Array*>& out) const {
  Array x = contiguous_array(*in[0]);
  Array& y = *out[0];
  y.allocate();
  const int64_t planes = x.shape[0] * x.shape[1], H = x.shape[2], W = x.shape[3];
  const int64_t Ho = y.shape[2], Wo = y.shape[3];
  const auto& k = win_.kernel;
  const auto& s = win_.stride;
  const auto& p = win_.padding;
  dispatch_float(x.dtype, name(), [&]<class T>() {
    using C = compute_t<T>;
    const C inv = C(1) / static_cast<C>(k[0] * k[1]);  // padding counts in the divisor
    const T* xp = x.data<T>();
    T* yp = y.data<T>();
    parallel_for(
        planes, std::max<int64_t>(1, 16384 / std::max<int64_t>(H * W, 1)),
        [&](int64_t b, int64_t e) {
          for (int64_t pl = b; pl < e; ++pl) {
            const T* xpl = xp + pl * H * W;
            for (int64_t oh = 0; oh < Ho; ++oh)
              for (int64_t ow = 0; ow < Wo; ++ow) {
                C acc = 0;
                const int64_t h0 = oh * s[0] - p[0], w0 = ow * s[1] - p[1];
                for (int64_t ih = std::max<int64_t>(h0, 0); ih < std::min(h0 + k[0], H); ++ih)
                  for (int64_t iw = std::max<int64_t>(w0, 0); iw < std::min(w0 + k[1], W); ++iw)
                    acc += to_compute(xpl[ih * W + iw]);
                yp[(pl * Ho + oh) * Wo + ow] = from_compute<T>(acc * inv);
              }
          }
        });
  });
}

void AvgPool2dBackward::eval_cpu(const std::vector<const Array*>& in,
                                 const std::vector<Array*>& out) const {
  Array g = contiguous_array(*in[0]);
  Array& dx = *out[0];
  const Dtype dt = compute_dtype(dx.dtype);
  Array acc = start_output(dx, dt);
  const int64_t planes = g.shape[0] * g.shape[1], H = in_hw_[0], W = in_hw_[1];
  const int64_t Ho = g.shape[2], Wo = g.shape[3];
  const auto& k = win_.kernel;
  const auto& s = win_.stride;
  const auto& p = win_.padding;
  dispatch_float(g.dtype, name(), [&]<class T>() {
    using C = compute_t<T>;
    const C inv = C(1) / static_cast<C>(k[0] * k[1]);
    const T* gp = g.data<T>();
    C* dp = acc.data<C>();
    parallel_for(
        planes, std::max<int64_t>(1, 16384 / std::max<int64_t>(H * W, 1)),
        [&](int64_t b, int64_t e) {
          for (int64_t pl = b; pl < e; ++pl) {
            C* d = dp + pl * H * W;
            std::fill(d, d + H * W, C(0));
            for (int64_t oh = 0; oh < Ho; ++oh)
              for (int64_t ow = 0; ow < Wo; ++ow) {
                const C v = to_compute(gp[(pl * Ho + oh) * Wo + ow]) * inv;
                const int64_t h0 = oh * s[0] - p[0], w0 = ow * s[1] - p[1];
                for (int64_t ih = std::max<int64_t>(h0, 0); ih < std::min(h0 + k[0], H); ++ih)
                  for (int64_t iw = std::max<int64_t>(w0, 0); iw < std::min(w0 + k[1], W); ++iw)
                    d[ih * W + iw] += v;
              }
          }
        });
  });
  finish_output(acc, dx);
}

}  // namespace hetrain
