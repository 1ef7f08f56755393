// eval_cuda of the convolution and pooling primitives. The convolutions are im2col + cuBLASLt
// GEMMs (gemm.h) over chunks of images, so the column buffer (workspace from the caching
// allocator) stays within kColumnBytes whatever the batch:
//   forward          y_n  = W (O, CKK) @ col_n (CKK, HoWo), batched over the chunk's images
//                    (W shared); a bias is written into y first and the GEMM adds to it, so
//                    f16/bf16 outputs are rounded once;
//   backward input   dcol_n = W^T @ g_n (f32 for f16/bf16), batched; col2im gathers it into dx;
//   backward weight  dW += G (O, nb*HoWo) @ col^T (nb*HoWo, CKK): the chunk's images folded
//                    into K (g permuted to (O, nb, HoWo)), accumulated in f32 over chunks.
// A 1x1, stride 1, unpadded convolution reads x and writes dx without columns. Pooling kernels
// are in conv.cu.
#include <algorithm>
#include <cstdlib>
#include <string>

#include "backends/cuda/common.h"
#include "backends/cuda/gemm.h"
#include "graph/prims/conv.h"

namespace hetrain {

namespace {

/// Bytes of column buffers one convolution holds at once (at least one image's, however big);
/// HETRAIN_CUDA_CONV_COLUMN_BYTES overrides it (a small value forces one image per chunk).
int64_t column_bytes() {
  if (const char* e = std::getenv("HETRAIN_CUDA_CONV_COLUMN_BYTES")) {
    char* end = nullptr;
    const long long v = std::strtoll(e, &end, 10);
    if (end != e && *end == '\0' && v > 0) return v;
    fail("[conv2d] HETRAIN_CUDA_CONV_COLUMN_BYTES must be a positive number of bytes, got '", e,
         "'");
  }
  return int64_t{256} << 20;
}

/// Images per chunk when each needs per_image bytes of columns.
int64_t images_per_chunk(int64_t n, int64_t per_image) {
  return std::clamp<int64_t>(column_bytes() / std::max<int64_t>(per_image, 1), 1,
                             std::max<int64_t>(n, 1));
}

/// The accumulator dtype of a GEMM output kept unrounded: f32 for f16/bf16.
Dtype accumulator(Dtype dt) { return dt == Dtype::f16 || dt == Dtype::bf16 ? Dtype::f32 : dt; }

cuda::ConvDims dims(const Shape& x, const Shape& y, const Window2d& win) {
  return {x[1],          x[2],          x[3],          y[2],           y[3],          win.kernel[0],
          win.kernel[1], win.stride[0], win.stride[1], win.padding[0], win.padding[1]};
}

/// 1x1, stride 1, no padding: the image itself is the column matrix.
bool pointwise(const cuda::ConvDims& d) {
  return d.kh == 1 && d.kw == 1 && d.sh == 1 && d.sw == 1 && d.ph == 0 && d.pw == 0;
}

/// Pointer to element `off` of a's data.
template <class P>
P* at(const Array& a, int64_t off) {
  return static_cast<P*>(static_cast<char*>(a.raw()) +
                         off * static_cast<int64_t>(dtype_size(a.dtype)));
}

}  // namespace

void Conv2d::eval_cuda(const std::vector<const Array*>& in, const std::vector<Array*>& out) const {
  if (second_) {  // a pair of convolutions of x: one after the other
    Conv2d(win_).eval_cuda({in[0], in[1]}, {out[0]});
    Conv2d(*second_).eval_cuda({in[0], in[2]}, {out[1]});
    return;
  }
  const Array x = cuda::contiguous(*in[0]), w = cuda::contiguous(*in[1]);
  Array& y = *out[0];
  y.allocate();
  if (y.numel() == 0) return;
  const Dtype dt = x.dtype;
  const cuda::ConvDims d = dims(x.shape, y.shape, win_);
  const int64_t N = x.shape[0], O = w.shape[0];
  const int64_t ckk = d.C * d.kh * d.kw, howo = d.Ho * d.Wo, chw = d.C * d.H * d.W;
  const bool bias = in.size() > 2;
  if (bias) {
    // y = bias broadcast over (N, Ho, Wo); the GEMMs add the convolution to it.
    Array b = *in[2];
    b.shape = y.shape;
    b.strides = {0, in[2]->strides[0], 0, 0};
    cuda::copy_strided(b, y);
  }
  if (ckk == 0) {  // no input channels: y is the bias (or zero)
    if (!bias) cuda::zero(y);
    return;
  }
  const cuda::GemmOperand wm{w.raw(), false, ckk, 0};
  if (pointwise(d)) {
    cuda::gemm(dt, dt, O, howo, ckk, N, wm, {x.raw(), false, howo, chw}, {y.raw(), howo, O * howo},
               bias);
    return;
  }
  const int64_t nb = images_per_chunk(N, ckk * howo * static_cast<int64_t>(dtype_size(dt)));
  Array col = cuda::device_array({nb, ckk, howo}, dt);
  const cuda::ColumnLayout per_image{ckk * howo, howo};
  for (int64_t n0 = 0; n0 < N; n0 += nb) {
    const int64_t m = std::min(nb, N - n0);
    cuda::launch_im2col(dt, d, m, per_image, col.raw(), at<const void>(x, n0 * chw),
                        cuda::stream());
    cuda::gemm(dt, dt, O, howo, ckk, m, wm, {col.raw(), false, howo, ckk * howo},
               {at<void>(y, n0 * O * howo), howo, O * howo}, bias);
  }
}

void Conv2dBackwardInput::eval_cuda(const std::vector<const Array*>& in,
                                    const std::vector<Array*>& out) const {
  Array& dx = *out[0];
  backward_input_cuda(in, dx);
  // The second convolution's gradient and the addend join after the kernels: one elementwise
  // pass each, as the separate adds took.
  auto add = [&](const Array& t) {
    cuda::launch_binary(cuda::BinaryOp::add, dx.dtype, cuda::make_iter(dx.shape, {&dx, &dx, &t}),
                        dx.raw(), dx.raw(), t.raw(), cuda::stream());
  };
  if (second_ && dx.numel() > 0) {
    Array dx2;
    dx2.shape = dx.shape;
    dx2.dtype = dx.dtype;
    dx2.tag = MemoryTag::workspace;
    Conv2dBackwardInput(*second_, in_hw_).backward_input_cuda({in[2], in[3]}, dx2);
    add(dx2);
  }
  if (addend_ && dx.numel() > 0) add(cuda::contiguous(*in[second_ ? 4 : 2]));
  if (mask_ && dx.numel() > 0) {  // dx = relu_grad(m, dx)
    const Array m = cuda::contiguous(*in.back());
    cuda::launch_binary(cuda::BinaryOp::relu_backward, dx.dtype,
                        cuda::make_iter(dx.shape, {&dx, &m, &dx}), dx.raw(), m.raw(), dx.raw(),
                        cuda::stream());
  }
}

void Conv2dBackwardInput::backward_input_cuda(const std::vector<const Array*>& in,
                                              Array& dx) const {
  const Array g = cuda::contiguous(*in[0]), w = cuda::contiguous(*in[1]);
  dx.allocate();
  if (dx.numel() == 0) return;
  const Dtype dt = g.dtype;
  const cuda::ConvDims d = dims(dx.shape, g.shape, win_);
  const int64_t N = g.shape[0], O = g.shape[1];
  const int64_t ckk = d.C * d.kh * d.kw, howo = d.Ho * d.Wo, chw = d.C * d.H * d.W;
  if (O == 0) {  // nothing flows back
    cuda::zero(dx);
    return;
  }
  const cuda::GemmOperand wt{w.raw(), true, ckk, 0};  // W^T (CKK, O)
  if (pointwise(d)) {
    cuda::gemm(dt, dt, ckk, howo, O, N, wt, {g.raw(), false, howo, O * howo},
               {dx.raw(), howo, chw});
    return;
  }
  const Dtype ct = accumulator(dt);
  const int64_t nb = images_per_chunk(N, ckk * howo * static_cast<int64_t>(dtype_size(ct)));
  Array dcol = cuda::device_array({nb, ckk, howo}, ct);
  const cuda::ColumnLayout per_image{ckk * howo, howo};
  for (int64_t n0 = 0; n0 < N; n0 += nb) {
    const int64_t m = std::min(nb, N - n0);
    cuda::gemm(dt, ct, ckk, howo, O, m, wt,
               {at<const void>(g, n0 * O * howo), false, howo, O * howo},
               {dcol.raw(), howo, ckk * howo});
    cuda::launch_col2im(dt, d, m, per_image, at<void>(dx, n0 * chw), dcol.raw(), cuda::stream());
  }
}

void Conv2dBackwardWeight::eval_cuda(const std::vector<const Array*>& in,
                                     const std::vector<Array*>& out) const {
  if (second_) {  // a pair's weight gradients: one after the other
    Conv2dBackwardWeight(win_).eval_cuda({in[0], in[1]}, {out[0]});
    Conv2dBackwardWeight(*second_).eval_cuda({in[0], in[2]}, {out[1]});
    return;
  }
  const Array x = cuda::contiguous(*in[0]), g = cuda::contiguous(*in[1]);
  Array& dw = *out[0];
  dw.allocate();
  if (dw.numel() == 0) return;
  const Dtype dt = x.dtype;
  const cuda::ConvDims d = dims(x.shape, g.shape, win_);
  const int64_t N = x.shape[0], O = g.shape[1];
  const int64_t ckk = d.C * d.kh * d.kw, howo = d.Ho * d.Wo, chw = d.C * d.H * d.W;
  if (N == 0) {
    cuda::zero(dw);
    return;
  }
  // f16/bf16 accumulate over the chunks in f32, rounded into dw at the end.
  const Dtype ct = accumulator(dt);
  Array acc = ct == dt ? dw : cuda::device_array(dw.shape, ct);
  const int64_t nb = images_per_chunk(N, (ckk + O) * howo * static_cast<int64_t>(dtype_size(dt)));
  Array col = cuda::device_array({ckk, nb * howo}, dt);
  Array gp = cuda::device_array({O, nb * howo}, dt);
  for (int64_t n0 = 0; n0 < N; n0 += nb) {
    const int64_t m = std::min(nb, N - n0), k = m * howo;
    // col (CKK, m * HoWo): image n's columns at n * HoWo.
    cuda::launch_im2col(dt, d, m, {howo, k}, col.raw(), at<const void>(x, n0 * chw),
                        cuda::stream());
    // G (O, m, HoWo) from g's images [n0, n0 + m) (N, O, HoWo).
    Array from = g, to = gp;
    from.shape = to.shape = {O, m, howo};
    from.strides = {howo, O * howo, 1};
    from.offset = g.offset + n0 * O * howo;
    to.strides = {k, howo, 1};
    cuda::copy_strided(from, to);
    cuda::gemm(dt, ct, O, ckk, k, 1, {gp.raw(), false, k, 0}, {col.raw(), true, k, 0},
               {acc.raw(), ckk, 0}, n0 > 0);
  }
  if (acc.buffer != dw.buffer) cuda::copy_strided(acc, dw);
}

// ---- pooling --------------------------------------------------------------------------------

void MaxPool2d::eval_cuda(const std::vector<const Array*>& in,
                          const std::vector<Array*>& out) const {
  const Array x = cuda::contiguous(*in[0]);
  Array &y = *out[0], &idx = *out[1];
  y.allocate();
  idx.allocate();
  cuda::launch_max_pool(x.dtype, dims(x.shape, y.shape, win_), x.shape[0] * x.shape[1], y.raw(),
                        idx.data<int64_t>(), x.raw(), cuda::stream());
}

void MaxPool2dBackward::eval_cuda(const std::vector<const Array*>& in,
                                  const std::vector<Array*>& out) const {
  const Array g = cuda::contiguous(*in[0]), idx = cuda::contiguous(*in[1]);
  Array& dx = *out[0];
  dx.allocate();
  cuda::launch_max_pool_backward(g.dtype, dims(dx.shape, g.shape, win_), g.shape[0] * g.shape[1],
                                 dx.raw(), idx.data<int64_t>(), g.raw(), cuda::stream());
}

void AvgPool2d::eval_cuda(const std::vector<const Array*>& in,
                          const std::vector<Array*>& out) const {
  const Array x = cuda::contiguous(*in[0]);
  Array& y = *out[0];
  y.allocate();
  cuda::launch_avg_pool(x.dtype, dims(x.shape, y.shape, win_), x.shape[0] * x.shape[1], y.raw(),
                        x.raw(), cuda::stream());
}

void AvgPool2dBackward::eval_cuda(const std::vector<const Array*>& in,
                                  const std::vector<Array*>& out) const {
  const Array g = cuda::contiguous(*in[0]);
  Array& dx = *out[0];
  dx.allocate();
  cuda::launch_avg_pool_backward(g.dtype, dims(dx.shape, g.shape, win_), g.shape[0] * g.shape[1],
                                 dx.raw(), g.raw(), cuda::stream());
}

}  // namespace hetrain
