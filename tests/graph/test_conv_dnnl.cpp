// The f32 conv paths (Winograd, direct stride-1 and stride-2 kernels, oneDNN, im2col) against the
// im2col kernels in f64 on odd shapes: stride 2, padding, non-square kernels and images, batches
// that split unevenly over the threads; each case checks which path ran, then turns the faster
// paths off one by one and checks the slower ones on the same case.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "backends/cpu/conv_direct.h"
#include "backends/cpu/conv_dnnl.h"
#include "backends/cpu/conv_winograd.h"
#include "graph/prims/elementwise.h"
#include "hetrain/base/cpu_features.h"
#include "hetrain/base/thread_pool.h"
#include "hetrain/graph/autodiff.h"
#include "hetrain/graph/ops.h"
#include "hetrain/graph/primitive.h"
#include "hetrain/runtime/eval.h"
#include "hetrain/runtime/fusion.h"
#include "testing.h"

using namespace hetrain;
using hetrain::testing::expect_close;

namespace {

Tensor seq(const Shape& shape, int64_t a, Dtype dt) {
  std::vector<double> v(static_cast<size_t>(numel(shape)));
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = static_cast<double>((static_cast<int64_t>(i) * 37 + a) % 101) / 50.0 - 1.0;
  return cast(from_vector(v, shape), dt);
}

/// A ResNet downsampling block's two convolutions of x: a 3x3 and a 1x1 shortcut, stride 2,
/// which the fusion pass runs as one node.
std::pair<Tensor, Tensor> block_convs(const Tensor& x, const Tensor& w1, const Tensor& w2) {
  return {conv2d(x, w1, {}, {2, 2}, {1, 1}), conv2d(x, w2, {}, {2, 2}, {0, 0})};
}

struct Case {
  Shape x, w;
  std::vector<int64_t> s, p;
  bool bias;
  // The path expected to run; direct_forward: the direct kernels forward, oneDNN's gradients.
  enum Path { im2col, dnnl, direct_forward, direct, winograd } path;
};

/// y, then the gradients of sum(y * r) for x, w and b, as f64 vectors.
std::vector<std::vector<double>> conv_and_grads(const Case& c, Dtype dt) {
  Tensor x = seq(c.x, 1, dt), w = seq(c.w, 2, dt), b = seq({c.w[0]}, 3, dt);
  Tensor y = conv2d(x, w, c.bias ? b : Tensor(), c.s, c.p);
  Tensor r = seq(y.shape(), 4, dt);
  auto f = [&](const std::vector<Tensor>& in) {
    return sum(conv2d(in[0], in[1], c.bias ? in[2] : Tensor(), c.s, c.p) * r);
  };
  auto [val, g] = value_and_grad(f, {x, w, b});
  return {y.to_vector<double>(), g[0].to_vector<double>(), g[1].to_vector<double>(),
          g[2].to_vector<double>()};
}

void expect_matches(const std::vector<std::vector<double>>& got,
                    const std::vector<std::vector<double>>& want, const std::string& what) {
  const char* names[] = {"y", "dx", "dw", "db"};
  for (size_t k = 0; k < want.size(); ++k) {
    double scale = 1;
    for (double v : want[k]) scale = std::max(scale, std::abs(v));
    expect_close(got[k], want[k], 2e-5 * scale, 1e-5, what + " " + names[k]);
  }
}

const Case kCases[] = {
    {{2, 8, 10, 6}, {16, 8, 3, 2}, {1, 2}, {1, 0}, true, Case::dnnl},        // non-square kernel
    {{5, 12, 11, 13}, {9, 12, 5, 3}, {2, 1}, {2, 1}, false, Case::dnnl},     // odd everything
    {{3, 16, 9, 8}, {32, 16, 3, 3}, {2, 2}, {1, 1}, false, Case::dnnl},      // stride 2 both ways
    {{1, 16, 7, 7}, {16, 16, 3, 3}, {1, 1}, {1, 1}, false, Case::winograd},  // one image
    {{3, 5, 9, 7}, {6, 5, 3, 3}, {2, 2}, {1, 1}, true, Case::im2col},        // < 8 channels
    {{4, 16, 5, 5}, {8, 16, 1, 1}, {1, 1}, {0, 0}, true, Case::im2col},      // 1x1
    {{3, 16, 9, 8}, {32, 16, 1, 1}, {2, 2}, {0, 0}, false, Case::im2col},    // 1x1 stride 2 (a
                                                                             // shortcut)
    {{2, 1, 8, 8}, {16, 1, 3, 3}, {1, 1}, {1, 1}, false, Case::im2col},      // the 1-channel stem,
                                                                             // narrow
    // Direct: 4 output channels per tile and 24 grid positions per tile, so odd channel counts
    // (remainder rows), images whose grid is not a whole number of tiles, groups of images in
    // the weight gradient that do not divide the batch, non-square kernels and partial padding.
    // Winograd takes 3x3 stride 1 with at least 8 channels each side: the direct kernels run
    // here when it is off.
    {{3, 16, 14, 14}, {32, 16, 3, 3}, {1, 1}, {1, 1}, true, Case::winograd},
    {{5, 7, 13, 17}, {11, 7, 3, 3}, {1, 1}, {1, 1}, false, Case::direct},
    {{2, 1, 28, 28}, {16, 1, 3, 3}, {1, 1}, {1, 1}, true, Case::direct},  // the stem at 28x28
    {{3, 9, 12, 15}, {6, 9, 5, 3}, {1, 1}, {2, 0}, true, Case::direct},
    {{4, 8, 12, 13}, {5, 8, 2, 4}, {1, 1}, {1, 3}, false, Case::direct},
    // Stride 2 on the phase planes: odd and even padded sizes, padding 0, 1 and 2 (which phase
    // takes x's even columns), a kernel with two column phases of different tap counts.
    {{3, 16, 28, 26}, {32, 16, 3, 3}, {2, 2}, {1, 1}, false, Case::direct},
    {{2, 5, 25, 27}, {7, 5, 3, 3}, {2, 2}, {1, 1}, true, Case::direct},
    {{2, 8, 26, 25}, {6, 8, 3, 3}, {2, 2}, {0, 0}, false, Case::direct},
    {{2, 6, 24, 27}, {5, 6, 2, 4}, {2, 2}, {1, 2}, true, Case::direct},
    {{3, 16, 28, 25}, {32, 16, 1, 1}, {2, 2}, {0, 0}, false, Case::direct},  // a shortcut
    {{2, 3, 27, 29}, {4, 3, 5, 5}, {2, 2}, {2, 1}, true, Case::direct},  // 5x5: two rows of reach
    // Stride 2 to 7 or 8 wide outputs: the direct forward, oneDNN's gradients.
    {{3, 32, 14, 14}, {64, 32, 3, 3}, {2, 2}, {1, 1}, false, Case::direct_forward},
    {{2, 16, 13, 15}, {13, 16, 3, 3}, {2, 2}, {1, 1}, true, Case::direct_forward},
    {{2, 8, 9, 9}, {8, 8, 3, 3}, {1, 1}, {1, 1}, false, Case::winograd},  // 9 wide: a 9-float row
    // 20 wide or more: 4x4 output tiles, the last ones partial (23 = 5 * 4 + 3; the input
    // gradient of the second is 26 wide, padded by 2).
    {{2, 8, 22, 23}, {8, 8, 3, 3}, {1, 1}, {1, 1}, false, Case::winograd},
    {{2, 9, 21, 26}, {10, 9, 3, 3}, {1, 1}, {0, 0}, true, Case::winograd},
};

}  // namespace

TEST(ConvDnnl, MatchesIm2colAndF64) {
  for (const Case& c : kCases) {
    const std::string what = shape_str(c.x) + " * " + shape_str(c.w);
    auto want = conv_and_grads(c, Dtype::f64);
    const int64_t dnnl_runs = cpu::dnnl_conv_runs(), direct_runs = cpu::direct_conv_runs(),
                  winograd_runs = cpu::winograd_conv_runs();
    auto got = conv_and_grads(c, Dtype::f32);
    // Both AVX2 paths fall back to oneDNN on a CPU without AVX2 and FMA.
    const bool avx2 = cpu_features().avx2 && cpu_features().fma;
    const bool winograd = c.path == Case::winograd && avx2;
    const int direct = !avx2 ? 0 : c.path == Case::direct ? 3 : c.path == Case::direct_forward;
    const bool all_dnnl = c.path == Case::dnnl || (c.path >= Case::direct_forward && !avx2);
    const int dnnl = all_dnnl ? 3 : direct == 1 ? 2 : 0;
    EXPECT_EQ(cpu::winograd_conv_runs() - winograd_runs, winograd ? 3 : 0)
        << what << ": Winograd passes";
    EXPECT_EQ(cpu::direct_conv_runs() - direct_runs, direct) << what << ": direct passes";
    EXPECT_EQ(cpu::dnnl_conv_runs() - dnnl_runs, dnnl) << what << ": oneDNN passes";
    expect_matches(got, want, "default path " + what);
    cpu::set_winograd_conv_disabled(true);
    if (c.path == Case::winograd) {
      const int64_t before = cpu::direct_conv_runs();
      expect_matches(conv_and_grads(c, Dtype::f32), want, "direct " + what);
      EXPECT_EQ(cpu::direct_conv_runs() - before, avx2 && c.x[2] >= 12 ? 3 : 0) << what;
    }
    cpu::set_direct_conv_disabled(true);
    expect_matches(conv_and_grads(c, Dtype::f32), want, "oneDNN or im2col " + what);
    cpu::set_dnnl_conv_disabled(true);
    expect_matches(conv_and_grads(c, Dtype::f32), want, "im2col " + what);
    cpu::set_dnnl_conv_disabled(false);
    cpu::set_direct_conv_disabled(false);
    cpu::set_winograd_conv_disabled(false);
  }
}

// Where the convolution path says oneDNN (as 'hetrain bench' finds on AVX-512 CPUs), oneDNN
// takes every pass it has a kernel for before Winograd and the direct kernels, and the
// residual block's fused nodes (two convolutions from one input, an input gradient with an
// addend and a ReLU mask) still give the gradients taken one by one.
TEST(ConvDnnl, OneDnnFirstWhereTheConvPathSaysSo) {
  for (const Case& c : kCases) {
    const cpu::PathOverride order(cpu::conv_choice(), static_cast<int>(cpu::ConvPath::onednn));
    const std::string what = "oneDNN first " + shape_str(c.x) + " * " + shape_str(c.w);
    // The passes oneDNN has a kernel for on this CPU: those it runs with the own kernels off.
    cpu::set_winograd_conv_disabled(true);
    cpu::set_direct_conv_disabled(true);
    int64_t before = cpu::dnnl_conv_runs();
    conv_and_grads(c, Dtype::f32);
    const int64_t takes = cpu::dnnl_conv_runs() - before;
    cpu::set_direct_conv_disabled(false);
    cpu::set_winograd_conv_disabled(false);
    if (c.path == Case::dnnl || c.path == Case::winograd) {
      EXPECT_EQ(takes, 3) << what;
    }
    before = cpu::dnnl_conv_runs();
    const int64_t own_runs = cpu::direct_conv_runs() + cpu::winograd_conv_runs();
    expect_matches(conv_and_grads(c, Dtype::f32), conv_and_grads(c, Dtype::f64), what);
    EXPECT_EQ(cpu::dnnl_conv_runs() - before, takes) << what;
    const int64_t own = cpu::direct_conv_runs() + cpu::winograd_conv_runs() - own_runs;
    EXPECT_LE(own, 3 - takes) << what << ": own kernels only where oneDNN declines";
  }
  // A downsampling block after batch norm with a residual input r: y = relu(bn(z) + r) feeds
  // a 3x3 and a 1x1 stride-2 convolution; dr is their summed input gradient, masked by y > 0.
  const Dtype dt = Dtype::f32;
  const Shape xs{3, 16, 28, 26};
  const int64_t C = xs[1], O = 32;
  Tensor z = seq(xs, 1, dt), r = seq(xs, 2, dt);
  Tensor gamma = seq({C}, 3, dt) + 1.5, beta = seq({C}, 4, dt);
  Tensor w1 = seq({O, C, 3, 3}, 5, dt), w2 = seq({O, C, 1, 1}, 6, dt);
  auto [p0, q0] = block_convs(z, w1, w2);
  Tensor r1 = seq(p0.shape(), 7, dt), r2 = seq(q0.shape(), 8, dt);
  auto loss = [&](const std::vector<Tensor>& in) {
    Tensor h = batch_norm2d(in[0], gamma, beta, 1e-5, true, in[1])[0];
    auto [pp, qq] = block_convs(h, in[2], in[3]);
    return sum(pp * r1) + sum(qq * r2);
  };
  std::vector<Tensor> want;
  {
    const cpu::PathOverride own(cpu::conv_choice(), static_cast<int>(cpu::ConvPath::own));
    runtime::set_fusion_enabled(false);
    want = value_and_grad(loss, {z, r, w1, w2}).second;
    eval(want);
    runtime::set_fusion_enabled(true);
  }
  const cpu::PathOverride order(cpu::conv_choice(), static_cast<int>(cpu::ConvPath::onednn));
  const int64_t before = cpu::dnnl_conv_runs();
  std::vector<Tensor> got = value_and_grad(loss, {z, r, w1, w2}).second;
  runtime::fuse(got);
  eval(got);
  EXPECT_GE(cpu::dnnl_conv_runs() - before, 2) << "the 3x3 convolution's gradient passes";
  const char* names[] = {"dz", "dr", "dw1", "dw2"};
  for (size_t k = 0; k < want.size(); ++k) {
    const std::vector<double> w = want[k].to_vector<double>();
    double scale = 1;
    for (double v : w) scale = std::max(scale, std::abs(v));
    expect_close(got[k].to_vector<double>(), w, 2e-5 * scale, 1e-5,
                 std::string("block ") + names[k]);
  }
}

TEST(ConvDnnl, UnevenChunksForAnyThreadCount) {
  const int threads = num_threads();
  for (int t : {1, 3, 4}) {
    set_num_threads(t);
    for (const Case& c : {kCases[0], kCases[1], kCases[2], kCases[8], kCases[9], kCases[13]}) {
      const std::string what = std::to_string(t) + " threads " + shape_str(c.x);
      expect_matches(conv_and_grads(c, Dtype::f32), conv_and_grads(c, Dtype::f64), what);
    }
  }
  set_num_threads(threads);
}

TEST(ConvDnnl, InputGradientTakesTheOtherBranchAsItWrites) {
  // x feeds a convolution and a second branch (x * r2): the fusion pass sums the two gradients in
  // the convolution's input-gradient pass (its addend form), with the same bits as convT + r2 by a
  // separate add, on every path and in f64; the summed tensor is that pass's output.
  struct Path {
    const char* name;
    bool winograd, direct, dnnl;
  };
  const Path paths[] = {{"default", true, true, true},
                        {"direct", false, true, true},
                        {"oneDNN", false, false, true},
                        {"im2col", false, false, false}};
  for (const Case& c : kCases) {
    for (Dtype dt : {Dtype::f32, Dtype::f64}) {
      for (const Path& p : paths) {
        cpu::set_winograd_conv_disabled(!p.winograd);
        cpu::set_direct_conv_disabled(!p.direct);
        cpu::set_dnnl_conv_disabled(!p.dnnl);
        const std::string what = std::string(p.name) + " " + std::string(dtype_name(dt)) + " " +
                                 shape_str(c.x) + " * " + shape_str(c.w);
        Tensor x = seq(c.x, 1, dt), w = seq(c.w, 2, dt);
        Tensor r1 = seq(conv2d(x, w, {}, c.s, c.p).shape(), 4, dt), r2 = seq(c.x, 5, dt);
        Tensor both = grad({sum(conv2d(x, w, {}, c.s, c.p) * r1) + sum(x * r2)}, {x})[0];
        runtime::fuse({both});
        Tensor conv_only = grad({sum(conv2d(x, w, {}, c.s, c.p) * r1)}, {x})[0];
        Tensor separate = add(r2, conv_only);
        ASSERT_NE(both.node()->prim, nullptr) << what;
        EXPECT_STREQ(both.node()->prim->name(), "conv2d_backward_input") << what;
        EXPECT_NE(both.node()->prim->attrs().find("addend"), std::string::npos) << what;
        EXPECT_EQ(both.to_vector<double>(), separate.to_vector<double>()) << what;
      }
    }
  }
  cpu::set_dnnl_conv_disabled(false);
  cpu::set_direct_conv_disabled(false);
  cpu::set_winograd_conv_disabled(false);
}

TEST(ConvDnnl, ShortcutAndSiblingInputGradientsInOnePass) {
  // x feeds a 3x3 stride-2 convolution and a 1x1 stride-2 one (a ResNet downsampling block) and
  // a third branch: the fusion pass sums the two input gradients in one node, with the
  // third as its addend. Against the three gradients taken one by one in f64 and added, on the
  // direct kernel (which takes both in one pass), on the fallbacks (the 7-wide case, and every
  // path turned off in turn) and in f64.
  struct Block {
    Shape x;
    int64_t O;
    bool fused;  // the direct kernel takes both
  };
  const Block blocks[] = {{{3, 16, 28, 26}, 32, true}, {{2, 16, 14, 14}, 24, false}};
  const bool avx2 = cpu_features().avx2 && cpu_features().fma;
  for (const Block& b : blocks) {
    auto grads = [&](Dtype dt, bool together) {
      Tensor x = seq(b.x, 1, dt), w1 = seq({b.O, b.x[1], 3, 3}, 2, dt);
      Tensor w2 = seq({b.O, b.x[1], 1, 1}, 3, dt);
      auto y1 = [&] { return conv2d(x, w1, {}, {2, 2}, {1, 1}); };
      auto y2 = [&] { return conv2d(x, w2, {}, {2, 2}, {0, 0}); };
      Tensor r1 = seq(y1().shape(), 4, dt), r2 = seq(y2().shape(), 5, dt), r3 = seq(b.x, 6, dt);
      if (!together)
        return std::vector<Tensor>{grad({sum(y1() * r1)}, {x})[0] + grad({sum(y2() * r2)}, {x})[0] +
                                   r3};
      std::vector<Tensor> g = grad({sum(y1() * r1) + sum(y2() * r2) + sum(x * r3)}, {x, w1, w2});
      return g;
    };
    const std::string what = shape_str(b.x);
    const std::vector<double> want = grads(Dtype::f64, false)[0].to_vector<double>();
    for (Dtype dt : {Dtype::f32, Dtype::f64}) {
      for (int off = 0; off < 3; ++off) {  // 1: direct off, 2: oneDNN off too
        cpu::set_direct_conv_disabled(off >= 1);
        cpu::set_dnnl_conv_disabled(off >= 2);
        const std::string at =
            what + " " + std::string(dtype_name(dt)) + " paths off " + std::to_string(off);
        std::vector<Tensor> g = grads(dt, true);
        runtime::fuse({g[0]});
        const Node* n = g[0].node();
        ASSERT_NE(n->prim, nullptr) << at;
        EXPECT_STREQ(n->prim->name(), "conv2d_backward_input") << at;
        EXPECT_NE(n->prim->attrs().find(" + kernel=(1, 1)"), std::string::npos) << at;
        EXPECT_NE(n->prim->attrs().find("addend"), std::string::npos) << at;
        EXPECT_EQ(n->inputs.size(), 5u) << at;
        const int64_t before = cpu::direct_conv_runs();
        g[0].eval();
        const bool fused = b.fused && avx2 && off == 0 && dt == Dtype::f32;
        EXPECT_EQ(cpu::direct_conv_runs() - before, fused ? 2 : 0) << at;
        double scale = 1;
        for (double v : want) scale = std::max(scale, std::abs(v));
        expect_close(g[0].to_vector<double>(), want, 2e-5 * scale, 1e-5, at + " dx");
      }
    }
  }
  cpu::set_dnnl_conv_disabled(false);
  cpu::set_direct_conv_disabled(false);
}

TEST(ConvDnnl, SummedInputGradientsDifferentiateLikeEachAlone) {
  // The paired input-gradient node's own vjp (second derivatives): d/dw1 and d/dw2 of sum(dx * q),
  // dx the summed input gradient, against the same through each convolution's input gradient alone.
  const Dtype dt = Dtype::f64;
  Tensor x = seq({2, 8, 16, 13}, 1, dt), w1 = seq({6, 8, 3, 3}, 2, dt);
  Tensor w2 = seq({6, 8, 1, 1}, 3, dt);
  auto y1 = [&] { return conv2d(x, w1, {}, {2, 2}, {1, 1}); };
  auto y2 = [&] { return conv2d(x, w2, {}, {2, 2}, {0, 0}); };
  Tensor r1 = seq(y1().shape(), 4, dt), r2 = seq(y2().shape(), 5, dt), q = seq(x.shape(), 6, dt);
  Tensor dx = grad({sum(y1() * r1) + sum(y2() * r2)}, {x})[0];
  runtime::fuse({dx});
  ASSERT_NE(dx.node()->prim->attrs().find(" + "), std::string::npos);
  std::vector<Tensor> got = grad({sum(dx * q)}, {w1, w2, r1, r2});
  Tensor dx1 = grad({sum(y1() * r1)}, {x})[0], dx2 = grad({sum(y2() * r2)}, {x})[0];
  std::vector<Tensor> want = {grad({sum(dx1 * q)}, {w1})[0], grad({sum(dx2 * q)}, {w2})[0],
                              grad({sum(dx1 * q)}, {r1})[0], grad({sum(dx2 * q)}, {r2})[0]};
  const char* names[] = {"dw1", "dw2", "dr1", "dr2"};
  for (size_t i = 0; i < want.size(); ++i)
    expect_close(got[i].to_vector<double>(), want[i].to_vector<double>(), 1e-9, 1e-9, names[i]);
}

TEST(ConvDnnl, PairedConvolutionsInOnePass) {
  // A 3x3 stride-2 convolution and a 1x1 stride-2 one of the same x (a ResNet downsampling
  // block), which the fusion pass runs as one node, with their weight gradients as one node too
  // and their input gradients summed in the paired input-gradient node. The stride-2 direct kernels
  // split x once for both: at 13 wide, the forward and the weight gradients; at 7 wide, the forward
  // only (the gradients fall back to one convolution after the other). Outputs and gradients
  // against each convolution alone in f64, on the fused kernels, with the direct kernels off, with
  // oneDNN off too, and in f64.
  struct Block {
    Shape x;
    int64_t O;
    bool fused_weights;  // the direct kernel takes both weight gradients
  };
  const Block blocks[] = {{{3, 16, 28, 26}, 32, true}, {{2, 16, 14, 14}, 24, false}};
  const bool avx2 = cpu_features().avx2 && cpu_features().fma;
  for (const Block& b : blocks) {
    // y1, y2, then the gradients of sum(y1 * r1) + sum(y2 * r2) for x, w1 and w2.
    auto run = [&](Dtype dt, bool paired, const std::string& at) {
      Tensor x = seq(b.x, 1, dt), w1 = seq({b.O, b.x[1], 3, 3}, 2, dt);
      Tensor w2 = seq({b.O, b.x[1], 1, 1}, 3, dt);
      runtime::set_fusion_enabled(paired);
      auto [y1, y2] = block_convs(x, w1, w2);
      Tensor r1 = seq(y1.shape(), 4, dt), r2 = seq(y2.shape(), 5, dt);
      auto loss = [&](const std::vector<Tensor>& in) {
        auto [p, q] = block_convs(in[0], in[1], in[2]);
        return sum(p * r1) + sum(q * r2);
      };
      std::vector<Tensor> g = value_and_grad(loss, {x, w1, w2}).second;
      if (paired) {
        runtime::fuse({y1, y2, g[0], g[1], g[2]});
        // y2 views the pair node's second output; so does dw2 the weight-gradient pair's.
        EXPECT_STREQ(y2.node()->prim->name(), "reshape") << at;
        EXPECT_EQ(y2.node()->inputs[0].node(), y1.node()) << at;
        EXPECT_EQ(y2.node()->inputs[0].index(), 1) << at;
        EXPECT_STREQ(y1.node()->prim->name(), "conv2d") << at;
        EXPECT_NE(y1.node()->prim->attrs().find(" + kernel=(1, 1)"), std::string::npos) << at;
        EXPECT_EQ(y1.node()->inputs.size(), 3u) << at;
        EXPECT_NE(g[0].node()->prim->attrs().find(" + kernel=(1, 1)"), std::string::npos) << at;
        EXPECT_EQ(g[2].node()->inputs[0].node(), g[1].node()) << at;
        EXPECT_STREQ(g[1].node()->prim->name(), "conv2d_backward_weight") << at;
        EXPECT_EQ(g[1].node()->outs.size(), 2u) << at;
      }
      std::vector<std::vector<double>> v;
      for (const Tensor& t : {y1, y2, g[0], g[1], g[2]}) v.push_back(t.to_vector<double>());
      runtime::set_fusion_enabled(true);
      return v;
    };
    const std::string what = shape_str(b.x);
    const auto want = run(Dtype::f64, false, what + " f64 alone");
    for (Dtype dt : {Dtype::f32, Dtype::f64}) {
      for (int off = 0; off < 3; ++off) {  // 1: direct off, 2: oneDNN off too
        cpu::set_direct_conv_disabled(off >= 1);
        cpu::set_dnnl_conv_disabled(off >= 2);
        const std::string at =
            what + " " + std::string(dtype_name(dt)) + " paths off " + std::to_string(off);
        const bool direct = avx2 && off == 0 && dt == Dtype::f32;
        const std::vector<std::vector<double>> got = run(dt, true, at);
        // The forward and the weight gradients evaluated alone: the direct kernels' passes.
        Tensor x = seq(b.x, 1, dt), w1 = seq({b.O, b.x[1], 3, 3}, 2, dt);
        Tensor w2 = seq({b.O, b.x[1], 1, 1}, 3, dt);
        auto [p, q] = block_convs(x, w1, w2);
        int64_t before = cpu::direct_conv_runs();
        eval({p, q});
        EXPECT_EQ(cpu::direct_conv_runs() - before, direct ? 2 : 0) << at << " forward";
        Tensor rp = seq(p.shape(), 4, dt), rq = seq(q.shape(), 5, dt);
        auto [pp, qq] = block_convs(x, w1, w2);
        std::vector<Tensor> dw = grad({sum(pp * rp) + sum(qq * rq)}, {w1, w2});
        before = cpu::direct_conv_runs();
        eval(dw);
        EXPECT_EQ(cpu::direct_conv_runs() - before, direct && b.fused_weights ? 2 : 0)
            << at << " weight gradients";
        const char* names[] = {"y1", "y2", "dx", "dw1", "dw2"};
        for (size_t k = 0; k < want.size(); ++k) {
          double scale = 1;
          for (double v : want[k]) scale = std::max(scale, std::abs(v));
          expect_close(got[k], want[k], 2e-5 * scale, 1e-5, at + " " + names[k]);
        }
      }
    }
  }
  cpu::set_dnnl_conv_disabled(false);
  cpu::set_direct_conv_disabled(false);
}

TEST(ConvDnnl, PairedConvolutionsDifferentiateLikeEachAlone) {
  // The pair's weight-gradient node's own vjp (second derivatives for x and both output
  // gradients), and the pair with one output unused, against each convolution alone.
  const Dtype dt = Dtype::f64;
  Tensor x = seq({2, 8, 16, 13}, 1, dt), w1 = seq({6, 8, 3, 3}, 2, dt);
  Tensor w2 = seq({6, 8, 1, 1}, 3, dt);
  auto [y1, y2] = block_convs(x, w1, w2);
  ASSERT_EQ(runtime::fuse({y1, y2}), 1);
  ASSERT_EQ(y2.node()->inputs[0].node(), y1.node());
  Tensor r1 = seq(y1.shape(), 4, dt), r2 = seq(y2.shape(), 5, dt);
  Tensor q1 = seq(w1.shape(), 6, dt), q2 = seq(w2.shape(), 7, dt);
  std::vector<Tensor> dw = grad({sum(y1 * r1) + sum(y2 * r2)}, {w1, w2});
  ASSERT_EQ(dw[0].node(), dw[1].node());
  std::vector<Tensor> got = grad({sum(dw[0] * q1) + sum(dw[1] * q2)}, {x, r1, r2});
  auto alone1 = [&] { return conv2d(x, w1, {}, {2, 2}, {1, 1}); };
  auto alone2 = [&] { return conv2d(x, w2, {}, {2, 2}, {0, 0}); };
  Tensor dw1 = grad({sum(alone1() * r1)}, {w1})[0], dw2 = grad({sum(alone2() * r2)}, {w2})[0];
  std::vector<Tensor> want1 = grad({sum(dw1 * q1)}, {x, r1});
  std::vector<Tensor> want2 = grad({sum(dw2 * q2)}, {x, r2});
  expect_close(got[0].to_vector<double>(), (want1[0] + want2[0]).to_vector<double>(), 1e-9, 1e-9,
               "d/dx");
  expect_close(got[1].to_vector<double>(), want1[1].to_vector<double>(), 1e-9, 1e-9, "d/dr1");
  expect_close(got[2].to_vector<double>(), want2[1].to_vector<double>(), 1e-9, 1e-9, "d/dr2");
  // Only y1 used: dx and dw1 as the 3x3 alone's.
  std::vector<Tensor> one = grad({sum(y1 * r1)}, {x, w1});
  std::vector<Tensor> alone = grad({sum(alone1() * r1)}, {x, w1});
  expect_close(one[0].to_vector<double>(), alone[0].to_vector<double>(), 1e-12, 1e-12, "y1 dx");
  expect_close(one[1].to_vector<double>(), alone[1].to_vector<double>(), 1e-12, 1e-12, "y1 dw1");
}

TEST(ConvDnnl, PairedConvolutionsOtherwiseTwoNodes) {
  // Where no kernel takes both (stride 1 here, or a bias), the two convolutions stay two nodes.
  Tensor x = seq({2, 8, 10, 10}, 1, Dtype::f32), w1 = seq({4, 8, 3, 3}, 2, Dtype::f32);
  Tensor w2 = seq({4, 8, 1, 1}, 3, Dtype::f32), b = seq({4}, 4, Dtype::f32);
  Tensor y1 = conv2d(x, w1, {}, {1, 1}, {1, 1}), y2 = conv2d(x, w2, {}, {1, 1}, {0, 0});
  EXPECT_EQ(runtime::fuse({y1, y2}), 0);
  EXPECT_STREQ(y2.node()->prim->name(), "conv2d");
  Tensor z1 = conv2d(x, w1, b, {2, 2}, {1, 1}), z2 = conv2d(x, w2, {}, {2, 2}, {0, 0});
  EXPECT_EQ(runtime::fuse({z1, z2}), 0);
  EXPECT_STREQ(z2.node()->prim->name(), "conv2d");
  expect_close(y2.to_vector<double>(), conv2d(x, w2, {}, {1, 1}, {0, 0}).to_vector<double>(), 0, 0,
               "y2");
}

TEST(ConvDnnl, ReluMaskedInputGradientInOnePass) {
  // A residual block's output relu(bn(z) + r) feeding the next block's paired convolutions: the
  // gradient through that relu is the pairs' input gradient masked where the output is not > 0,
  // which the stride-2 direct kernel writes in its one pass (the fusion pass's mask rule) and the
  // other paths mask after. Against the unmasked input gradient masked here, in f64, for the fused
  // kernel, the fallback (7 wide: oneDNN and a masking pass; direct off) and f64.
  struct Block {
    Shape x;
    int64_t O;
    bool fused;
  };
  const Block blocks[] = {{{3, 16, 28, 26}, 32, true}, {{2, 16, 14, 14}, 24, false}};
  const bool avx2 = cpu_features().avx2 && cpu_features().fma;
  for (const Block& b : blocks) {
    const int64_t C = b.x[1];
    for (Dtype dt : {Dtype::f32, Dtype::f64}) {
      for (int off = 0; off < 2; ++off) {  // 1: direct off
        cpu::set_direct_conv_disabled(off == 1);
        const std::string at =
            shape_str(b.x) + " " + std::string(dtype_name(dt)) + (off ? " direct off" : "");
        Tensor z = seq(b.x, 1, dt), r = seq(b.x, 2, dt);
        Tensor gamma = seq({C}, 3, dt) + 1.5, beta = seq({C}, 4, dt);
        Tensor w1 = seq({b.O, C, 3, 3}, 5, dt), w2 = seq({b.O, C, 1, 1}, 6, dt);
        Tensor y = batch_norm2d(z, gamma, beta, 1e-5, true, r)[0];
        y.eval();
        Tensor yd = y.detach();
        auto [p, q] = block_convs(yd, w1, w2);
        Tensor r1 = seq(p.shape(), 7, dt), r2 = seq(q.shape(), 8, dt);
        // The unmasked gradient for y, masked here.
        std::vector<double> want = grad({sum(p * r1) + sum(q * r2)}, {yd})[0].to_vector<double>();
        const std::vector<double> yv = yd.to_vector<double>();
        int64_t zeros = 0;
        for (size_t i = 0; i < want.size(); ++i)
          if (!(yv[i] > 0)) want[i] = 0, ++zeros;
        ASSERT_GT(zeros, static_cast<int64_t>(want.size() / 10)) << at;  // the mask matters
        // Through the block: the residual's gradient is the masked one.
        auto loss = [&](const std::vector<Tensor>& in) {
          Tensor h = batch_norm2d(in[0], gamma, beta, 1e-5, true, in[1])[0];
          auto [pp, qq] = block_convs(h, w1, w2);
          return sum(pp * r1) + sum(qq * r2);
        };
        Tensor zl = z.detach(), rl = r.detach();
        zl.requires_grad_(true);
        rl.requires_grad_(true);
        Tensor dr = grad({loss({zl, rl})}, {rl})[0];
        runtime::fuse({dr});
        const Node* n = dr.node();
        ASSERT_NE(n->prim, nullptr) << at;
        EXPECT_STREQ(n->prim->name(), "conv2d_backward_input") << at;
        EXPECT_NE(n->prim->attrs().find("relu-mask"), std::string::npos) << at;
        const int64_t before = cpu::direct_conv_runs();
        dr.eval();
        const bool fused = b.fused && avx2 && off == 0 && dt == Dtype::f32;
        EXPECT_EQ(cpu::direct_conv_runs() - before, fused ? 2 : 0) << at;
        double scale = 1;
        for (double v : want) scale = std::max(scale, std::abs(v));
        expect_close(dr.to_vector<double>(), want, 2e-5 * scale, 1e-5, at + " dr");
      }
    }
  }
  cpu::set_direct_conv_disabled(false);
}

TEST(ConvDnnl, ReluMaskedInputGradientDifferentiatesLikeTheMaskAfter) {
  // The masked node's own vjp (second derivatives for both weights and both output gradients)
  // against relu_grad applied after the unmasked input gradient.
  const Dtype dt = Dtype::f64;
  Tensor m = seq({2, 8, 16, 13}, 1, dt), w1 = seq({6, 8, 3, 3}, 2, dt);
  Tensor w2 = seq({6, 8, 1, 1}, 3, dt), q = seq(m.shape(), 6, dt);
  auto convs = block_convs(m, w1, w2);
  Tensor p1 = convs.first, p2 = convs.second;  // clang 14 cannot capture a structured binding
  Tensor r1 = seq(p1.shape(), 4, dt), r2 = seq(p2.shape(), 5, dt);
  auto dx = [&] { return grad({sum(p1 * r1) + sum(p2 * r2)}, {m})[0]; };
  Tensor got_dx = relu_grad(m, dx());
  runtime::fuse({got_dx});
  ASSERT_STREQ(got_dx.node()->prim->name(), "conv2d_backward_input");
  EXPECT_NE(got_dx.node()->prim->attrs().find("relu-mask"), std::string::npos)
      << got_dx.node()->prim->attrs();
  // The masked node takes neither a second mask nor an addend (which would join after it).
  Tensor twice = relu_grad(q, relu_grad(m, dx()));
  runtime::fuse({twice});
  EXPECT_STREQ(twice.node()->prim->name(), "relu_backward");
  Tensor plus = relu_grad(m, dx()) + q;
  runtime::fuse({plus});
  EXPECT_STREQ(plus.node()->prim->name(), "add");
  EXPECT_NE(plus.node()->inputs[0].node()->prim->attrs().find("relu-mask"), std::string::npos);
  // The reference: the mask as a separate node, and its derivatives, all run unfused.
  runtime::set_fusion_enabled(false);
  Tensor want_dx = relu_grad(m, dx());
  std::vector<std::vector<double>> want = {want_dx.to_vector<double>()};
  for (const Tensor& t : grad({sum(want_dx * q)}, {w1, w2, r1, r2}))
    want.push_back(t.to_vector<double>());
  runtime::set_fusion_enabled(true);
  expect_close(got_dx.to_vector<double>(), want[0], 1e-12, 1e-12, "dx");
  std::vector<Tensor> got = grad({sum(got_dx * q)}, {w1, w2, r1, r2});
  const char* names[] = {"dw1", "dw2", "dr1", "dr2"};
  for (size_t i = 0; i < got.size(); ++i)
    expect_close(got[i].to_vector<double>(), want[i + 1], 1e-9, 1e-9, names[i]);
}

namespace hetrain {
namespace {

TEST(ConvDnnl, Bf16ConvolutionsRunOnTheBf16Unit) {
  // bf16 convolutions (forward, input and weight gradients) on oneDNN's bf16 kernels, where the
  // CPU computes in bf16: bf16 in and out, f32 accumulation. Against f64 on the same
  // bf16-rounded values: each output is off by at most its own bf16 rounding (2^-8 relative)
  // plus the f32 sums' error, for every shape the oneDNN cases cover.
  if (!cpu::dnnl_bf16_conv())
    GTEST_SKIP() << "this CPU has no bf16 unit (AVX512-BF16 or AMX); bf16 converts to f32 here";
  // In bf16 oneDNN takes every shape (1x1 and narrow ones too, which f32 leaves to Hetrain's
  // own kernels): converting to f32 and back would cost more than its kernel saves. 1x1 kernels
  // without padding run as batched matmuls on the NCHW arrays instead: besides kCases' stride-2
  // shortcut, stride 1 and unequal strides (rows and columns the stride skips get zero
  // gradients).
  std::vector<Case> cases(std::begin(kCases), std::end(kCases));
  cases.push_back({{4, 16, 5, 5}, {8, 16, 1, 1}, {1, 1}, {0, 0}, false, Case::im2col});
  cases.push_back({{2, 8, 7, 6}, {12, 8, 1, 1}, {2, 3}, {0, 0}, false, Case::im2col});
  for (const Case& c : cases) {
    if (c.bias) continue;
    const std::string what = shape_str(c.x) + " * " + shape_str(c.w);
    auto run = [&](Dtype dt) {
      // bf16 inputs, then (for f64) the same values widened: the reference sees what bf16 saw.
      Tensor x = cast(seq(c.x, 1, Dtype::bf16), dt), w = cast(seq(c.w, 2, Dtype::bf16), dt);
      Tensor y = conv2d(x, w, {}, c.s, c.p);
      Tensor r = cast(seq(y.shape(), 4, Dtype::bf16), dt);
      std::vector<Tensor> g = grad({sum(y * r)}, {x, w});
      std::vector<std::vector<double>> v;
      for (const Tensor& t : {y, g[0], g[1]}) v.push_back(t.to_vector<double>());
      return v;
    };
    const int64_t before = cpu::dnnl_conv_runs();
    const auto got = run(Dtype::bf16);
    EXPECT_EQ(cpu::dnnl_conv_runs() - before, 3) << what;
    const auto want = run(Dtype::f64);
    const char* names[] = {"y", "dx", "dw"};
    for (size_t k = 0; k < want.size(); ++k) {
      double scale = 0;
      for (double v : want[k]) scale = std::max(scale, std::abs(v));
      for (size_t i = 0; i < want[k].size(); ++i)
        ASSERT_NEAR(got[k][i], want[k][i], std::abs(want[k][i]) / 128 + 1e-3 * scale)
            << what << " " << names[k] << " at " << i;
    }
  }
}

}  // namespace
}  // namespace hetrain
