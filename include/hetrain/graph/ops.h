// Ops: check arguments, promote dtypes, broadcast, and return new graph nodes. They never
// touch data (creation functions excepted: they make leaves that hold data).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "hetrain/graph/tensor.h"

namespace hetrain {

// ---- creation (leaves) -------------------------------------------------------------------
Tensor zeros(const Shape& shape, Dtype dtype = Dtype::f32);
Tensor ones(const Shape& shape, Dtype dtype = Dtype::f32);
Tensor full(const Shape& shape, double value, Dtype dtype = Dtype::f32);
Tensor zeros_like(const Tensor& t);
Tensor ones_like(const Tensor& t);
Tensor scalar(double value, Dtype dtype = Dtype::f32);
/// [start, stop) with step, like torch.arange.
Tensor arange(double start, double stop, double step = 1, Dtype dtype = Dtype::f32);
/// Copies count = numel(shape) elements of dtype from data.
Tensor from_blob(const void* data, const Shape& shape, Dtype dtype);
template <class T>
Tensor from_vector(const std::vector<T>& v, const Shape& shape) {
  return from_blob(v.data(), shape, dtype_of<T>());
}

/// Counter-based random numbers (Philox 4x32-10): the same seed and offset give the same
/// values on every machine and thread count. A Generator hands out disjoint offsets.
class Generator {
 public:
  explicit Generator(uint64_t seed = 0) : seed_(seed) {}
  uint64_t seed() const { return seed_; }
  uint64_t offset() const { return offset_; }
  void set_state(uint64_t seed, uint64_t offset) {
    seed_ = seed;
    offset_ = offset;
  }
  /// Reserves n counters and returns the first.
  uint64_t advance(uint64_t n) {
    uint64_t o = offset_;
    offset_ += (n + 3) / 4 * 4;
    return o;
  }

 private:
  uint64_t seed_;
  uint64_t offset_ = 0;
};
Generator& default_generator();
void manual_seed(uint64_t seed);

Tensor randn(const Shape& shape, Dtype dtype = Dtype::f32, Generator& gen = default_generator());
/// Uniform in [low, high).
Tensor rand(const Shape& shape, double low = 0, double high = 1, Dtype dtype = Dtype::f32,
            Generator& gen = default_generator());
/// Bernoulli(p) as 0/1 of dtype.
Tensor bernoulli(const Shape& shape, double p, Dtype dtype = Dtype::f32,
                 Generator& gen = default_generator());

// ---- views (no copy) ------------------------------------------------------------------------
/// One dimension may be -1. A copy is made only when the strides do not allow a view.
Tensor reshape(const Tensor& x, Shape shape);
Tensor flatten(const Tensor& x, int64_t start_axis = 0, int64_t end_axis = -1);
Tensor squeeze(const Tensor& x, int64_t axis);
Tensor unsqueeze(const Tensor& x, int64_t axis);
Tensor permute(const Tensor& x, std::vector<int64_t> dims);
Tensor transpose(const Tensor& x, int64_t a, int64_t b);
/// Elements [start, stop) with step along axis; negative indices count from the end.
Tensor slice(const Tensor& x, int64_t axis, int64_t start, int64_t stop, int64_t step = 1);
Tensor broadcast_to(const Tensor& x, const Shape& shape);
/// Like broadcast_to; -1 keeps a dimension.
Tensor expand(const Tensor& x, const Shape& shape);
/// A contiguous copy.
Tensor copy(const Tensor& x);
Tensor cast(const Tensor& x, Dtype dtype);

// ---- elementwise ------------------------------------------------------------------------
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor pow(const Tensor& a, const Tensor& b);
Tensor pow(const Tensor& a, double exponent);
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor minimum(const Tensor& a, const Tensor& b);
Tensor neg(const Tensor& x);
Tensor abs(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor rsqrt(const Tensor& x);
Tensor square(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor sigmoid(const Tensor& x);
Tensor relu(const Tensor& x);
/// approximate: "none" (erf form) or "tanh".
Tensor gelu(const Tensor& x, const std::string& approximate = "none");
Tensor silu(const Tensor& x);
Tensor equal(const Tensor& a, const Tensor& b);
Tensor not_equal(const Tensor& a, const Tensor& b);
Tensor less(const Tensor& a, const Tensor& b);
Tensor less_equal(const Tensor& a, const Tensor& b);
Tensor greater(const Tensor& a, const Tensor& b);
Tensor greater_equal(const Tensor& a, const Tensor& b);
/// cond ? a : b, broadcasting all three.
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);

Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a);
// A scalar takes the tensor's dtype (PyTorch's rule for Python scalars).
Tensor operator+(const Tensor& a, double b);
Tensor operator-(const Tensor& a, double b);
Tensor operator*(const Tensor& a, double b);
Tensor operator/(const Tensor& a, double b);
Tensor operator+(double a, const Tensor& b);
Tensor operator-(double a, const Tensor& b);
Tensor operator*(double a, const Tensor& b);
Tensor operator/(double a, const Tensor& b);

// ---- reductions ---------------------------------------------------------------------------
/// Empty axes reduce over all axes.
Tensor sum(const Tensor& x, std::vector<int64_t> axes = {}, bool keepdims = false);
Tensor mean(const Tensor& x, std::vector<int64_t> axes = {}, bool keepdims = false);
Tensor max(const Tensor& x, std::vector<int64_t> axes = {}, bool keepdims = false);
Tensor min(const Tensor& x, std::vector<int64_t> axes = {}, bool keepdims = false);
Tensor argmax(const Tensor& x, int64_t axis, bool keepdims = false);
/// Variance with Bessel's correction by default, like torch.var.
Tensor var(const Tensor& x, std::vector<int64_t> axes = {}, int64_t correction = 1,
           bool keepdims = false);
/// Sums x down to shape (the adjoint of broadcasting to x's shape).
Tensor sum_to(const Tensor& x, const Shape& shape);

// ---- linear algebra ---------------------------------------------------------------------
/// Batched matrix product with broadcast batch dims; 1-D operands as in NumPy. Transposed
/// operands are passed to the GEMM as transposes, not copied.
Tensor matmul(const Tensor& a, const Tensor& b);
/// x @ w^T + b, as torch.nn.functional.linear.
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b = {});

// ---- neural-network ops -------------------------------------------------------------------
Tensor softmax(const Tensor& x, int64_t axis = -1);
Tensor log_softmax(const Tensor& x, int64_t axis = -1);
/// Normalises over the trailing dims of normalized_shape; weight/bias optional.
Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight = {},
                  const Tensor& bias = {}, double eps = 1e-5);
Tensor rms_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight = {},
                double eps = 1e-6);
/// Batch normalisation of x (N, C, H, W) with its own batch statistics (training mode), one
/// fused kernel each way: y = (x - mean) / sqrt(var + eps) * weight + bias. Returns y, the
/// batch mean (C) and the biased batch variance (C), the statistics in f32 (f64 for f64 x).
/// weight/bias (C) optional. Running statistics are the caller's (nn::BatchNorm2d). With `relu`,
/// y is relu of that, fused into the same passes each way (the backward recomputes the mask).
/// `residual` (x's shape) is added before the relu: relu(bn(x) + residual), a residual block's
/// tail in one pass instead of three.
std::array<Tensor, 3> batch_norm2d(const Tensor& x, const Tensor& weight = {},
                                   const Tensor& bias = {}, double eps = 1e-5, bool relu = false,
                                   const Tensor& residual = {});
/// Rows of weight (V, D) picked by integer ids of any shape: result ids.shape + (D).
Tensor embedding(const Tensor& weight, const Tensor& ids);
/// torch.index_select.
Tensor index_select(const Tensor& x, int64_t axis, const Tensor& index);
/// torch.gather: out[i][j] = x[i][index[i][j]] along axis.
Tensor gather(const Tensor& x, int64_t axis, const Tensor& index);
/// x (N, C, H, W), w (O, C/groups... groups=1), bias (O) optional.
Tensor conv2d(const Tensor& x, const Tensor& w, const Tensor& bias = {},
              std::vector<int64_t> stride = {1, 1}, std::vector<int64_t> padding = {0, 0});
Tensor max_pool2d(const Tensor& x, std::vector<int64_t> kernel, std::vector<int64_t> stride = {},
                  std::vector<int64_t> padding = {0, 0});
Tensor avg_pool2d(const Tensor& x, std::vector<int64_t> kernel, std::vector<int64_t> stride = {},
                  std::vector<int64_t> padding = {0, 0});
/// Zeroes elements with probability p and scales the rest by 1/(1-p) when training.
Tensor dropout(const Tensor& x, double p, bool training = true,
               Generator& gen = default_generator());
/// logits (N, C) or (N, C, d...), integer targets (N) or (N, d...). reduction: mean, sum, none.
Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index = -100,
                     const std::string& reduction = "mean");
/// q (..., Lq, E), k (..., Lk, E), v (..., Lk, Ev). Fused: memory grows with L, not L^2.
/// scale defaults to 1/sqrt(E).
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    bool causal = false, std::optional<double> scale = {});
/// Multi-head attention on a fused projection, as a transformer layer holds it: qkv (N, L, 3D)
/// with q, k and v side by side, each `heads` heads of d = D / heads columns; returns (N, L, D)
/// with the heads side by side. The same as splitting qkv, viewing each part as (N, heads, L, d),
/// scaled_dot_product_attention and merging the heads, but without the copies those layout
/// changes cost (and its gradient arrives packed, not as three slices to add). scale defaults
/// to 1/sqrt(d).
Tensor scaled_dot_product_attention_packed(const Tensor& qkv, int64_t heads, bool causal = false,
                                           std::optional<double> scale = {});

// ---- joining ----------------------------------------------------------------------------
Tensor concat(const std::vector<Tensor>& xs, int64_t axis = 0);
/// Pieces of the given sizes along axis (views).
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t axis = 0);

// ---- fused optimizer updates ------------------------------------------------------------
/// Hyper-parameters of one AdamW step; bias_correction1/2 = 1 - beta^t.
struct AdamWStepArgs {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0;
  double bias_correction1 = 1, bias_correction2 = 1;
};
/// One fused AdamW step: returns {p', m', v'} with m' = b1 m + (1-b1) g,
/// v' = b2 v + (1-b2) g², p' = p (1 - lr wd) - lr/bc1 · m' / (sqrt(v')/sqrt(bc2) + eps).
/// p, g, m, v must have one shape and one floating dtype. Not differentiable.
std::vector<Tensor> adamw_update(const Tensor& p, const Tensor& g, const Tensor& m, const Tensor& v,
                                 const AdamWStepArgs& args);

}  // namespace hetrain
