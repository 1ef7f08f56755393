// The CUDA backend. Every kernel test builds the same graph twice, on the CPU and pinned to
// cuda:0, and compares the CUDA result with the CPU backend's at the tolerance of the dtype
// (|got - want| <= tol + tol |want|):
//   f64 1e-10   f32 1e-5   f16 2e-3   bf16 2e-2   ints, bool exact      (tests/parity)
// loosened where the two backends legitimately differ: kLongSums (summation order over long
// sums: GEMM, reductions, norms) makes f32 1e-4 and doubles f16/bf16; kGradients (several
// rounded low-precision nodes in a row) makes f32 1e-4 and f16/bf16 four times the above. Without a
// CUDA device (or without the backend) these tests skip with "no CUDA device"; the tests at the end
// check what must hold on a machine without one.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "hetrain/base/error.h"
#include "hetrain/graph/autodiff.h"
#include "hetrain/graph/ops.h"
#include "hetrain/graph/primitive.h"
#include "hetrain/interop/safetensors.h"
#include "hetrain/memory/allocator.h"
#include "hetrain/runtime/scheduler.h"
#include "hetrain/training/nn.h"

using namespace hetrain;
namespace rt = hetrain::runtime;

namespace {

const Device kCuda0{DeviceKind::cuda, 0};

bool have_cuda() { return devices_found().find("cuda:0") != std::string::npos; }

enum Slack { kExact, kLongSums, kGradients };

double tolerance(Dtype dt, Slack slack) {
  const double low = slack == kExact ? 1 : slack == kLongSums ? 2 : 4;
  switch (dt) {
    case Dtype::f64:
      return slack == kExact ? 1e-10 : 1e-9;
    case Dtype::f32:
      return slack == kExact ? 1e-5 : 1e-4;
    case Dtype::f16:
      return 2e-3 * low;
    case Dtype::bf16:
      return 2e-2 * low;
    default:
      return 0;
  }
}

/// Runs build() on the CPU and pinned to cuda:0 and compares every output.
class Cuda : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!have_cuda()) GTEST_SKIP() << "no CUDA device";
    rt::configure(
        {.devices = rt::parse_devices("cpu,cuda:0"), .placement = rt::PlacementPolicy::pinned});
  }
  void TearDown() override { rt::configure({}); }

  using Build = std::function<std::vector<Tensor>()>;
  static void compare(const Build& build, Slack slack = kExact, const std::string& what = "") {
    std::vector<Tensor> want = build();
    std::vector<Tensor> got;
    {
      DeviceScope on(kCuda0);
      got = build();
    }
    ASSERT_EQ(got.size(), want.size());
    for (size_t k = 0; k < want.size(); ++k) {
      ASSERT_EQ(got[k].dtype(), want[k].dtype()) << what << " output " << k;
      ASSERT_EQ(got[k].shape(), want[k].shape()) << what << " output " << k;
      const std::vector<double> g = got[k].to_vector<double>();
      const std::vector<double> w = want[k].to_vector<double>();
      const double tol = tolerance(want[k].dtype(), slack);
      int bad = 0;
      for (size_t i = 0; i < w.size() && bad < 5; ++i) {
        const bool ok = std::isnan(w[i])   ? std::isnan(g[i])
                        : std::isinf(w[i]) ? g[i] == w[i]
                                           : std::abs(g[i] - w[i]) <= tol + tol * std::abs(w[i]);
        if (!ok) {
          ++bad;
          ADD_FAILURE() << what << " output " << k << " (" << dtype_name(want[k].dtype()) << ") ["
                        << i << "]: cuda " << g[i] << ", cpu " << w[i] << " (tol " << tol << ")";
        }
      }
    }
  }
};

/// Inputs in dtype dt: random normal values rounded to dt (so both backends see the same).
Tensor input(const Shape& s, Dtype dt, uint64_t seed, double scale = 1) {
  Generator gen(seed);
  Tensor x = randn(s, Dtype::f64, gen) * scale;
  if (!is_floating(dt)) x = x * 4.0;
  return cast(x, dt).eval();
}

const Dtype kFloats[] = {Dtype::f32, Dtype::f16, Dtype::bf16, Dtype::f64};

}  // namespace

// ---- elementwise ---------------------------------------------------------------------------

TEST_F(Cuda, UnaryOpsOnStridedInputs) {
  using Fn = Tensor (*)(const Tensor&);
  const std::vector<std::pair<const char*, Fn>> ops = {
      {"neg", hetrain::neg},   {"abs", hetrain::abs},         {"exp", hetrain::exp},
      {"tanh", hetrain::tanh}, {"sigmoid", hetrain::sigmoid}, {"relu", hetrain::relu},
      {"silu", hetrain::silu}, {"square", hetrain::square},
  };
  for (Dtype dt : kFloats) {
    Tensor x = input({7, 33}, dt, 1);
    for (const auto& [name, f] : ops) {
      const auto& op = f;  // clang 14 cannot capture a structured binding
      compare([&] { return std::vector<Tensor>{op(transpose(x, 0, 1))}; }, kExact,
              std::string(name) + " " + std::string(dtype_name(dt)));
    }
    Tensor pos = abs(x).eval() + 0.5;
    compare(
        [&] {
          return std::vector<Tensor>{log(pos), sqrt(pos), rsqrt(pos)};
        },
        kExact, "log/sqrt/rsqrt " + std::string(dtype_name(dt)));
    compare(
        [&] {
          return std::vector<Tensor>{gelu(x), gelu(x, "tanh")};
        },
        kExact, "gelu " + std::string(dtype_name(dt)));
    compare(
        [&] {  // the fused tanh-GELU gradient (gelu_tanh_backward)
          return std::vector<Tensor>{grad({sum(gelu(x, "tanh") * x)}, {x})[0]};
        },
        kExact, "gelu_tanh_backward " + std::string(dtype_name(dt)));
  }
  for (Dtype dt : {Dtype::i32, Dtype::i64}) {
    Tensor x = input({5, 9}, dt, 2);
    compare(
        [&] {
          return std::vector<Tensor>{neg(x), abs(x), square(x), relu(x)};
        },
        kExact, "integer unary " + std::string(dtype_name(dt)));
  }
}

TEST_F(Cuda, BinaryOpsBroadcastAndCompare) {
  for (Dtype dt : {Dtype::f32, Dtype::f16, Dtype::bf16, Dtype::f64, Dtype::i32, Dtype::i64}) {
    Tensor a = input({3, 1, 5}, dt, 3);
    Tensor b = input({4, 5}, dt, 4);
    compare(
        [&] {
          return std::vector<Tensor>{a + b,         a - b,       a * b,      maximum(a, b),
                                     minimum(a, b), equal(a, b), less(a, b), greater_equal(a, b)};
        },
        kExact, "binary " + std::string(dtype_name(dt)));
    // Integer division by zero gives 0, as on the CPU.
    compare([&] { return std::vector<Tensor>{a / b}; }, kExact,
            "div " + std::string(dtype_name(dt)));
  }
  Tensor x = input({6, 8}, Dtype::f32, 5);
  Tensor y = input({6, 8}, Dtype::f32, 6);
  compare([&] { return std::vector<Tensor>{where(greater(x, y), x, y), pow(abs(x) + 0.1, y)}; });
}

TEST_F(Cuda, CastBetweenAllDtypes) {
  const Dtype all[] = {Dtype::f64, Dtype::f32, Dtype::f16,    Dtype::bf16,
                       Dtype::i32, Dtype::i64, Dtype::boolean};
  for (Dtype from : all) {
    Tensor x = from == Dtype::boolean ? greater(input({4, 6}, Dtype::f32, 7), scalar(0.0)).eval()
                                      : input({4, 6}, from, 7, 3.0);
    for (Dtype to : all)
      compare([&] { return std::vector<Tensor>{cast(transpose(x, 0, 1), to)}; }, kExact,
              std::string("cast ") + std::string(dtype_name(from)) + " -> " +
                  std::string(dtype_name(to)));
  }
}

TEST_F(Cuda, ConcatSliceAndReshapeOfAView) {
  Tensor a = input({3, 4}, Dtype::f32, 8), b = input({3, 2}, Dtype::f32, 9);
  compare([&] {
    return std::vector<Tensor>{concat({a, b}, 1), reshape(transpose(a, 0, 1), {2, 6}),
                               slice(a, 1, 1, 4, 2) * 2.0};
  });
  // slice's gradient is slice_scatter.
  compare([&] {
    auto [v, g] = value_and_grad(
        [](const std::vector<Tensor>& in) { return sum(slice(in[0], 0, 1, 3) * 3.0); }, {a});
    return std::vector<Tensor>{v, g[0]};
  });
}

// ---- matmul --------------------------------------------------------------------------------

TEST_F(Cuda, MatmulDtypesLayoutsAndBatches) {
  for (Dtype dt : kFloats) {
    const std::string d(dtype_name(dt));
    Tensor a = input({37, 64}, dt, 10), b = input({64, 29}, dt, 11);
    compare([&] { return std::vector<Tensor>{matmul(a, b)}; }, kLongSums, "2-D " + d);
    // Transposed views go to cuBLASLt as transposes.
    Tensor at = input({64, 37}, dt, 12), bt = input({29, 64}, dt, 13);
    compare([&] { return std::vector<Tensor>{matmul(transpose(at, 0, 1), transpose(bt, 0, 1))}; },
            kLongSums, "transposed " + d);
    // Batched, strided-batched, and a weight broadcast over the batch (folded into M).
    Tensor x = input({2, 3, 17, 32}, dt, 14), y = input({2, 3, 32, 9}, dt, 15);
    compare([&] { return std::vector<Tensor>{matmul(x, y)}; }, kLongSums, "batched " + d);
    Tensor w = input({32, 24}, dt, 16);
    compare([&] { return std::vector<Tensor>{matmul(x, w)}; }, kLongSums, "broadcast weight " + d);
    Tensor w2 = input({2, 1, 17, 32}, dt, 17);
    compare([&] { return std::vector<Tensor>{matmul(w2, y)}; }, kLongSums, "broadcast left " + d);
  }
  // Integer operands are refused when the node is built, on any device (no integer GEMM).
  Tensor ia = input({5, 6}, Dtype::i32, 18), ib = input({6, 3}, Dtype::i32, 19);
  {
    DeviceScope on(kCuda0);
    EXPECT_THROW((void)matmul(ia, ib), Error);
  }
  Tensor e1 = zeros({4, 0}), e2 = zeros({0, 3});
  compare([&] { return std::vector<Tensor>{matmul(e1, e2)}; }, kExact, "K = 0");
}

TEST_F(Cuda, LinearForwardAndBackward) {
  for (Dtype dt : {Dtype::f32, Dtype::bf16}) {
    Tensor x = input({4, 16, 48}, dt, 20), w = input({40, 48}, dt, 21), b = input({40}, dt, 22);
    compare(
        [&] {
          auto [v, g] = value_and_grad(
              [](const std::vector<Tensor>& in) {
                return sum(square(linear(in[0], in[1], in[2])));
              },
              {x, w, b});
          return std::vector<Tensor>{v, g[0], g[1], g[2]};
        },
        kGradients, "linear " + std::string(dtype_name(dt)));
  }
}

// ---- reductions, softmax, norms ------------------------------------------------------------

TEST_F(Cuda, Reductions) {
  for (Dtype dt : {Dtype::f32, Dtype::bf16, Dtype::f64, Dtype::i64}) {
    Tensor x = input({6, 5, 300}, dt, 23);
    compare(
        [&] {
          return std::vector<Tensor>{sum(x, {2}),  sum(x, {0}),    sum(x, {0, 2}, true),
                                     max(x, {1}),  min(x, {0, 1}), sum(x),
                                     argmax(x, 2), argmax(x, 0),   sum(transpose(x, 0, 2), {1})};
        },
        kLongSums, "reduce " + std::string(dtype_name(dt)));
    // Down long columns (bias gradients: [B, T, C] over B and T), in row chunks and in one.
    Tensor c = input({3, 700, 45}, dt, 25), r = input({300, 20}, dt, 26);
    compare(
        [&] {
          return std::vector<Tensor>{sum(c, {0, 1}), max(c, {0, 1}), sum(r, {0})};
        },
        kLongSums, "columns " + std::string(dtype_name(dt)));
    // Few long rows (a gradient norm's sum of squares), split over blocks in chunks.
    Tensor big = input({700, 300}, dt, 27);
    compare(
        [&] {
          return std::vector<Tensor>{sum(big), min(big, {1}), sum(transpose(big, 0, 1))};
        },
        kLongSums, "chunked rows " + std::string(dtype_name(dt)));
  }
  Tensor f = input({8, 1000}, Dtype::f32, 24);
  compare([&] { return std::vector<Tensor>{mean(f, {1}), mean(f)}; }, kLongSums, "mean");
}

TEST_F(Cuda, SoftmaxAndLogSoftmax) {
  for (Dtype dt : kFloats) {
    Tensor x = input({4, 6, 130}, dt, 25, 3.0);
    compare(
        [&] {
          return std::vector<Tensor>{softmax(x, -1), log_softmax(x, -1), softmax(x, 1),
                                     log_softmax(x, 0)};
        },
        kLongSums, "softmax " + std::string(dtype_name(dt)));
  }
}

TEST_F(Cuda, LayerNormAndRmsNormForwardBackward) {
  for (Dtype dt : kFloats) {
    Tensor x = input({3, 7, 96}, dt, 26, 2.0);
    Tensor w = input({96}, dt, 27), b = input({96}, dt, 28);
    compare(
        [&] {
          auto [v, g] = value_and_grad(
              [](const std::vector<Tensor>& in) {
                Tensor y = layer_norm(in[0], {96}, in[1], in[2]);
                return sum(y * y * in[0]);
              },
              {x, w, b});
          return std::vector<Tensor>{layer_norm(x, {96}, w, b), g[0], g[1], g[2]};
        },
        kGradients, "layer_norm " + std::string(dtype_name(dt)));
    compare(
        [&] {
          auto [v, g] = value_and_grad(
              [](const std::vector<Tensor>& in) {
                Tensor y = rms_norm(in[0], {96}, in[1]);
                return sum(y * in[0]);
              },
              {x, w});
          return std::vector<Tensor>{rms_norm(x, {96}, w), rms_norm(x, {96}), g[0], g[1]};
        },
        kGradients, "rms_norm " + std::string(dtype_name(dt)));
  }
}

namespace {

/// One attention geometry: q (2, 3, lq, e), k (2, 3, lk, e), v (2, 3, lk, ev).
struct AttentionCase {
  int64_t lq, lk, e, ev;
};
// The CUDA kernels tile 64 rows for head dims up to 64 (32 in f64), 32 up to 128 (16 in f64)
// and 16 up to 256, and bucket the head dim to 32, 64, 128 or 256: lengths one short of, on
// and one past a tile, Lq < Lk and Lq > Lk (the causal mask is top-left aligned), head dims
// 32, 64, 80, 128 and 200 with Ev != E, a single key, and a length over several tiles.
const AttentionCase kAttentionCases[] = {
    {70, 45, 40, 24},   {45, 70, 32, 32},  {129, 129, 64, 64},
    {63, 65, 64, 48},   {97, 130, 80, 80}, {65, 33, 128, 128},
    {33, 17, 200, 136}, {5, 1, 16, 16},    {300, 200, 64, 64},
};

/// o and the gradients of sum(o * o) with respect to q, k and v.
std::vector<Tensor> attention_and_grads(const Tensor& q, const Tensor& k, const Tensor& v,
                                        bool causal) {
  auto [val, g] = value_and_grad(
      [&](const std::vector<Tensor>& in) {
        Tensor o = scaled_dot_product_attention(in[0], in[1], in[2], causal);
        return sum(o * o);
      },
      {q, k, v});
  return {scaled_dot_product_attention(q, k, v, causal), g[0], g[1], g[2]};
}

}  // namespace

TEST_F(Cuda, AttentionForwardBackward) {
  for (Dtype dt : kFloats) {
    for (const AttentionCase& c : kAttentionCases) {
      Tensor q = input({2, 3, c.lq, c.e}, dt, 40), k = input({2, 3, c.lk, c.e}, dt, 41),
             v = input({2, 3, c.lk, c.ev}, dt, 42);
      for (bool causal : {true, false})
        compare([&] { return attention_and_grads(q, k, v, causal); }, kGradients,
                "sdpa " + std::string(causal ? "causal " : "") + std::string(dtype_name(dt)) +
                    " Lq=" + std::to_string(c.lq) + " Lk=" + std::to_string(c.lk) +
                    " E=" + std::to_string(c.e) + " Ev=" + std::to_string(c.ev));
    }
  }
}

TEST_F(Cuda, AttentionStridedAndBatchDims) {
  // GPT-2's layout: q, k, v split from (N, L, H, E) and transposed to (N, H, L, E), strided;
  // and a single leading dim of batch-heads.
  for (Dtype dt : {Dtype::f32, Dtype::bf16}) {
    Tensor q = transpose(input({2, 77, 3, 64}, dt, 43), 1, 2),
           k = transpose(input({2, 77, 3, 64}, dt, 44), 1, 2),
           v = transpose(input({2, 77, 3, 64}, dt, 45), 1, 2);
    compare([&] { return attention_and_grads(q, k, v, true); }, kGradients,
            "sdpa strided " + std::string(dtype_name(dt)));
    Tensor q1 = input({5, 50, 32}, dt, 46), k1 = input({5, 70, 32}, dt, 47),
           v1 = input({5, 70, 32}, dt, 48);
    compare([&] { return attention_and_grads(q1, k1, v1, false); }, kGradients,
            "sdpa 3-d " + std::string(dtype_name(dt)));
  }
}

TEST_F(Cuda, AttentionPackedLayout) {
  // A GPT layer's fused projection (N, L, 3D) with 2 and 12 heads: the CUDA path gathers the
  // heads and scatters the output and the packed gradient back.
  for (Dtype dt : {Dtype::f32, Dtype::bf16}) {
    for (auto [heads_, d] : {std::pair<int64_t, int64_t>{2, 32}, {12, 64}}) {
      const int64_t heads = heads_;  // clang 14 cannot capture a structured binding
      Tensor qkv = input({2, 77, 3 * heads * d}, dt, 49);
      compare(
          [&] {
            auto [val, g] = value_and_grad(
                [&](const std::vector<Tensor>& in) {
                  Tensor o = scaled_dot_product_attention_packed(in[0], heads, true);
                  return sum(o * o);
                },
                {qkv});
            return std::vector<Tensor>{scaled_dot_product_attention_packed(qkv, heads, true), g[0]};
          },
          kGradients,
          "sdpa packed heads=" + std::to_string(heads) + " " + std::string(dtype_name(dt)));
    }
  }
}

// ---- convolution, pooling, batch norm -------------------------------------------------------

namespace {

/// One conv2d geometry: input (N, C, H, W), weight (O, C, kh, kw), stride, padding, bias.
struct ConvCase {
  const char* what;
  Shape x, w;
  std::vector<int64_t> stride, padding;
  bool bias;
};
// Batch 3, channel counts that are not multiples of 32, remainders, strides 1 and 2, padding,
// non-square windows, the 1x1 GEMM-only path and a window larger than the image.
const ConvCase kConvCases[] = {
    {"3x3 stride 2 pad 1", {3, 5, 11, 9}, {7, 5, 3, 3}, {2}, {1}, true},
    {"2x3 stride (1, 2) pad (0, 1)", {3, 33, 8, 7}, {6, 33, 2, 3}, {1, 2}, {0, 1}, false},
    {"1x1 pointwise", {3, 35, 6, 5}, {9, 35, 1, 1}, {1}, {0}, true},
    {"1x1 stride 2", {3, 6, 7, 5}, {4, 6, 1, 1}, {2}, {0}, false},
    {"5x5 pad 2 on 4x4", {3, 2, 4, 4}, {3, 2, 5, 5}, {1}, {2}, true},
};

/// conv2d and the gradients of sum(conv2d * r) (r fixed, so both backends' backward kernels
/// see the same cotangent) with respect to x, w and the bias.
std::vector<Tensor> conv_and_grads(const ConvCase& c, const Tensor& x, const Tensor& w,
                                   const Tensor& b, const Tensor& r) {
  std::vector<Tensor> in{x, w};
  if (c.bias) in.push_back(b);
  auto [v, g] = value_and_grad(
      [&](const std::vector<Tensor>& t) {
        return sum(conv2d(t[0], t[1], c.bias ? t[2] : Tensor(), c.stride, c.padding) * r);
      },
      in);
  std::vector<Tensor> outs{conv2d(x, w, c.bias ? b : Tensor(), c.stride, c.padding)};
  outs.insert(outs.end(), g.begin(), g.end());
  return outs;
}

}  // namespace

TEST_F(Cuda, Conv2dForwardAndBothGradients) {
  for (Dtype dt : kFloats) {
    for (const ConvCase& c : kConvCases) {
      Tensor x = input(c.x, dt, 50), w = input(c.w, dt, 51), b = input({c.w[0]}, dt, 52);
      Tensor r = input(conv2d(x, w, {}, c.stride, c.padding).shape(), dt, 53);
      compare([&] { return conv_and_grads(c, x, w, b, r); }, kLongSums,
              std::string("conv2d ") + c.what + " " + std::string(dtype_name(dt)));
    }
  }
}

TEST_F(Cuda, Conv2dInputGradientWithTheOtherBranch) {
  // x feeds a convolution and x * r2: the fusion pass sums the two gradients in the convolution's
  // input-gradient node (its addend form, f32/f64), which the CUDA kernel adds after col2im.
  for (Dtype dt : {Dtype::f32, Dtype::f64}) {
    for (const ConvCase& c : kConvCases) {
      Tensor x = input(c.x, dt, 60), w = input(c.w, dt, 61);
      Tensor r1 = input(conv2d(x, w, {}, c.stride, c.padding).shape(), dt, 62);
      Tensor r2 = input(c.x, dt, 63);
      compare(
          [&] {
            return grad({sum(conv2d(x, w, {}, c.stride, c.padding) * r1) + sum(x * r2)}, {x});
          },
          kLongSums,
          std::string("conv2d input gradient + branch ") + c.what + " " +
              std::string(dtype_name(dt)));
    }
  }
}

TEST_F(Cuda, Conv2dShortcutAndSiblingInputGradientsInOneNode) {
  // x feeds a 3x3 and a 1x1 stride-2 convolution (a ResNet downsampling block) and x * r3:
  // the fusion pass sums the three gradients in one input-gradient node (the second window,
  // then the addend); the CUDA kernel adds the second convolution's gradient and the addend after
  // its own.
  for (Dtype dt : {Dtype::f32, Dtype::f64}) {
    Tensor x = input({3, 8, 14, 13}, dt, 64), w1 = input({12, 8, 3, 3}, dt, 65);
    Tensor w2 = input({12, 8, 1, 1}, dt, 66);
    auto y1 = [&] { return conv2d(x, w1, {}, {2, 2}, {1, 1}); };
    auto y2 = [&] { return conv2d(x, w2, {}, {2, 2}, {0, 0}); };
    Tensor r1 = input(y1().shape(), dt, 67), r2 = input(y2().shape(), dt, 68);
    Tensor r3 = input(x.shape(), dt, 69);
    compare(
        [&] {
          return grad({sum(y1() * r1) + sum(y2() * r2) + sum(x * r3)}, {x, w1, w2});
        },
        kLongSums, std::string("shortcut and 3x3 input gradients ") + std::string(dtype_name(dt)));
  }
}

TEST_F(Cuda, Conv2dPairAndReluMaskedInputGradient) {
  // A 3x3 and a 1x1 stride-2 convolution of a residual block's relu(bn(z) + r), which the
  // fusion pass makes one node forward, one for both weight gradients and the paired input
  // gradient with the relu's mask: the CUDA kernels run the pair one convolution after the
  // other and mask after.
  for (Dtype dt : {Dtype::f32, Dtype::f64}) {
    Tensor z = input({3, 8, 14, 13}, dt, 70), r = input({3, 8, 14, 13}, dt, 71);
    Tensor gamma = input({8}, dt, 72), beta = input({8}, dt, 73);
    Tensor w1 = input({12, 8, 3, 3}, dt, 74), w2 = input({12, 8, 1, 1}, dt, 75);
    auto pair = [&] {
      Tensor h = batch_norm2d(z, gamma, beta, 1e-5, true, r)[0];
      return std::pair{conv2d(h, w1, {}, {2, 2}, {1, 1}), conv2d(h, w2, {}, {2, 2}, {0, 0})};
    };
    Tensor r1 = input(pair().first.shape(), dt, 76), r2 = input(pair().second.shape(), dt, 77);
    compare(
        [&] {
          auto [p, q] = pair();
          std::vector<Tensor> out = grad({sum(p * r1) + sum(q * r2)}, {z, r, w1, w2});
          out.push_back(p);
          out.push_back(q);
          return out;
        },
        kLongSums, std::string("paired convolutions after a relu ") + std::string(dtype_name(dt)));
  }
}

TEST_F(Cuda, Conv2dInImageChunks) {
  // A column budget of one byte forces one image per chunk (the weight gradient then
  // accumulates over three GEMMs).
  ASSERT_EQ(setenv("HETRAIN_CUDA_CONV_COLUMN_BYTES", "1", 1), 0);
  for (Dtype dt : {Dtype::f32, Dtype::bf16}) {
    for (const ConvCase& c : {kConvCases[0], kConvCases[1]}) {
      Tensor x = input(c.x, dt, 54), w = input(c.w, dt, 55), b = input({c.w[0]}, dt, 56);
      Tensor r = input(conv2d(x, w, {}, c.stride, c.padding).shape(), dt, 57);
      compare([&] { return conv_and_grads(c, x, w, b, r); }, kLongSums,
              std::string("chunked conv2d ") + c.what + " " + std::string(dtype_name(dt)));
    }
  }
  unsetenv("HETRAIN_CUDA_CONV_COLUMN_BYTES");
}

TEST_F(Cuda, MaxAndAvgPoolForwardBackward) {
  struct PoolCase {
    const char* what;
    std::vector<int64_t> kernel, stride, padding;
  };
  const PoolCase cases[] = {
      {"3x3 stride 2 pad 1 (overlapping)", {3}, {2}, {1}},
      {"2x3 stride (2, 1) pad 1", {2, 3}, {2, 1}, {1}},
      {"2x2 stride 2", {2}, {2}, {0}},
  };
  for (Dtype dt : kFloats) {
    Tensor x = input({3, 37, 11, 9}, dt, 58);
    for (const PoolCase& c : cases) {
      Tensor r = input(max_pool2d(x, c.kernel, c.stride, c.padding).shape(), dt, 59);
      compare(
          [&] {
            Tensor ym = max_pool2d(x, c.kernel, c.stride, c.padding);
            Tensor ya = avg_pool2d(x, c.kernel, c.stride, c.padding);
            return std::vector<Tensor>{ym, ya, grad({sum(ym * r)}, {x})[0],
                                       grad({sum(ya * r)}, {x})[0]};
          },
          kExact, std::string("pool ") + c.what + " " + std::string(dtype_name(dt)));
    }
  }
  // A NaN is the maximum of its windows (the first NaN wins) and takes their gradient.
  const double nan = std::nan("");
  Tensor xn =
      from_vector(std::vector<double>{1, nan, 3, -4, nan, 2, -1, 0, 5, 7, -2, 1}, {1, 1, 3, 4});
  compare([&] {
    auto [v, g] = value_and_grad(
        [](const std::vector<Tensor>& t) { return sum(max_pool2d(t[0], {2}, {1}) * 2.0); }, {xn});
    return std::vector<Tensor>{max_pool2d(xn, {2}, {1}), g[0]};
  });
}

TEST_F(Cuda, BatchNorm2dForwardBackward) {
  for (Dtype dt : kFloats) {
    // The second shape has 9699 values per channel: several blocks per channel.
    for (const Shape& s : {Shape{3, 37, 5, 7}, Shape{3, 5, 61, 53}}) {
      // A mean far from zero checks the two-pass variance.
      Tensor x = cast(input(s, Dtype::f64, 60, 2.0) + 3.0, dt).eval();
      Tensor w = input({s[1]}, dt, 61), b = input({s[1]}, dt, 62), r = input(s, dt, 63);
      Tensor rm = input({s[1]}, Dtype::f32, 64);
      compare(
          [&] {
            auto [y, mu, var] = batch_norm2d(x, w, b);
            // The statistics are outputs too: their cotangents reach dx.
            auto [v, g] = value_and_grad(
                [&](const std::vector<Tensor>& t) {
                  auto [y2, m2, v2] = batch_norm2d(t[0], t[1], t[2]);
                  return cast(sum(y2 * r), Dtype::f32) + sum(m2 * rm) + sum(v2);
                },
                {x, w, b});
            return std::vector<Tensor>{y, mu, var, g[0], g[1], g[2]};
          },
          kGradients, "batch_norm2d " + shape_str(s) + " " + std::string(dtype_name(dt)));
    }
  }
}

TEST_F(Cuda, BatchNorm2dResidualRelu) {
  // relu(bn(x) + s) (a residual block's tail): the kernel, then the residual add and the relu.
  for (Dtype dt : {Dtype::f32, Dtype::bf16}) {
    const Shape s{3, 37, 5, 7};
    Tensor x = cast(input(s, Dtype::f64, 66, 2.0) + 1.0, dt).eval();
    Tensor w = input({s[1]}, dt, 67), b = input({s[1]}, dt, 68), res = input(s, dt, 69);
    Tensor r = input(s, dt, 70);
    compare(
        [&] {
          auto [v, g] = value_and_grad(
              [&](const std::vector<Tensor>& t) {
                return cast(sum(batch_norm2d(t[0], t[1], t[2], 1e-5, true, t[3])[0] * r),
                            Dtype::f32);
              },
              {x, w, b, res});
          return std::vector<Tensor>{batch_norm2d(x, w, b, 1e-5, true, res)[0], g[0], g[1], g[2],
                                     g[3]};
        },
        kGradients, "batch_norm2d residual relu " + std::string(dtype_name(dt)));
  }
}

TEST_F(Cuda, BatchNormModuleTrainThenEval) {
  // Training mode runs the fused kernels and updates the running statistics; eval mode
  // normalises with them (elementwise kernels).
  Tensor x = cast(input({3, 37, 5, 7}, Dtype::f64, 65, 2.0) + 1.0, Dtype::f32).eval();
  compare(
      [&] {
        nn::BatchNorm2d bn(37);
        Tensor y_train = bn.forward(x);
        bn.eval();
        return std::vector<Tensor>{y_train, bn.forward(x)};
      },
      kLongSums, "BatchNorm2d module");
}

// ---- embedding, cross-entropy, adamw -------------------------------------------------------

TEST_F(Cuda, EmbeddingForwardBackward) {
  for (Dtype dt : {Dtype::f32, Dtype::bf16, Dtype::f16}) {
    Tensor table = input({50, 24}, dt, 29);
    Tensor ids = from_vector(std::vector<int64_t>{3, 7, 3, 49, 0, 7, 7, 12}, {2, 4});
    compare(
        [&] {
          auto [v, g] = value_and_grad(
              [&](const std::vector<Tensor>& in) { return sum(square(embedding(in[0], ids))); },
              {table});
          return std::vector<Tensor>{embedding(table, ids), g[0]};
        },
        kLongSums, "embedding " + std::string(dtype_name(dt)));
  }
}

TEST_F(Cuda, CrossEntropyForwardBackward) {
  for (Dtype dt : kFloats) {
    Tensor logits = input({6, 11}, dt, 30, 3.0);
    Tensor t = from_vector(std::vector<int64_t>{1, 0, 10, -100, 5, 5}, {6});
    Tensor logits3 = input({2, 5, 3}, dt, 31, 3.0);
    Tensor t3 = from_vector(std::vector<int32_t>{0, 4, 2, 1, -100, 3}, {2, 3});
    compare(
        [&] {
          auto [v, g] = value_and_grad(
              [&](const std::vector<Tensor>& in) { return cross_entropy(in[0], t); }, {logits});
          auto [v3, g3] = value_and_grad(
              [&](const std::vector<Tensor>& in) { return cross_entropy(in[0], t3, -100, "sum"); },
              {logits3});
          return std::vector<Tensor>{v, g[0], v3, g3[0]};
        },
        kGradients, "cross_entropy " + std::string(dtype_name(dt)));
  }
}

TEST_F(Cuda, CrossEntropyBadTargetIsAnError) {
  Tensor logits = input({2, 4}, Dtype::f32, 32);
  DeviceScope on(kCuda0);
  // Targets computed on the GPU (not yet evaluated when the op is built): the CUDA kernel
  // checks them and the error reaches the caller.
  Tensor t =
      from_vector(std::vector<int64_t>{1, 9}, {2}) + from_vector(std::vector<int64_t>{0, 0}, {2});
  Tensor loss = cross_entropy(logits, t);
  try {
    loss.eval();
    FAIL() << "expected a bounds error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cross_entropy"), std::string::npos) << e.what();
  }
}

TEST_F(Cuda, FusedAdamW) {
  for (Dtype dt : kFloats) {
    Tensor p = input({1000}, dt, 33), g = input({1000}, dt, 34), m = input({1000}, dt, 35, 0.1);
    Tensor v = abs(input({1000}, dt, 36, 0.1)).eval();
    AdamWStepArgs a;
    a.lr = 1e-2;
    a.weight_decay = 0.1;
    a.bias_correction1 = 1 - 0.9 * 0.9;
    a.bias_correction2 = 1 - 0.999 * 0.999;
    compare([&] { return adamw_update(p, g, m, v, a); }, kExact,
            "adamw " + std::string(dtype_name(dt)));
  }
}

// ---- memory ----------------------------------------------------------------------------------

TEST_F(Cuda, AllocatorCountsByTagAndCaches) {
  Allocator& a = allocator_for(kCuda0);
  const MemoryStats before = a.stats();
  {
    auto b1 = a.allocate(1 << 20, MemoryTag::parameters);
    auto b2 = a.allocate(1000, MemoryTag::gradients);
    const MemoryStats s = a.stats();
    EXPECT_EQ(s.current[static_cast<size_t>(MemoryTag::parameters)] -
                  before.current[static_cast<size_t>(MemoryTag::parameters)],
              1 << 20);
    EXPECT_EQ(s.current_total - before.current_total, (1 << 20) + 1000);
    EXPECT_GE(s.reserved, s.current_total);
    EXPECT_EQ(b1->device(), kCuda0);
  }
  EXPECT_EQ(a.stats().current_total, before.current_total);
  auto again = a.allocate(1 << 20, MemoryTag::activations);
  EXPECT_GT(a.stats().cache_hits, before.cache_hits) << "the freed block is reused";
}

TEST_F(Cuda, OutOfMemoryNamesDeviceRequestAndTags) {
  Allocator& a = allocator_for(kCuda0);
  try {
    auto huge = a.allocate(size_t{1} << 50, MemoryTag::activations);  // 1 PiB
    FAIL() << "expected an out-of-memory error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("out of memory on cuda:0"), std::string::npos) << msg;
    EXPECT_NE(msg.find(std::to_string(size_t{1} << 50)), std::string::npos) << msg;
    EXPECT_NE(msg.find("parameters"), std::string::npos) << msg;
    EXPECT_NE(msg.find("reserved"), std::string::npos) << msg;
  }
}

TEST_F(Cuda, RoundTripCopiesAndStridedViews) {
  Tensor x = input({5, 7}, Dtype::f32, 37);
  Array on_gpu = copy_to_device(x.array(), kCuda0);
  EXPECT_EQ(on_gpu.device(), kCuda0);
  Array back = copy_to_device(on_gpu, Device::cpu());
  EXPECT_EQ(std::memcmp(back.raw(), x.array().raw(), x.array().nbytes()), 0);
  // A strided view comes back with its strides.
  compare([&] { return std::vector<Tensor>{transpose(x, 0, 1) * 1.0}; });
}

TEST_F(Cuda, CheckpointOfGpuTensorsAndIndicesOnTheGpu) {
  // Tensors computed on the GPU (a strided one too) are saved from host copies.
  Tensor x = input({4, 6}, Dtype::f32, 43);
  Tensor y, yt;
  {
    DeviceScope on(kCuda0);
    y = exp(x).eval();
    yt = transpose(y, 0, 1).eval();
  }
  ASSERT_EQ(y.array().device(), kCuda0);
  const std::string path = ::testing::TempDir() + "/cuda_checkpoint.safetensors";
  safetensors::save(path, {{"y", y}, {"yt", yt}});
  safetensors::File f = safetensors::load(path);
  // The saved bytes are the GPU's results, read back exactly.
  EXPECT_EQ(f.tensors.at("y").to_vector<float>(), y.to_vector<float>());
  EXPECT_EQ(f.tensors.at("yt").to_vector<float>(), yt.to_vector<float>());
  EXPECT_EQ(f.tensors.at("yt").shape(), (Shape{6, 4}));
  // Ids that live on the GPU are bounds-checked from a host copy when an op is built.
  Tensor ids;
  {
    DeviceScope on(kCuda0);
    ids = (from_vector(std::vector<int64_t>{1, 2, 9}, {3}) +
           from_vector(std::vector<int64_t>{0, 0, 0}, {3}))
              .eval();
  }
  ASSERT_EQ(ids.array().device(), kCuda0);
  ASSERT_EQ(ids.dtype(), Dtype::i64);
  try {
    (void)embedding(input({5, 2}, Dtype::f32, 44), ids);
    FAIL() << "expected a bounds error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("9"), std::string::npos) << e.what();
  }
}

// ---- without a device ------------------------------------------------------------------------

TEST(CudaAbsent, DeviceParseNamesTheDevicesFound) {
  if (have_cuda()) GTEST_SKIP() << "a CUDA device is present";
  try {
    (void)Device::parse("cuda:0");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_TRUE(msg.find("no CUDA device") != std::string::npos ||
                msg.find("no CUDA backend") != std::string::npos)
        << msg;
    EXPECT_NE(msg.find("devices found: cpu, sim:0"), std::string::npos) << msg;
  }
  try {
    (void)rt::parse_devices("cpu,cuda:0");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("device 'cuda:0' is not present"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW((void)allocator_for(kCuda0), Error);
  EXPECT_EQ(Device::parse_name("cuda:3"), (Device{DeviceKind::cuda, 3})) << "syntax alone is fine";
}

TEST(CudaAbsent, NodePinnedToAbsentGpuIsAnError) {
  if (have_cuda()) GTEST_SKIP() << "a CUDA device is present";
  Tensor x = ones({4});
  Tensor y;
  {
    DeviceScope on(kCuda0);
    y = exp(x);
  }
  try {
    y.eval();
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cuda:0"), std::string::npos) << e.what();
  }
}

TEST(CudaAbsent, PrimitiveWithoutKernelSaysSo) {
  // The default eval_cuda of a primitive with no CUDA kernel (no device needed to call it).
  Tensor x = ones({2, 3});
  Tensor g = gather(x, 1, from_vector(std::vector<int64_t>{0, 1}, {2, 1}));
  const Primitive* prim = g.node()->prim.get();
  ASSERT_NE(prim, nullptr);
  std::vector<const Array*> in;
  std::vector<Array*> out;
  try {
    prim->eval_cuda(in, out);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no CUDA kernel for gather"), std::string::npos)
        << e.what();
  }
}

TEST(CudaAbsent, PlacementKnowsWhichPrimitivesHaveCudaKernels) {
  // The scheduler never places a node on a CUDA device without its kernel.
  Tensor x = ones({2, 3});
  auto prim = [](const Tensor& t) { return t.node()->prim.get(); };
  EXPECT_FALSE(prim(gather(x, 1, from_vector(std::vector<int64_t>{0, 1}, {2, 1})))
                   ->has_kernel(DeviceKind::cuda));
  EXPECT_TRUE(prim(transpose(x, 0, 1))->has_kernel(DeviceKind::cuda)) << "views run anywhere";
  EXPECT_TRUE(prim(exp(x))->has_kernel(DeviceKind::cpu));
#if HETRAIN_HAVE_CUDA
  EXPECT_TRUE(prim(exp(x))->has_kernel(DeviceKind::cuda));
  EXPECT_TRUE(prim(matmul(x, transpose(x, 0, 1)))->has_kernel(DeviceKind::cuda));
  // Convolution, pooling and batch norm, forward and backward.
  Tensor img = ones({2, 3, 5, 5}), w = ones({4, 3, 3, 3});
  auto [v, g] = value_and_grad(
      [](const std::vector<Tensor>& t) {
        Tensor y = conv2d(t[0], t[1], {}, {1}, {1});
        y = batch_norm2d(y)[0];
        return sum(max_pool2d(y, {2})) + sum(avg_pool2d(y, {2}));
      },
      {img, w});
  std::vector<std::string> with_kernel;  // names of the graph's primitives with a CUDA kernel
  std::vector<const Node*> visited;
  std::function<void(const Tensor&)> visit = [&](const Tensor& t) {
    const Node* nd = t.node();
    if (std::find(visited.begin(), visited.end(), nd) != visited.end()) return;
    visited.push_back(nd);
    if (nd->prim && nd->prim->has_kernel(DeviceKind::cuda)) with_kernel.push_back(nd->prim->name());
    for (const Tensor& i : nd->inputs) visit(i);
  };
  for (const Tensor& t : g) visit(t);
  for (const char* name :
       {"conv2d", "conv2d_backward_input", "conv2d_backward_weight", "batch_norm2d",
        "batch_norm2d_backward", "max_pool2d", "max_pool2d_backward", "avg_pool2d_backward"})
    EXPECT_NE(std::find(with_kernel.begin(), with_kernel.end(), name), with_kernel.end()) << name;
#else
  EXPECT_FALSE(prim(exp(x))->has_kernel(DeviceKind::cuda));
#endif
}
