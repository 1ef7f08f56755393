// The oneDNN conv path (f32) against the im2col kernels in f64 on odd shapes: stride 2,
// padding, non-square kernels and images, batches that split unevenly over the threads; and
// the shapes left to im2col (1x1, fewer than 8 channels) through the same checks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "backends/cpu/conv_dnnl.h"
#include "hetrain/base/thread_pool.h"
#include "hetrain/graph/autodiff.h"
#include "hetrain/graph/ops.h"
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

struct Case {
  Shape x, w;
  std::vector<int64_t> s, p;
  bool bias;
  bool dnnl;  // expected to run through oneDNN
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
    {{2, 8, 10, 6}, {16, 8, 3, 2}, {1, 2}, {1, 0}, true, true},     // non-square kernel
    {{5, 12, 11, 13}, {9, 12, 5, 3}, {2, 1}, {2, 1}, false, true},  // odd everything, stride 2
    {{3, 16, 9, 8}, {32, 16, 3, 3}, {2, 2}, {1, 1}, false, true},   // stride 2 both ways
    {{1, 16, 7, 7}, {16, 16, 3, 3}, {1, 1}, {1, 1}, false, true},   // one image: one chunk
    {{3, 5, 9, 7}, {6, 5, 3, 3}, {2, 2}, {1, 1}, true, false},      // < 8 channels
    {{4, 16, 5, 5}, {8, 16, 1, 1}, {1, 1}, {0, 0}, true, false},    // 1x1
    {{3, 16, 9, 8}, {32, 16, 1, 1}, {2, 2}, {0, 0}, false, false},  // 1x1 stride 2 (a shortcut)
    {{2, 1, 8, 8}, {16, 1, 3, 3}, {1, 1}, {1, 1}, false, false},    // the 1-channel stem
};

}  // namespace

TEST(ConvDnnl, MatchesIm2colAndF64) {
  for (const Case& c : kCases) {
    const std::string what = shape_str(c.x) + " * " + shape_str(c.w);
    auto want = conv_and_grads(c, Dtype::f64);
    const int64_t runs = cpu::dnnl_conv_runs();
    auto dnnl = conv_and_grads(c, Dtype::f32);
    if (c.dnnl)
      EXPECT_EQ(cpu::dnnl_conv_runs() - runs, 3) << what << ": oneDNN did not run all passes";
    else
      EXPECT_EQ(cpu::dnnl_conv_runs() - runs, 0) << what << ": expected the im2col path";
    expect_matches(dnnl, want, "oneDNN " + what);
    cpu::set_dnnl_conv_disabled(true);
    auto im2col = conv_and_grads(c, Dtype::f32);
    cpu::set_dnnl_conv_disabled(false);
    expect_matches(im2col, want, "im2col " + what);
  }
}

TEST(ConvDnnl, UnevenChunksForAnyThreadCount) {
  const int threads = num_threads();
  for (int t : {1, 3, 4}) {
    set_num_threads(t);
    for (const Case& c : {kCases[0], kCases[1], kCases[2]}) {
      const std::string what = std::to_string(t) + " threads " + shape_str(c.x);
      expect_matches(conv_and_grads(c, Dtype::f32), conv_and_grads(c, Dtype::f64), what);
    }
  }
  set_num_threads(threads);
}
