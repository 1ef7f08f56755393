// scaled_dot_product_attention: the fused kernel against PyTorch 1.13 numbers, against the
// unfused reference composition (values and gradients, across tile boundaries), finite
// differences, memory growth, and error messages.
#include <gtest/gtest.h>

#include <cmath>

#include "graph/prims/attention.h"
#include "hetrain/base/error.h"
#include "hetrain/graph/autodiff.h"
#include "hetrain/graph/ops.h"
#include "hetrain/memory/allocator.h"
#include "hetrain/runtime/eval.h"
#include "testing.h"

using namespace hetrain;
using hetrain::testing::check_grad_fd;
using hetrain::testing::expect_close;

namespace {

// The same values as seq() in the PyTorch snippets:
//   def seq(shape, a):
//       return torch.tensor([((i * 37 + a) % 101) / 50.0 - 1.0 for i in range(prod(shape))],
//                           dtype=torch.float64).reshape(shape)
Tensor seq(const Shape& shape, int64_t a, Dtype dt = Dtype::f64) {
  std::vector<double> v(static_cast<size_t>(numel(shape)));
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = static_cast<double>((static_cast<int64_t>(i) * 37 + a) % 101) / 50.0 - 1.0;
  return cast(from_vector(v, shape), dt);
}

template <class F>
void expect_error(F&& f, const std::string& msg) {
  try {
    f();
    FAIL() << "expected an error: " << msg;
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), msg);
  }
}

}  // namespace

TEST(Attention, MatchesPyTorch) {
  // q = seq((1, 2, 3, 4), 1); k = seq((1, 2, 5, 4), 2); v = seq((1, 2, 5, 3), 4)
  // (PyTorch 1.13 has no F.scaled_dot_product_attention; this is its definition:)
  // torch.softmax(q @ k.transpose(-1, -2) / 2.0, -1) @ v
  const std::vector<double> plain = {
      -0.65772265, 0.082277354, 0.3378579,    -0.51574048, 0.22425952,  0.081705034,
      -0.52092712, 0.21907288,  0.38162545,   0.42436994,  -0.2812005,  -0.11563006,
      0.47425575,  -0.58638176, -0.065744254, 0.42034084,  -0.27089131, -0.11965916};
  // mask = torch.ones(3, 5).tril().bool(); s = (q @ k.transpose(-1, -2)) * 0.7
  // torch.softmax(s.masked_fill(~mask, float("-inf")), -1) @ v
  const std::vector<double> causal = {
      -0.92,      -0.18,       0.56,        -0.77465617, -0.034656173, 0.70534383,
      -0.6200254, 0.1199746,   0.8599746,   0.08,        0.82,         -0.46,
      0.24830556, -0.71158063, -0.29169444, 0.28750713,  -0.15066131,  -0.25249287};
  for (Dtype dt : {Dtype::f64, Dtype::f32, Dtype::bf16}) {
    Tensor q = seq({1, 2, 3, 4}, 1, dt), k = seq({1, 2, 5, 4}, 2, dt), v = seq({1, 2, 5, 3}, 4, dt);
    const double tol = dt == Dtype::f64   ? 2e-8
                       : dt == Dtype::f32 ? 1e-6
                                          : 3e-2;  // 8 digits printed
    Tensor o = scaled_dot_product_attention(q, k, v);
    EXPECT_EQ(o.shape(), (Shape{1, 2, 3, 3}));
    EXPECT_EQ(o.dtype(), dt);
    expect_close(o, plain, tol, tol, "plain");
    expect_close(scaled_dot_product_attention(q, k, v, true, 0.7), causal, tol, tol, "causal");
    expect_close(scaled_dot_product_attention_reference(q, k, v, true, 0.7), causal, tol, tol,
                 "reference");
  }
}

TEST(Attention, FusedMatchesReferenceAcrossTiles) {
  // Lengths that cross the 128-row and 256-key tiles, Lq < Lk and Lq > Lk, broadcast batch.
  struct Case {
    Shape q, k, v;
    bool causal;
  };
  const Case cases[] = {
      {{2, 3, 150, 16}, {2, 3, 300, 16}, {2, 3, 300, 8}, false},
      {{2, 3, 150, 16}, {2, 3, 300, 16}, {2, 3, 300, 8}, true},
      {{1, 200, 8}, {1, 129, 8}, {1, 129, 12}, true},
      {{2, 2, 65, 4}, {1, 2, 257, 4}, {2, 1, 257, 4}, false},
  };
  for (const Case& c : cases) {
    for (Dtype dt : {Dtype::f64, Dtype::f32}) {
      Tensor q = seq(c.q, 1, dt), k = seq(c.k, 2, dt), v = seq(c.v, 3, dt);
      auto loss_of = [&](auto attn) {
        return [&, attn](const std::vector<Tensor>& in) {
          Tensor o = attn(in[0], in[1], in[2], c.causal, std::optional<double>());
          // A fixed, non-uniform cotangent: o * r with r built from o's shape.
          Tensor r = seq(o.shape(), 5, dt);
          return sum(o * r);
        };
      };
      auto fused = loss_of(
          [](const Tensor& a, const Tensor& b, const Tensor& d, bool cz, std::optional<double> s) {
            return scaled_dot_product_attention(a, b, d, cz, s);
          });
      auto ref = loss_of(
          [](const Tensor& a, const Tensor& b, const Tensor& d, bool cz, std::optional<double> s) {
            return scaled_dot_product_attention_reference(a, b, d, cz, s);
          });
      const double tol = dt == Dtype::f64 ? 1e-10 : 2e-4;
      std::string what =
          shape_str(c.q) + (c.causal ? " causal " : " ") + std::string(dtype_name(dt));
      expect_close(scaled_dot_product_attention(q, k, v, c.causal),
                   scaled_dot_product_attention_reference(q, k, v, c.causal).to_vector<double>(),
                   tol, tol, what);
      auto [lf, gf] = value_and_grad(fused, {q, k, v});
      auto [lr, gr] = value_and_grad(ref, {q, k, v});
      EXPECT_NEAR(lf.item<double>(), lr.item<double>(), tol * 100);
      for (size_t i = 0; i < 3; ++i) {
        EXPECT_EQ(gf[i].shape(), gr[i].shape());
        expect_close(gf[i], gr[i].to_vector<double>(), tol * 10, tol * 10,
                     what + " grad " + std::to_string(i));
      }
    }
  }
}

/// The packed op's definition: split qkv (N, L, 3D), view each part as (N, H, L, d), attend with
/// the reference composition, merge the heads.
Tensor packed_by_composition(const Tensor& qkv, int64_t heads, bool causal, double scale) {
  const int64_t N = qkv.size(0), L = qkv.size(1), D = qkv.size(2) / 3, d = D / heads;
  auto parts = split(qkv, {D, D, D}, 2);
  auto head = [&](const Tensor& t) { return transpose(reshape(t, {N, L, heads, d}), 1, 2); };
  Tensor y = scaled_dot_product_attention_reference(head(parts[0]), head(parts[1]), head(parts[2]),
                                                    causal, scale);
  return reshape(transpose(y, 1, 2), {N, L, D});
}

TEST(Attention, PackedMatchesSplitHeadsAcrossTiles) {
  // L = 300 crosses the 128-row query and 256-key tiles; N * H = 2 batch-heads on 2 threads
  // splits the key blocks of a head in the backward (dQ partials). Values and the gradient
  // with respect to qkv against the composition with splits, head views and the reference.
  struct Case {
    int64_t N, L, D, heads;
    bool causal;
  };
  for (const Case& c : {Case{2, 7, 6, 2, false}, Case{2, 7, 6, 2, true}, Case{1, 300, 16, 2, true},
                        Case{3, 40, 24, 4, true}, Case{1, 300, 8, 1, false}}) {
    for (Dtype dt : {Dtype::f64, Dtype::f32}) {
      const double scale = 0.6;
      Tensor qkv = seq({c.N, c.L, 3 * c.D}, 1, dt);
      Tensor r = seq({c.N, c.L, c.D}, 5, dt);  // a fixed, non-uniform cotangent
      auto fused = [&](const std::vector<Tensor>& in) {
        return sum(scaled_dot_product_attention_packed(in[0], c.heads, c.causal, scale) * r);
      };
      auto ref = [&](const std::vector<Tensor>& in) {
        return sum(packed_by_composition(in[0], c.heads, c.causal, scale) * r);
      };
      const double tol = dt == Dtype::f64 ? 1e-10 : 2e-4;
      const std::string what = "N " + std::to_string(c.N) + " L " + std::to_string(c.L) +
                               " heads " + std::to_string(c.heads) + (c.causal ? " causal " : " ") +
                               std::string(dtype_name(dt));
      Tensor o = scaled_dot_product_attention_packed(qkv, c.heads, c.causal, scale);
      EXPECT_EQ(o.shape(), (Shape{c.N, c.L, c.D})) << what;
      expect_close(o, packed_by_composition(qkv, c.heads, c.causal, scale).to_vector<double>(), tol,
                   tol, what);
      auto [lf, gf] = value_and_grad(fused, {qkv});
      auto [lr, gr] = value_and_grad(ref, {qkv});
      EXPECT_NEAR(lf.item<double>(), lr.item<double>(), tol * 100) << what;
      EXPECT_EQ(gf[0].shape(), qkv.shape());
      expect_close(gf[0], gr[0].to_vector<double>(), tol * 10, tol * 10, what + " grad");
    }
  }
}

TEST(Attention, PackedGradientMatchesFiniteDifferences) {
  for (bool causal : {false, true}) {
    auto f = [&](const std::vector<Tensor>& in) {
      return scaled_dot_product_attention_packed(in[0], 2, causal, 0.8);
    };
    check_grad_fd(f, {seq({2, 5, 12}, 1)}, 1e-6, 1e-7);
  }
}

TEST(Attention, PackedBadShapesGiveClearErrors) {
  const std::string op = "[scaled_dot_product_attention_packed] ";
  expect_error(
      [] {
        scaled_dot_product_attention_packed(zeros({2, 8, 12}), 0);
      },
      op + "heads must be positive, got 0");
  expect_error(
      [] {
        scaled_dot_product_attention_packed(zeros({2, 8, 12}), 3);
      },
      op + "expected qkv (N, L, 3 * D) with L > 0 and D a multiple of 3 heads, got "
           "(2, 8, 12)");
  expect_error(
      [] {
        scaled_dot_product_attention_packed(zeros({8, 12}), 2);
      },
      op + "expected qkv (N, L, 3 * D) with L > 0 and D a multiple of 2 heads, got "
           "(8, 12)");
  expect_error(
      [] {
        scaled_dot_product_attention_packed(zeros({2, 8, 12}, Dtype::i64), 2);
      },
      op + "needs a floating-point qkv, got i64");
}

TEST(Attention, GradientsMatchFiniteDifferences) {
  for (bool causal : {false, true}) {
    auto f = [&](const std::vector<Tensor>& in) {
      return scaled_dot_product_attention(in[0], in[1], in[2], causal, 0.8);
    };
    check_grad_fd(f, {seq({2, 5, 3}, 1), seq({2, 7, 3}, 2), seq({2, 7, 4}, 3)}, 1e-6, 1e-7);
    // Lq > Lk: later rows see every key.
    check_grad_fd(f, {seq({1, 6, 2}, 4), seq({1, 3, 2}, 5), seq({1, 3, 2}, 6)}, 1e-6, 1e-7);
  }
}

TEST(Attention, HalfPrecisionComputesInF32) {
  Tensor q = seq({2, 40, 8}, 1, Dtype::f16), k = seq({2, 70, 8}, 2, Dtype::f16);
  Tensor v = seq({2, 70, 8}, 3, Dtype::f16);
  Tensor o = scaled_dot_product_attention(q, k, v, true);
  EXPECT_EQ(o.dtype(), Dtype::f16);
  Tensor o32 = scaled_dot_product_attention(cast(q, Dtype::f32), cast(k, Dtype::f32),
                                            cast(v, Dtype::f32), true);
  expect_close(o, o32.to_vector<double>(), 2e-3, 2e-3);
  Tensor ql = q.detach().requires_grad_();
  sum(scaled_dot_product_attention(ql, k, v, true)).backward();
  EXPECT_EQ(ql.grad().dtype(), Dtype::f16);
  EXPECT_EQ(ql.grad().shape(), q.shape());
}

TEST(Attention, MemoryGrowsWithLengthNotItsSquare) {
  // One head, L = 2048: the score matrix alone would be L^2 floats = 16 MiB.
  const int64_t L = 2048, E = 32;
  Tensor q = seq({1, L, E}, 1, Dtype::f32).eval(), k = seq({1, L, E}, 2, Dtype::f32).eval();
  Tensor v = seq({1, L, E}, 3, Dtype::f32).eval();
  const double l2 = static_cast<double>(L * L) * sizeof(float);
  auto peak_of = [&](bool fused) {
    auto f = [&](const std::vector<Tensor>& in) {
      Tensor o = fused ? scaled_dot_product_attention(in[0], in[1], in[2], true)
                       : scaled_dot_product_attention_reference(in[0], in[1], in[2], true);
      return sum(o);
    };
    host_allocator().reset_peak();
    const int64_t before = host_allocator().stats().current_total;
    auto [loss, grads] = value_and_grad(f, {q, k, v});
    eval(std::vector<Tensor>{loss, grads[0], grads[1], grads[2]});
    return static_cast<double>(host_allocator().stats().peak_total - before);
  };
  const double fused = peak_of(true), reference = peak_of(false);
  // o, dq, dk, dv, the materialised cotangent, a dQ partial and two threads' score tiles:
  // about 2 MiB here (L * E floats each, 256 KiB per tile pair), far below L^2 floats.
  EXPECT_LT(fused, l2 / 4) << "fused peak " << fused / 1048576 << " MiB";
  // The unfused composition materialises the scores: the test can tell them apart.
  EXPECT_GT(reference, l2) << "reference peak " << reference / 1048576 << " MiB";
}

TEST(Attention, BadShapesGiveClearErrors) {
  const std::string op = "[scaled_dot_product_attention] ";
  expect_error(
      [] {
        scaled_dot_product_attention(zeros({2, 4, 8, 16}), zeros({2, 4, 8, 32}),
                                     zeros({2, 4, 8, 16}));
      },
      op + "q and k differ in embedding size: q (2, 4, 8, 16), k (2, 4, 8, 32)");
  expect_error(
      [] {
        scaled_dot_product_attention(zeros({4, 8, 16}), zeros({4, 9, 16}), zeros({4, 8, 16}));
      },
      op + "k and v differ in sequence length: k (4, 9, 16), v (4, 8, 16)");
  expect_error(
      [] {
        scaled_dot_product_attention(zeros({3, 8, 16}), zeros({4, 8, 16}), zeros({4, 8, 16}));
      },
      op + "batch dimensions do not broadcast: q (3, 8, 16), k (4, 8, 16), v (4, 8, 16)");
  expect_error(
      [] {
        scaled_dot_product_attention(zeros({16}), zeros({4, 16}), zeros({4, 16}));
      },
      op + "q, k and v need at least 2 dimensions (..., L, E), got q (16), k (4, 16), "
           "v (4, 16)");
}
