// The Winograd conv kernels (conv_winograd.cpp) against plain f64 loops: forward, input gradient
// and weight gradient on odd shapes (ragged tiles, one channel, batches that split unevenly over
// the threads) and one fashion-cnn shape, with padding 0 and 1, each with 2x2 (F(2x2, 3x3)) and
// 4x4 (F(4x4, 3x3)) output tiles forced; the tile size picked by output width; the shapes they
// must refuse; and results that do not depend on the thread count.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "backends/cpu/conv_winograd.h"
#include "cpu_test_support.h"
#include "hetrain/base/thread_pool.h"
#include "testing.h"

using namespace hetrain;
using cpu::ConvShape;

namespace {

using hetrain::testing::has_avx2_fma;

ConvShape shape3x3(int64_t N, int64_t C, int64_t H, int64_t W, int64_t O, int64_t ph, int64_t pw) {
  return {N, C, H, W, O, H + 2 * ph - 2, W + 2 * pw - 2, 3, 3, 1, 1, ph, pw};
}

using hetrain::testing::lcg_values;

/// Calls f(n, o, oh, ow, c, i, j, h, w) for every product of the convolution, h and w the input
/// position (inside the image).
template <class F>
void each_product(const ConvShape& s, F f) {
  for (int64_t n = 0; n < s.N; ++n)
    for (int64_t o = 0; o < s.O; ++o)
      for (int64_t oh = 0; oh < s.Ho; ++oh)
        for (int64_t ow = 0; ow < s.Wo; ++ow)
          for (int64_t c = 0; c < s.C; ++c)
            for (int64_t i = 0; i < 3; ++i)
              for (int64_t j = 0; j < 3; ++j) {
                const int64_t h = oh + i - s.ph, w = ow + j - s.pw;
                if (h >= 0 && h < s.H && w >= 0 && w < s.W) f(n, o, oh, ow, c, i, j, h, w);
              }
}

/// Largest |got - want| over the largest |want|.
double relative_error(const std::vector<float>& got, const std::vector<double>& want) {
  double err = 0, scale = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double e = std::abs(got[i] - want[i]);
    err = std::isnan(e) ? INFINITY : std::max(err, e);
    scale = std::max(scale, std::abs(want[i]));
  }
  return err / scale;
}

struct Passes {
  std::vector<float> y, dx, dw;
};

/// The three passes with output tiles of size m (0: picked by output width).
Passes run_winograd(const ConvShape& s, const std::vector<float>& x, const std::vector<float>& w,
                    const std::vector<float>& b, const std::vector<float>& gy, int64_t m = 0) {
  cpu::set_winograd_tile_size(m);
  Passes r{std::vector<float>(gy.size(), NAN), std::vector<float>(x.size(), NAN),
           std::vector<float>(w.size(), NAN)};
  EXPECT_TRUE(cpu::winograd_conv_forward(s, x.data(), w.data(), b.data(), r.y.data()));
  EXPECT_TRUE(cpu::winograd_conv_backward_data(s, gy.data(), w.data(), r.dx.data()));
  EXPECT_TRUE(cpu::winograd_conv_backward_weights(s, x.data(), gy.data(), r.dw.data()));
  cpu::set_winograd_tile_size(0);
  return r;
}

void check_against_reference(const ConvShape& s) {
  const auto x = lcg_values(s.N * s.C * s.H * s.W, 1), w = lcg_values(s.O * s.C * 9, 2),
             b = lcg_values(s.O, 3), gy = lcg_values(s.N * s.O * s.Ho * s.Wo, 4);
  std::vector<double> y(gy.size()), dx(x.size(), 0.0), dw(w.size(), 0.0);
  for (int64_t i = 0; i < static_cast<int64_t>(y.size()); ++i) y[i] = b[i / (s.Ho * s.Wo) % s.O];
  each_product(s, [&](int64_t n, int64_t o, int64_t oh, int64_t ow, int64_t c, int64_t i, int64_t j,
                      int64_t h, int64_t ww) {
    const int64_t yi = ((n * s.O + o) * s.Ho + oh) * s.Wo + ow;
    const int64_t xi = ((n * s.C + c) * s.H + h) * s.W + ww, wi = ((o * s.C + c) * 3 + i) * 3 + j;
    y[yi] += static_cast<double>(x[xi]) * w[wi];
    dx[xi] += static_cast<double>(gy[yi]) * w[wi];
    dw[wi] += static_cast<double>(gy[yi]) * x[xi];
  });
  for (int64_t m : {2, 4}) {
    const Passes got = run_winograd(s, x, w, b, gy, m);
    // Rounding of f32 sums over C * 9 (forward, input gradient) or N * Ho * Wo (weight gradient)
    // terms, plus the transforms' extra additions and their factors (up to 8 at 4x4 tiles):
    // measured up to 7e-7 with 2x2 tiles and 6e-6 with 4x4 tiles (40 channels, all passes).
    const std::string what =
        std::to_string(m) + "x" + std::to_string(m) + " tiles, N=" + std::to_string(s.N) +
        " C=" + std::to_string(s.C) + " H=" + std::to_string(s.H) + " W=" + std::to_string(s.W) +
        " O=" + std::to_string(s.O) + " p=" + std::to_string(s.ph) + "," + std::to_string(s.pw);
    EXPECT_LT(relative_error(got.y, y), 1e-5) << what << ": forward";
    EXPECT_LT(relative_error(got.dx, dx), 1e-5) << what << ": input gradient";
    EXPECT_LT(relative_error(got.dw, dw), 1e-5) << what << ": weight gradient";
  }
}

}  // namespace

TEST(ConvWinograd, MatchesReferenceOnOddShapes) {
  if (!has_avx2_fma()) GTEST_SKIP() << "needs AVX2 and FMA";
  const int64_t runs = cpu::winograd_conv_runs();
  int64_t cases = 0;
  for (int64_t p : {0, 1}) {
    check_against_reference(shape3x3(3, 5, 9, 11, 7, p, p));     // odd Ho, Wo: ragged tiles
    check_against_reference(shape3x3(2, 1, 28, 28, 16, p, p));   // fashion-cnn's stem
    check_against_reference(shape3x3(5, 9, 6, 19, 10, p, p));    // O, C not multiples of 4 or 8
    check_against_reference(shape3x3(1, 2, 3, 3, 3, p, p));      // a single tile
    check_against_reference(shape3x3(2, 40, 31, 30, 40, p, p));  // image over the block target
    // 7 and 8 wide: 2x2 tile rows of 4 tiles, two per vector; 3 images of 3 or 2 tile rows put an
    // odd number of tile rows in a block at p = 1, 9 wide ones in between (p = 0: 7 wide).
    check_against_reference(shape3x3(3, 6, 5, 8, 5, p, p));
    check_against_reference(shape3x3(3, 6, 5, 9, 5, p, p));
    check_against_reference(shape3x3(4, 9, 7, 7, 12, p, p));
    // 13 to 15 wide: 4x4 tile rows of 4 tiles, two per vector, 3 tile rows per image at p = 1.
    check_against_reference(shape3x3(3, 6, 9, 15, 5, p, p));
    cases += 9;
  }
  check_against_reference(shape3x3(2, 3, 4, 5, 6, 1, 0));  // padding differs per axis
  check_against_reference(shape3x3(2, 4, 7, 4, 5, 0, 1));
  cases += 2;
  EXPECT_EQ(cpu::winograd_conv_runs() - runs, 2 * 3 * cases);
}

TEST(ConvWinograd, MatchesReferenceOnFashionCnnShape) {
  if (!has_avx2_fma()) GTEST_SKIP() << "needs AVX2 and FMA";
  for (int64_t p : {0, 1}) check_against_reference(shape3x3(3, 32, 14, 14, 32, p, p));
}

TEST(ConvWinograd, TileSizeFollowsOutputWidth) {
  if (!has_avx2_fma()) GTEST_SKIP() << "needs AVX2 and FMA";
  // The picked size gives the bits of the forced one: 4x4 from 20 wide and, in the forward and
  // input-gradient passes, at 13 to 16 wide (tile rows of 4 tiles, two per vector); 2x2 below and
  // for the weight gradient at 13 to 16. The input gradient's output is the input, so a 19-wide
  // output with a 21-wide input takes both sizes.
  struct Case {
    ConvShape s;
    int64_t fwd, bwd, wgrad;
  };
  for (const Case& c : {Case{shape3x3(2, 8, 22, 22, 8, 0, 0), 4, 4, 4},
                        Case{shape3x3(2, 8, 21, 21, 8, 0, 0), 2, 4, 2},
                        Case{shape3x3(3, 8, 14, 14, 8, 1, 1), 4, 4, 2},
                        Case{shape3x3(2, 8, 10, 10, 8, 1, 1), 2, 2, 2}}) {
    const ConvShape& s = c.s;
    const auto x = lcg_values(s.N * s.C * s.H * s.W, 1), w = lcg_values(s.O * s.C * 9, 2),
               b = lcg_values(s.O, 3), gy = lcg_values(s.N * s.O * s.Ho * s.Wo, 4);
    const Passes picked = run_winograd(s, x, w, b, gy);
    const Passes two = run_winograd(s, x, w, b, gy, 2), four = run_winograd(s, x, w, b, gy, 4);
    const std::string what = "W=" + std::to_string(s.W) + " Wo=" + std::to_string(s.Wo);
    EXPECT_EQ(picked.y, (c.fwd == 4 ? four : two).y) << what;
    EXPECT_NE(picked.y, (c.fwd == 4 ? two : four).y) << what;
    EXPECT_EQ(picked.dx, (c.bwd == 4 ? four : two).dx) << what;
    EXPECT_NE(picked.dx, (c.bwd == 4 ? two : four).dx) << what;
    EXPECT_EQ(picked.dw, (c.wgrad == 4 ? four : two).dw) << what;
    EXPECT_NE(picked.dw, (c.wgrad == 4 ? two : four).dw) << what;
  }
}

TEST(ConvWinograd, RefusesOtherConvolutions) {
  const auto x = lcg_values(2 * 4 * 12 * 12, 1), w = lcg_values(4 * 4 * 25, 2),
             y = lcg_values(2 * 4 * 144, 3);
  std::vector<float> out(4096);
  ConvShape stride2 = shape3x3(2, 4, 12, 12, 4, 1, 1);
  stride2.sh = stride2.sw = 2;
  stride2.Ho = stride2.Wo = 6;
  ConvShape k5 = {2, 4, 12, 12, 4, 12, 12, 5, 5, 1, 1, 2, 2};
  ConvShape pad2 = shape3x3(2, 4, 12, 12, 4, 2, 2);
  ConvShape large = shape3x3(2, 64, 80, 80, 64, 1, 1);  // refused before reading any data
  for (const ConvShape& s : {stride2, k5, pad2, large}) {
    EXPECT_FALSE(cpu::winograd_conv_forward(s, x.data(), w.data(), nullptr, out.data()));
    EXPECT_FALSE(cpu::winograd_conv_backward_data(s, y.data(), w.data(), out.data()));
    EXPECT_FALSE(cpu::winograd_conv_backward_weights(s, x.data(), y.data(), out.data()));
  }
  // Only 2x2 and 4x4 tiles exist (0: picked by width).
  EXPECT_THROW(cpu::set_winograd_tile_size(3), std::invalid_argument);
  EXPECT_THROW(cpu::set_winograd_tile_size(-2), std::invalid_argument);
  const ConvShape ok = shape3x3(2, 4, 12, 12, 4, 1, 1);
  cpu::set_winograd_conv_disabled(true);
  EXPECT_FALSE(cpu::winograd_conv_forward(ok, x.data(), w.data(), nullptr, out.data()));
  EXPECT_FALSE(cpu::winograd_conv_backward_data(ok, y.data(), w.data(), out.data()));
  EXPECT_FALSE(cpu::winograd_conv_backward_weights(ok, x.data(), y.data(), out.data()));
  cpu::set_winograd_conv_disabled(false);
  EXPECT_EQ(cpu::winograd_conv_forward(ok, x.data(), w.data(), nullptr, out.data()),
            has_avx2_fma());
}

TEST(ConvWinograd, SameBitsOnOneAndTwoThreads) {
  if (!has_avx2_fma()) GTEST_SKIP() << "needs AVX2 and FMA";
  // 7 images: blocks split unevenly over two threads.
  const ConvShape s = shape3x3(7, 16, 28, 28, 16, 1, 1);
  const auto x = lcg_values(s.N * s.C * s.H * s.W, 5), w = lcg_values(s.O * s.C * 9, 6),
             b = lcg_values(s.O, 7), gy = lcg_values(s.N * s.O * s.Ho * s.Wo, 8);
  const int threads = num_threads();
  for (int64_t m : {2, 4}) {
    set_num_threads(1);
    const Passes one = run_winograd(s, x, w, b, gy, m);
    set_num_threads(2);
    const Passes two = run_winograd(s, x, w, b, gy, m);
    set_num_threads(threads);
    EXPECT_EQ(one.y, two.y) << m << "x" << m << " tiles: forward";
    EXPECT_EQ(one.dx, two.dx) << m << "x" << m << " tiles: input gradient";
    EXPECT_EQ(one.dw, two.dw) << m << "x" << m << " tiles: weight gradient";
  }
}
