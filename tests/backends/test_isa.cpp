// The CPU's vector kernels at every width this CPU runs (cpu::isa_dispatch: baseline x86-64,
// AVX2 + FMA, AVX-512): each width against the same op in f64, and every width bit for bit equal
// to the baseline one, so a run gives the same numbers on any x86 CPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "backends/cpu/isa.h"
#include "cpu_test_support.h"
#include "hetrain/base/cpu_features.h"
#include "hetrain/graph/autodiff.h"
#include "hetrain/graph/ops.h"

using namespace hetrain;
using cpu::Isa;

namespace {

/// The outputs of a case for input tensors in one dtype (each case casts its inputs).
using Case = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;

using hetrain::testing::IsaScope;

std::vector<Isa> widths_here() {
  std::vector<Isa> v;
  for (Isa i : {Isa::baseline, Isa::avx2, Isa::avx512})
    if (i <= cpu::widest_isa()) v.push_back(i);
  return v;
}

std::vector<Tensor> cast_all(const std::vector<Tensor>& xs, Dtype d) {
  std::vector<Tensor> out;
  for (const Tensor& x : xs) out.push_back(x.dtype() == Dtype::i64 ? x : cast(x, d));
  return out;
}

/// Runs `f` at every width in f32 and once in f64: each f32 output within atol + rtol |want|
/// of the f64 one, and the same bits at every width.
void check(const std::string& name, const std::vector<Tensor>& inputs, const Case& f, double atol,
           double rtol) {
  std::vector<std::vector<double>> want;
  for (const Tensor& t : f(cast_all(inputs, Dtype::f64))) want.push_back(t.to_vector<double>());
  std::vector<std::vector<float>> first;
  for (Isa isa : widths_here()) {
    IsaScope scope(isa);
    const auto outs = f(cast_all(inputs, Dtype::f32));
    ASSERT_EQ(outs.size(), want.size()) << name;
    for (size_t k = 0; k < outs.size(); ++k) {
      ASSERT_EQ(outs[k].dtype(), Dtype::f32) << name << " output " << k;
      const auto got = outs[k].to_vector<float>();
      ASSERT_EQ(got.size(), want[k].size()) << name << " output " << k;
      for (size_t i = 0; i < got.size(); ++i)
        ASSERT_LE(std::abs(got[i] - want[k][i]), atol + rtol * std::abs(want[k][i]))
            << name << " output " << k << "[" << i << "] at " << cpu::isa_name(isa) << ": "
            << got[i] << ", f64 " << want[k][i];
      if (isa == Isa::baseline) {
        first.push_back(got);
      } else {
        ASSERT_EQ(std::memcmp(got.data(), first[k].data(), got.size() * sizeof(float)), 0)
            << name << " output " << k << ": " << cpu::isa_name(isa)
            << " differs in bits from baseline";
      }
    }
  }
}

}  // namespace

TEST(VectorIsa, WidestFollowsTheCpuFeatures) {
  const CpuFeatures& f = cpu_features();
  const Isa want = f.avx512f && f.avx512bw && f.avx512dq && f.avx512vl && f.avx2 && f.fma
                       ? Isa::avx512
                   : f.avx2 && f.fma ? Isa::avx2
                                     : Isa::baseline;
  EXPECT_EQ(cpu::widest_isa(), want) << cpu_features_string();
  // A request wider than the CPU is clamped; a narrower one holds.
  IsaScope scope(Isa::avx512);
  EXPECT_EQ(cpu::vector_isa(), want);
  cpu::set_vector_isa(Isa::baseline);
  EXPECT_EQ(cpu::vector_isa(), Isa::baseline);
  EXPECT_STREQ(cpu::isa_name(Isa::avx2), "avx2");
}

TEST(VectorIsa, EveryWidthMatchesF64AndAllWidthsAgreeBitForBit) {
  std::printf("widths here: %zu (widest %s)\n", widths_here().size(),
              cpu::isa_name(cpu::widest_isa()));
  Generator gen(7);
  // Odd sizes, so every loop has a vector body and a scalar tail.
  const Tensor v = randn({4099}, Dtype::f64, gen) * 3.0;
  const Tensor gv = randn({4099}, Dtype::f64, gen);
  check(
      "gelu_tanh and its gradient", {v, gv},
      [](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{gelu(in[0], "tanh"),
                                   grad({sum(gelu(in[0], "tanh") * in[1])}, {in[0]})[0]};
      },
      1e-6, 1e-5);
  check(
      "tanh, sigmoid, silu", {v},
      [](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{tanh(in[0]), sigmoid(in[0]), silu(in[0])};
      },
      1e-6, 1e-5);

  const Tensor x = randn({37, 389}, Dtype::f64, gen) * 2.0 + 0.5;
  const Tensor w = randn({389}, Dtype::f64, gen), b = randn({389}, Dtype::f64, gen);
  const Tensor g = randn({37, 389}, Dtype::f64, gen);
  check(
      "layer_norm and its gradients", {x, w, b, g},
      [](const std::vector<Tensor>& in) {
        const Tensor y = layer_norm(in[0], {389}, in[1], in[2]);
        auto d = grad({sum(y * in[3])}, {in[0], in[1], in[2]});
        return std::vector<Tensor>{y, d[0], d[1], d[2]};
      },
      1e-5, 1e-4);
  check(
      "softmax, log_softmax and their gradients", {x, g},
      [](const std::vector<Tensor>& in) {
        const Tensor s = softmax(in[0]), l = log_softmax(in[0]);
        auto d = grad({sum(s * in[1]) + sum(l * in[1])}, {in[0]});
        return std::vector<Tensor>{s, l, d[0]};
      },
      1e-6, 1e-5);
  std::vector<int64_t> targets;
  for (int64_t i = 0; i < 37; ++i) targets.push_back((i * 131) % 389);
  targets[5] = -100;  // ignored
  const Tensor t = from_vector(targets, {37});
  check(
      "cross_entropy and its gradient", {x, t},
      [](const std::vector<Tensor>& in) {
        const Tensor l = cross_entropy(in[0], in[1], -100, "none");
        return std::vector<Tensor>{l, grad({sum(l)}, {in[0]})[0]};
      },
      1e-5, 1e-5);
  check(
      "row and column sums, row max", {x},
      [](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{sum(in[0], {1}), sum(in[0], {0}), max(in[0], {1})};
      },
      1e-4, 1e-5);

  const Tensor img = randn({3, 5, 7, 9}, Dtype::f64, gen) + 0.3;
  const Tensor res = randn({3, 5, 7, 9}, Dtype::f64, gen);
  const Tensor bw = randn({5}, Dtype::f64, gen), bb = randn({5}, Dtype::f64, gen);
  const Tensor bg = randn({3, 5, 7, 9}, Dtype::f64, gen);
  check(
      "batch_norm2d (relu, residual) and its gradients", {img, bw, bb, res, bg},
      [](const std::vector<Tensor>& in) {
        auto [y, m, var] = batch_norm2d(in[0], in[1], in[2], 1e-5, true, in[3]);
        auto d = grad({sum(y * in[4])}, {in[0], in[1], in[2], in[3]});
        return std::vector<Tensor>{y, m, var, d[0], d[1], d[2], d[3]};
      },
      1e-5, 1e-4);

  const Tensor qkv = randn({2, 37, 96}, Dtype::f64, gen);
  const Tensor ag = randn({2, 37, 32}, Dtype::f64, gen);
  check(
      "causal attention and its gradient", {qkv, ag},
      [](const std::vector<Tensor>& in) {
        const Tensor y = scaled_dot_product_attention_packed(in[0], 2, true);
        return std::vector<Tensor>{y, grad({sum(y * in[1])}, {in[0]})[0]};
      },
      1e-5, 1e-4);
}
