// The conv kernels' register tile (fma_tile.h) at every vector width this CPU has: the direct
// forward is, bit for bit, a chain of FMAs over the taps in (channel, row, column) order at each
// width, so a width whose products were not fused, or whose column tiles skipped or repeated
// columns (the tails: 16-lane tiles of fewer vectors and an 8-lane one at AVX-512), fails; and
// every pass of the direct and Winograd kernels gives the same bits at AVX2 and AVX-512 width.
// Their agreement with f64 loops at the default width is in test_conv_winograd.cpp and the graph
// tests.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "backends/cpu/conv_direct.h"
#include "backends/cpu/conv_winograd.h"
#include "backends/cpu/isa.h"
#include "cpu_test_support.h"
#include "testing.h"

using namespace hetrain;
using cpu::ConvShape;
using cpu::Isa;

namespace {

using hetrain::testing::has_avx2_fma;
using hetrain::testing::IsaScope;
using hetrain::testing::lcg_values;

/// The widths the tiles run at on this CPU, widest first (AVX-512 where it has it, then AVX2):
/// a width that skipped columns would otherwise find a narrower run's right answers in the
/// reused workspace.
std::vector<Isa> tile_widths() {
  std::vector<Isa> v;
  if (cpu::widest_isa() == Isa::avx512) v.push_back(Isa::avx512);
  v.push_back(Isa::avx2);
  return v;
}

ConvShape conv_shape(int64_t N, int64_t C, int64_t H, int64_t O, int64_t k, int64_t s, int64_t p) {
  const int64_t Ho = (H + 2 * p - k) / s + 1;
  return {N, C, H, H, O, Ho, Ho, k, k, s, s, p, p};
}

/// y = conv(x, w), each output a chain acc = fma(w, x, acc) from +0 over (c, i, j) in order,
/// padding read as zeros: what the direct forward computes at any width.
std::vector<float> fma_chain(const ConvShape& s, const std::vector<float>& x,
                             const std::vector<float>& w) {
  std::vector<float> y(static_cast<size_t>(s.N * s.O * s.Ho * s.Wo));
  for (int64_t n = 0; n < s.N; ++n)
    for (int64_t o = 0; o < s.O; ++o)
      for (int64_t oh = 0; oh < s.Ho; ++oh)
        for (int64_t ow = 0; ow < s.Wo; ++ow) {
          float acc = 0.0f;
          for (int64_t c = 0; c < s.C; ++c)
            for (int64_t i = 0; i < s.kh; ++i)
              for (int64_t j = 0; j < s.kw; ++j) {
                const int64_t h = oh * s.sh + i - s.ph, ww = ow * s.sw + j - s.pw;
                const bool in = h >= 0 && h < s.H && ww >= 0 && ww < s.W;
                const float xv =
                    in ? x[static_cast<size_t>(((n * s.C + c) * s.H + h) * s.W + ww)] : 0.0f;
                acc = std::fma(w[static_cast<size_t>(((o * s.C + c) * s.kh + i) * s.kw + j)], xv,
                               acc);
              }
          y[static_cast<size_t>(((n * s.O + o) * s.Ho + oh) * s.Wo + ow)] = acc;
        }
  return y;
}

std::string describe(const ConvShape& s) {
  return "N=" + std::to_string(s.N) + " C=" + std::to_string(s.C) + " H=" + std::to_string(s.H) +
         " O=" + std::to_string(s.O) + " k=" + std::to_string(s.kh) +
         " stride=" + std::to_string(s.sh) + " pad=" + std::to_string(s.ph);
}

/// Shapes whose forward grids end in each kind of column tail (grid positions Ho * Wq rounded
/// to 8: 840 = 13 x 64 + 8, 168 = 2 x 64 + 40, 200 = 3 x 64 + 8, 216 = 3 x 64 + 24, 160 = 2 x 64
/// + 32, 168 again), stride 1 and 2, and row blocks of 1 to 4 channels.
std::vector<ConvShape> direct_shapes() {
  return {conv_shape(2, 16, 28, 16, 3, 1, 1), conv_shape(3, 3, 12, 5, 3, 1, 1),
          conv_shape(1, 4, 13, 7, 3, 1, 1),   conv_shape(2, 16, 28, 32, 3, 2, 1),
          conv_shape(2, 5, 24, 6, 3, 2, 1),   conv_shape(1, 2, 14, 3, 3, 1, 0)};
}

}  // namespace

TEST(ConvTiles, DirectForwardIsAnFmaChainAtEveryWidth) {
  if (!has_avx2_fma()) GTEST_SKIP() << "the direct kernels need AVX2 and FMA";
  for (const ConvShape& s : direct_shapes()) {
    const auto x = lcg_values(s.N * s.C * s.H * s.W, 1), w = lcg_values(s.O * s.C * s.kh * s.kw, 2);
    const std::vector<float> want = fma_chain(s, x, w);
    for (Isa isa : tile_widths()) {
      IsaScope scope(isa);
      std::vector<float> y(want.size(), NAN);
      ASSERT_TRUE(cpu::direct_conv_forward(s, x.data(), w.data(), nullptr, y.data()))
          << describe(s);
      size_t bad = 0;
      for (size_t i = 0; i < y.size(); ++i) bad += y[i] != want[i];
      EXPECT_EQ(bad, 0u) << describe(s) << " at " << cpu::isa_name(isa) << ": " << bad << " of "
                         << y.size() << " outputs differ from the FMA chain";
    }
  }
}

TEST(ConvTiles, EveryPassGivesTheSameBitsAtEveryWidth) {
  if (cpu::widest_isa() != Isa::avx512) GTEST_SKIP() << "one tile width on this CPU (AVX2)";
  struct Passes {
    std::vector<float> y, dx, dw;
  };
  auto run = [](const ConvShape& s, bool winograd, Isa isa) {
    IsaScope scope(isa);
    const auto x = lcg_values(s.N * s.C * s.H * s.W, 3), w = lcg_values(s.O * s.C * s.kh * s.kw, 4),
               b = lcg_values(s.O, 5), gy = lcg_values(s.N * s.O * s.Ho * s.Wo, 6);
    Passes p{std::vector<float>(gy.size(), NAN), std::vector<float>(x.size(), NAN),
             std::vector<float>(w.size(), NAN)};
    if (winograd) {
      EXPECT_TRUE(cpu::winograd_conv_forward(s, x.data(), w.data(), b.data(), p.y.data()));
      EXPECT_TRUE(cpu::winograd_conv_backward_data(s, gy.data(), w.data(), p.dx.data()));
      EXPECT_TRUE(cpu::winograd_conv_backward_weights(s, x.data(), gy.data(), p.dw.data()));
    } else {
      EXPECT_TRUE(cpu::direct_conv_forward(s, x.data(), w.data(), b.data(), p.y.data()));
      EXPECT_TRUE(cpu::direct_conv_backward_data(s, gy.data(), w.data(), p.dx.data()));
      EXPECT_TRUE(cpu::direct_conv_backward_weights(s, x.data(), gy.data(), p.dw.data()));
    }
    return p;
  };
  for (const ConvShape& s : direct_shapes()) {
    const Passes b = run(s, false, Isa::avx512), a = run(s, false, Isa::avx2);
    EXPECT_EQ(a.y, b.y) << "direct forward, " << describe(s);
    EXPECT_EQ(a.dx, b.dx) << "direct input gradient, " << describe(s);
    EXPECT_EQ(a.dw, b.dw) << "direct weight gradient, " << describe(s);
  }
  // Winograd: 28 and 14 wide (4x4 tiles), 7 wide (2x2, paired rows), 9 wide (2x2), with weight
  // gradients over 8 to 24 output channels (the 8-lane tail at AVX-512 and whole vectors).
  for (const ConvShape& s : {conv_shape(2, 16, 28, 16, 3, 1, 1), conv_shape(3, 32, 14, 24, 3, 1, 1),
                             conv_shape(4, 8, 7, 64, 3, 1, 1), conv_shape(2, 5, 9, 3, 3, 1, 0)}) {
    const Passes b = run(s, true, Isa::avx512), a = run(s, true, Isa::avx2);
    EXPECT_EQ(a.y, b.y) << "Winograd forward, " << describe(s);
    EXPECT_EQ(a.dx, b.dx) << "Winograd input gradient, " << describe(s);
    EXPECT_EQ(a.dw, b.dw) << "Winograd weight gradient, " << describe(s);
  }
}
