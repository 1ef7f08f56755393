// Neural-network ops: softmax, log_softmax, layer_norm, rms_norm, embedding, index_select,
// gather, cross_entropy, dropout. Forward values come from PyTorch 1.13 (/usr/bin/python3);
// gradients are checked against finite differences in f64.
//
// Reference snippet (values pasted below as *_ref):
//   import torch, torch.nn.functional as F
//   x = torch.tensor(kX, dtype=torch.float64).reshape(2, 3, 4)
//   w = torch.tensor([1.5, -0.5, 2.0, 0.25], dtype=torch.float64)
//   b = torch.tensor([0.1, 0.2, -0.3, 0.4], dtype=torch.float64)
//   F.softmax(x, -1); F.softmax(x, 1); F.log_softmax(x, -1); F.log_softmax(x, 0)
//   F.layer_norm(x, (4,), w, b, 1e-5); F.layer_norm(x, (3, 4), None, None, 1e-5)
//   x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6) * w          # rms_norm
//   E = torch.tensor(kE, dtype=torch.float64).reshape(5, 3)
//   F.embedding(torch.tensor([[4, 0, 2], [2, 2, 1]]), E)
//   torch.index_select(x, 1, torch.tensor([2, 0, 2]))
//   torch.gather(x, 2, torch.tensor([[[3, 0], [1, 1]], [[0, 2], [2, 3]]]))
//   torch.gather(x, 0, torch.tensor([[[1, 0, 1, 1]], [[0, 0, 1, 0]]]))
//   L = x.reshape(6, 4); t = torch.tensor([3, 0, -100, 1, 2, 3])
//   F.cross_entropy(L, t, reduction=r) for r in ('none', 'sum', 'mean')
//   F.cross_entropy(x.reshape(2, 4, 3), torch.tensor([[0, 3, 1], [2, -100, 3]]), reduction=r)
//   F.cross_entropy(L, torch.tensor([3, 7, 7, 1, 2, 3]), ignore_index=7)
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "hetrain/base/error.h"
#include "hetrain/base/thread_pool.h"
#include "hetrain/graph/autodiff.h"
#include "hetrain/graph/ops.h"
#include "testing.h"

using namespace hetrain;
using hetrain::testing::check_grad_fd;
using hetrain::testing::expect_close;

namespace {

const std::vector<double> kX = {0.5,  -1.25, 2.0,  0.0,  3.5,  -0.75, 1.5,  -2.0,
                                0.25, 1.0,   -0.5, 2.75, -1.5, 0.75,  -3.0, 1.25,
                                2.25, -0.25, 0.0,  1.75, -2.5, 0.5,   3.0,  -1.0};
const std::vector<double> kE = {0.1,  0.2,  0.3,  1.0,  -1.0, 0.5, 2.0, 0.0,
                                -2.0, -0.5, 0.25, 0.75, 3.0,  1.0, 2.0};

Tensor X(Dtype dt = Dtype::f64) { return cast(from_vector(kX, {2, 3, 4}), dt); }
Tensor W4() { return from_vector<double>({1.5, -0.5, 2.0, 0.25}, {4}); }
Tensor B4() { return from_vector<double>({0.1, 0.2, -0.3, 0.4}, {4}); }
Tensor ids(const std::vector<int64_t>& v, const Shape& s) { return from_vector(v, s); }

/// Runs f (building and evaluating) and checks the error message contains want.
template <class F>
void expect_error(F&& f, const std::string& want) {
  try {
    Tensor t = f();
    t.eval();
    FAIL() << "expected an error containing: " << want;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(want), std::string::npos)
        << "message: " << e.what() << "\nwanted: " << want;
  }
}

/// Reference softmax from elementwise ops and reductions (independent of the fused kernel).
Tensor softmax_ref(const Tensor& x, int64_t axis) {
  Tensor e = exp(x - max(x, {axis}, true));
  return e / sum(e, {axis}, true);
}

}  // namespace

// ---- softmax / log_softmax ----------------------------------------------------------------

TEST(NN, SoftmaxMatchesTorch) {
  expect_close(softmax(X(), -1),
               {0.15969355,  0.027750578,  0.71569684,   0.096859034, 0.86678676,  0.012364049,
                0.11730683,  0.0035423594, 0.063404061,  0.1342264,   0.029949958, 0.77241958,
                0.037945627, 0.36001808,   0.0084668138, 0.59356947,  0.55740898,  0.045754915,
                0.058750474, 0.33808563,   0.0037001521, 0.074319542, 0.90539737,  0.016582931},
               1e-8, 1e-7);
  expect_close(softmax(X(), 1),
               {0.045736579, 0.082396369,  0.59220107,   0.059601976, 0.91864374,  0.13584865,
                0.35918811,  0.0080662503, 0.035619683,  0.78175498,  0.048610824, 0.93233177,
                0.022784772, 0.46583557,   0.0023556331, 0.36309232,  0.96883318,  0.17137133,
                0.047314155, 0.59863803,   0.0083820494, 0.3627931,   0.95033021,  0.038269649},
               1e-8, 1e-7);
  expect_close(log_softmax(X(), -1),
               {-1.8344986, -3.5844986, -0.33449861, -2.3344986,  -0.14296228,  -4.3929623,
                -2.1429623, -5.6429623, -2.7582274,  -2.0082274,  -3.5082274,   -0.25822737,
                -3.271601,  -1.021601,  -4.771601,   -0.52160101, -0.58445606,  -3.0844561,
                -2.8344561, -1.0844561, -5.5993813,  -2.5993813,  -0.099381344, -4.0993813},
               1e-7, 1e-7);
  expect_close(log_softmax(X(), 0),
               {-0.12692801, -2.126928,    -0.0067153485, -1.5019291,  -0.25192908,  -0.97407698,
                -0.20141328, -3.7732455,   -0.061967589,  -0.47407698, -3.5297504,   -0.023245464,
                -2.126928,   -0.12692801,  -5.0067153,    -0.25192908, -1.5019291,   -0.47407698,
                -1.7014133,  -0.023245464, -2.8119676,    -0.97407698, -0.029750418, -3.7732455},
               1e-7, 1e-7);
}

TEST(NN, SoftmaxIsStableAndMasks) {
  Tensor big = from_vector<float>({1000, 1001, 1002, -1000}, {4});
  Tensor small = from_vector<float>({0, 1, 2, -2000}, {4});
  expect_close(softmax(big), softmax(small).to_vector<double>(), 1e-7, 1e-6);
  expect_close(log_softmax(big), {-2.4076059, -1.4076059, -0.40760596, -2002.4076}, 1e-5, 1e-6);
  Tensor masked = from_vector<float>({1, -INFINITY, 2, -INFINITY}, {4});
  auto p = softmax(masked).to_vector<double>();
  EXPECT_EQ(p[1], 0.0);
  EXPECT_EQ(p[3], 0.0);
  EXPECT_NEAR(p[0] + p[2], 1.0, 1e-7);
}

TEST(NN, SoftmaxLongRowsColumnsAndStrides) {
  Generator gen(3);
  // Rows of 1000 (vectorised row path) and columns of 70 (two column blocks) in f32.
  Tensor a = randn({5, 1000}, Dtype::f32, gen) * 4.0;
  expect_close(softmax(a, 1), softmax_ref(a, 1).to_vector<double>(), 1e-8, 1e-5);
  expect_close(log_softmax(a, 1), log(softmax_ref(a, 1)).to_vector<double>(), 1e-5, 1e-5);
  Tensor c = randn({3, 33, 70}, Dtype::f32, gen);
  expect_close(softmax(c, 1), softmax_ref(c, 1).to_vector<double>(), 1e-8, 1e-5);
  expect_close(log_softmax(c, 1), log(softmax_ref(c, 1)).to_vector<double>(), 1e-5, 1e-5);
  // A transposed (non-contiguous) input.
  Tensor t = transpose(c, 1, 2);
  expect_close(softmax(t, -1), transpose(softmax(c, 1), 1, 2).to_vector<double>(), 1e-8, 1e-6);
}

TEST(NN, SoftmaxGradients) {
  for (int64_t axis : {0, 1, -1}) {
    check_grad_fd([axis](const std::vector<Tensor>& in) { return softmax(in[0], axis); }, {X()});
    check_grad_fd([axis](const std::vector<Tensor>& in) { return log_softmax(in[0], axis); },
                  {X()});
  }
}

TEST(NN, SoftmaxDtypes) {
  Tensor ref = softmax(X(), -1);
  for (Dtype dt : {Dtype::f32, Dtype::bf16, Dtype::f16}) {
    double tol = dt == Dtype::f32 ? 1e-6 : 1e-2;
    Tensor y = softmax(X(dt), -1);
    EXPECT_EQ(y.dtype(), dt);
    expect_close(y, ref.to_vector<double>(), tol, tol, std::string(dtype_name(dt)));
    expect_close(log_softmax(X(dt), 1), log_softmax(X(), 1).to_vector<double>(), tol, tol);
  }
  expect_error([] { return softmax(ids({1, 2}, {2})); }, "[softmax] input must be floating point");
  expect_error([] { return log_softmax(X(), 3); }, "[log_softmax]");
}

// ---- layer_norm / rms_norm ----------------------------------------------------------------

TEST(NN, LayerNormMatchesTorch) {
  expect_close(layer_norm(X(), {4}, W4(), B4()),
               {0.34157177,  0.87103268,  2.5988612,  0.33289673,  2.1889439,  0.5111193,
                0.58891228,  0.096288305, -0.6777111, 0.14815259,  -2.5812859, 0.78885555,
                -0.66376132, -0.20006545, -3.0640886, 0.6727719,   1.9216842,  0.74939683,
                -2.0349374,  0.58795155,  -1.7463701, 0.076908658, 2.6541922,  0.27690866},
               1e-7, 1e-7);
  expect_close(layer_norm(X(), {3, 4}),
               {-0.052999787, -1.1659953, 0.90099638,  -0.37099851, 1.8549925,   -0.84799659,
                0.58299765,   -1.6429934, -0.21199915, 0.26499893,  -0.68899723, 1.3779945,
                -0.9022666,   0.36325019, -1.7459445,  0.64447615,  1.2069281,   -0.19920172,
                -0.058588741, 0.9257021,  -1.4647185,  0.22263721,  1.628767,    -0.62104065},
               1e-7, 1e-7);
  expect_close(rms_norm(X(), {4}, W4()),
               {0.6221708,  0.51847567,  3.3182443,  0,           2.4049128,   0.17177948,
                1.3742359,  -0.22903931, 0.25175435, -0.33567247, -0.67134494, 0.46154964,
                -1.2304545, -0.20507575, -3.281212,  0.17089646,  2.3590004,   0.087370384,
                0,          0.30579635,  -1.8463721, -0.12309148, 2.9541954,   -0.12309148},
               1e-7, 1e-7);
}

TEST(NN, NormGradients) {
  using V = std::vector<Tensor>;
  check_grad_fd([](const V& in) { return layer_norm(in[0], {4}, in[1], in[2]); },
                {X(), W4(), B4()});
  check_grad_fd([](const V& in) { return layer_norm(in[0], {4}, in[1]); }, {X(), W4()});
  check_grad_fd([](const V& in) { return layer_norm(in[0], {4}, Tensor(), in[1]); }, {X(), B4()});
  check_grad_fd([](const V& in) { return layer_norm(in[0], {3, 4}); }, {X()});
  check_grad_fd([](const V& in) { return rms_norm(in[0], {4}, in[1]); }, {X(), W4()});
  check_grad_fd([](const V& in) { return rms_norm(in[0], {3, 4}); }, {X()});
}

TEST(NN, NormBackwardManyRowsMatchesComposition) {
  // 300 rows: several rows per chunk of the dweight/dbias partial sums.
  Generator gen(5);
  Tensor x = randn({300, 24}, Dtype::f64, gen) * 3.0 + 1.0;
  Tensor w = randn({24}, Dtype::f64, gen), b = randn({24}, Dtype::f64, gen);
  Tensor cot = randn({300, 24}, Dtype::f64, gen);
  auto composed = [](const std::vector<Tensor>& in) {
    Tensor mu = mean(in[0], {-1}, true);
    Tensor v = var(in[0], {-1}, 0, true);
    return (in[0] - mu) * rsqrt(v + 1e-5) * in[1] + in[2];
  };
  auto fused = [](const std::vector<Tensor>& in) { return layer_norm(in[0], {24}, in[1], in[2]); };
  auto obj = [&](auto f) {
    return [f, &cot](const std::vector<Tensor>& in) { return sum(f(in) * cot); };
  };
  auto [v1, g1] = value_and_grad(obj(fused), {x, w, b});
  auto [v2, g2] = value_and_grad(obj(composed), {x, w, b});
  EXPECT_NEAR(v1.item<double>(), v2.item<double>(), 1e-9);
  for (size_t i = 0; i < 3; ++i)
    expect_close(g1[i], g2[i].to_vector<double>(), 1e-9, 1e-9, "input " + std::to_string(i));
  // Same bits with one thread: the partial sums do not depend on the thread count.
  const int threads = num_threads();
  set_num_threads(1);
  auto [v3, g3] = value_and_grad(obj(fused), {x, w, b});
  set_num_threads(threads);
  EXPECT_EQ(g3[1].to_vector<double>(), g1[1].to_vector<double>());
}

TEST(NN, NormDtypes) {
  Tensor ref = layer_norm(X(), {4}, W4(), B4());
  Tensor rref = rms_norm(X(), {4}, W4());
  for (Dtype dt : {Dtype::f32, Dtype::bf16}) {
    double tol = dt == Dtype::f32 ? 1e-5 : 3e-2;
    Tensor y = layer_norm(X(dt), {4}, cast(W4(), dt), cast(B4(), dt));
    EXPECT_EQ(y.dtype(), dt);
    expect_close(y, ref.to_vector<double>(), tol, tol, std::string(dtype_name(dt)));
    expect_close(rms_norm(X(dt), {4}, cast(W4(), dt)), rref.to_vector<double>(), tol, tol);
    // Gradients in the storage dtype against f64.
    auto f = [](const std::vector<Tensor>& in) {
      return sum(layer_norm(in[0], {4}, in[1], in[2]) * in[3]);
    };
    Tensor cot = from_vector<double>({1, -2, 0.5, 3}, {4});
    auto [v64, g64] = value_and_grad(f, {X(), W4(), B4(), cot});
    auto [vdt, gdt] = value_and_grad(f, {X(dt), cast(W4(), dt), cast(B4(), dt), cast(cot, dt)});
    for (size_t i = 0; i < 3; ++i)
      expect_close(gdt[i], g64[i].to_vector<double>(), 4 * tol, 4 * tol);
  }
}

TEST(NN, NormErrors) {
  expect_error([] { return layer_norm(X(), {3}); },
               "[layer_norm] normalized_shape (3) does not match the trailing dimensions of input "
               "(2, 3, 4)");
  expect_error(
      [] {
        return layer_norm(X(), {4}, from_vector<double>({1, 2, 3}, {3}));
      },
      "[layer_norm] weight has shape (3), expected (4)");
  expect_error([] { return rms_norm(X(), {5, 3, 4}); }, "[rms_norm] normalized_shape (5, 3, 4)");
  expect_error(
      [] {
        return layer_norm(ids({1, 2}, {2}), {2});
      },
      "[layer_norm] input must be floating point, got i64");
}

// ---- embedding / index_select / gather --------------------------------------------------------

TEST(NN, EmbeddingMatchesTorch) {
  Tensor E = from_vector(kE, {5, 3});
  Tensor y = embedding(E, ids({4, 0, 2, 2, 2, 1}, {2, 3}));
  EXPECT_EQ(y.shape(), (Shape{2, 3, 3}));
  expect_close(y, {3, 1, 2, 0.1, 0.2, 0.3, 2, 0, -2, 2, 0, -2, 2, 0, -2, 1, -1, 0.5});
  // i32 ids and a scalar id.
  Tensor y32 = embedding(E, from_vector<int32_t>({1}, {}));
  EXPECT_EQ(y32.shape(), (Shape{3}));
  expect_close(y32, {1, -1, 0.5});
}

TEST(NN, EmbeddingGradientScatterAdds) {
  Tensor E = from_vector(kE, {5, 3});
  Tensor id = ids({4, 0, 2, 2, 2, 1}, {2, 3});
  check_grad_fd([](const std::vector<Tensor>& in) { return embedding(in[0], in[1]); }, {E, id});
  // Hand-computed: the gradient of sum(embedding) counts each id's uses.
  Tensor Ew = from_vector(kE, {5, 3}).requires_grad_();
  sum(embedding(Ew, id)).backward();
  expect_close(Ew.grad(), {1, 1, 1, 1, 1, 1, 3, 3, 3, 0, 0, 0, 1, 1, 1});
  // Wide rows and many repeated ids in bf16 (column blocks, f32 accumulation).
  Generator gen(9);
  Tensor big = randn({7, 300}, Dtype::bf16, gen).requires_grad_();
  std::vector<int64_t> many(500);
  for (size_t i = 0; i < many.size(); ++i) many[i] = static_cast<int64_t>(i % 7 == 3 ? 3 : i % 2);
  sum(embedding(big, ids(many, {500}))).backward();
  auto g = big.grad().to_vector<double>();
  // Of the 500 ids 215 are 0, 214 are 1 and 71 are 3 (integers below 256: exact in bf16).
  EXPECT_EQ(g[0], 215.0);
  EXPECT_EQ(g[300], 214.0);
  EXPECT_EQ(g[3 * 300 + 299], 71.0);
  EXPECT_EQ(g[2 * 300], 0.0);
}

TEST(NN, EmbeddingErrors) {
  Tensor E = from_vector(kE, {5, 3});
  expect_error(
      [&] {
        return embedding(E, ids({0, 7, 1}, {3}));
      },
      "[embedding] id 7 is out of range for an embedding table of V=5 rows");
  expect_error([&] { return embedding(E, ids({-1}, {1})); }, "[embedding] id -1 is out of range");
  // Ids computed lazily are checked by the kernel at evaluation.
  expect_error(
      [&] {
        return embedding(E, ids({1, 2}, {2}) * ids({1, 3}, {2}));
      },
      "[embedding] id 6 is out of range for an embedding table of V=5 rows");
  expect_error([&] { return embedding(E, from_vector<float>({1}, {1})); },
               "[embedding] ids must be an integer tensor (i32 or i64), got f32");
  expect_error([&] { return embedding(from_vector(kE, {15}), ids({1}, {1})); },
               "[embedding] weight must be 2-D (V, D), got (15)");
}

TEST(NN, IndexSelectAndGatherMatchTorch) {
  Tensor s = index_select(X(), 1, ids({2, 0, 2}, {3}));
  EXPECT_EQ(s.shape(), (Shape{2, 3, 4}));
  expect_close(s, {0.25, 1,   -0.5, 2.75, 0.5,  -1.25, 2,  0,    0.25, 1,   -0.5, 2.75,
                   -2.5, 0.5, 3,    -1,   -1.5, 0.75,  -3, 1.25, -2.5, 0.5, 3,    -1});
  Tensor g2 = gather(X(), 2, ids({3, 0, 1, 1, 0, 2, 2, 3}, {2, 2, 2}));
  EXPECT_EQ(g2.shape(), (Shape{2, 2, 2}));
  expect_close(g2, {0, 0.5, -0.75, -0.75, -1.5, -3, 0, 1.75});
  Tensor g0 = gather(X(), 0, ids({1, 0, 1, 1, 0, 0, 1, 0}, {2, 1, 4}));
  expect_close(g0, {-1.5, -1.25, -3, 1.25, 0.5, -1.25, -3, 0});
  // A strided input: gather from a transposed view equals gather from its copy.
  Tensor xt = transpose(X(), 0, 2);  // (4, 3, 2)
  Tensor idx = ids({1, 0, 0, 1, 1, 1, 0, 0, 1, 0, 0, 1}, {2, 3, 2});
  expect_close(gather(xt, 0, idx), gather(copy(xt), 0, idx).to_vector<double>());
  // index_select along the last axis and an i32 index in f32 and bf16.
  for (Dtype dt : {Dtype::f32, Dtype::bf16}) {
    Tensor r = index_select(X(dt), -1, from_vector<int32_t>({3, 3, 0}, {3}));
    EXPECT_EQ(r.dtype(), dt);
    expect_close(r, {0, 0, 0.5, -2, -2, 3.5, 2.75, 2.75, 0.25, 1.25, 1.25, -1.5, 1.75, 1.75, 2.25,
                     -1, -1, -2.5});
  }
}

TEST(NN, IndexSelectAndGatherGradients) {
  using V = std::vector<Tensor>;
  check_grad_fd([](const V& in) { return index_select(in[0], 1, in[1]); },
                {X(), ids({2, 0, 2}, {3})});
  check_grad_fd([](const V& in) { return index_select(in[0], -1, in[1]); },
                {X(), ids({3, 3, 0, 3, 1}, {5})});
  check_grad_fd([](const V& in) { return gather(in[0], 2, in[1]); },
                {X(), ids({3, 0, 1, 1, 0, 2, 2, 3}, {2, 2, 2})});
  check_grad_fd([](const V& in) { return gather(in[0], 0, in[1]); },
                {X(), ids({1, 0, 1, 1, 0, 0, 1, 0, 1, 1, 1, 1}, {3, 1, 4})});
  // Second order: the vjp of the scatter-add is a gather again.
  check_grad_fd(
      [](const V& in) {
        auto g = grad({sum(square(gather(in[0], 1, in[1])))}, {in[0]})[0];
        return g * in[0];
      },
      {X(), ids({2, 2, 0, 1, 1, 1, 0, 0}, {2, 2, 2})});
}

TEST(NN, IndexErrors) {
  expect_error(
      [] {
        return index_select(X(), 1, ids({0, 3}, {2}));
      },
      "[index_select] index 3 is out of range for axis 1 of size 3");
  expect_error(
      [] {
        return index_select(X(), 1, ids({0, 1}, {1, 2}));
      },
      "[index_select] index must be 0-D or 1-D, got (1, 2)");
  expect_error([] { return index_select(X(), 5, ids({0}, {1})); }, "[index_select]");
  expect_error(
      [] {
        return gather(X(), 2, ids({4}, {1, 1, 1}));
      },
      "[gather] index 4 is out of range for axis 2 of size 4");
  expect_error(
      [] {
        return gather(X(), 2, ids({0, 1}, {2}));
      },
      "[gather] index (2) must have as many dimensions as input (2, 3, 4)");
  expect_error(
      [] {
        return gather(X(), 2, ids({0, 1, 0}, {3, 1, 1}));
      },
      "[gather] index (3, 1, 1) is larger than input (2, 3, 4) in dimension 0");
  expect_error(
      [] {
        return gather(X(), 1, from_vector<double>({0}, {1, 1, 1}));
      },
      "[gather] index must be an integer tensor");
}

// ---- cross_entropy ----------------------------------------------------------------------------

TEST(NN, CrossEntropyMatchesTorch) {
  Tensor L = reshape(X(), {6, 4});
  Tensor t = ids({3, 0, -100, 1, 2, 3}, {6});
  expect_close(cross_entropy(L, t, -100, "none"),
               {2.3344986, 0.14296228, 0, 1.021601, 2.8344561, 4.0993813}, 1e-7, 1e-7);
  expect_close(cross_entropy(L, t, -100, "sum"), {10.432899}, 1e-6, 1e-7);
  expect_close(cross_entropy(L, t), {2.0865799}, 1e-7, 1e-7);
  expect_close(cross_entropy(L, ids({3, 7, 7, 1, 2, 3}, {6}), 7), {2.5724843}, 1e-7, 1e-7);
  // (N, C, d) logits.
  Tensor L3 = reshape(X(), {2, 4, 3});
  Tensor t3 = ids({0, 3, 1, 2, -100, 3}, {2, 3});
  Tensor none3 = cross_entropy(L3, t3, -100, "none");
  EXPECT_EQ(none3.shape(), (Shape{2, 3}));
  expect_close(none3, {1.7873387, 4.0305817, 3.9603629, 1.8503733, 0, 1.2457284}, 1e-7, 1e-7);
  expect_close(cross_entropy(L3, t3), {2.574877}, 1e-7, 1e-7);
  // Unbatched (C) logits with a () target; every target ignored gives nan, as PyTorch.
  expect_close(cross_entropy(slice(L, 0, 0, 1), ids({3}, {1})), {2.3344986}, 1e-7, 1e-7);
  expect_close(cross_entropy(reshape(slice(L, 0, 0, 1), {4}), ids({3}, {})), {2.3344986}, 1e-7,
               1e-7);
  EXPECT_TRUE(std::isnan(cross_entropy(L, full({6}, -100, Dtype::i64)).item<double>()));
  // Huge logits stay finite.
  Tensor huge = from_vector<float>({1e4f, 0, -1e4f, 1e4f}, {2, 2});
  expect_close(cross_entropy(huge, ids({1, 0}, {2}), -100, "none"), {1e4, 2e4}, 1e-2, 1e-6);
}

TEST(NN, CrossEntropyGradients) {
  using V = std::vector<Tensor>;
  Tensor L = reshape(X(), {6, 4});
  Tensor t = ids({3, 0, -100, 1, 2, 3}, {6});
  for (const char* red : {"none", "sum", "mean"}) {
    check_grad_fd([red](const V& in) { return cross_entropy(in[0], in[1], -100, red); }, {L, t});
    check_grad_fd([red](const V& in) { return cross_entropy(in[0], in[1], -100, red); },
                  {reshape(X(), {2, 4, 3}), ids({0, 3, 1, 2, -100, 3}, {2, 3})});
  }
  // Hand-checked: d mean / d logits = (softmax - onehot) / count, zero rows where ignored.
  Tensor Lg = copy(L).detach().requires_grad_();
  cross_entropy(Lg, t).backward();
  Tensor want =
      (softmax(L, 1) -
       cast(equal(reshape(arange(0, 4, 1, Dtype::i64), {1, 4}), reshape(t, {6, 1})), Dtype::f64)) *
      (1.0 / 5);
  auto w = want.to_vector<double>();
  for (int c = 0; c < 4; ++c) w[static_cast<size_t>(2 * 4 + c)] = 0;
  expect_close(Lg.grad(), w, 1e-12, 1e-10);
}

TEST(NN, CrossEntropyDtypes) {
  Tensor L = reshape(X(), {6, 4});
  Tensor t = ids({3, 0, -100, 1, 2, 3}, {6});
  for (Dtype dt : {Dtype::f32, Dtype::bf16}) {
    double tol = dt == Dtype::f32 ? 1e-6 : 1e-2;
    Tensor l = cross_entropy(cast(L, dt), t);
    EXPECT_EQ(l.dtype(), dt);
    expect_close(l, {2.0865799}, tol, tol);
    Tensor Lg = cast(L, dt).detach().requires_grad_();
    cross_entropy(Lg, cast(t, Dtype::i32), -100, "sum").backward();
    EXPECT_EQ(Lg.grad().dtype(), dt);
    auto [v, g] = value_and_grad(
        [&t](const std::vector<Tensor>& in) { return cross_entropy(in[0], t, -100, "sum"); }, {L});
    expect_close(Lg.grad(), g[0].to_vector<double>(), tol, tol);
  }
}

TEST(NN, CrossEntropyErrors) {
  Tensor L = reshape(X(), {6, 4});
  expect_error(
      [&] {
        return cross_entropy(L, ids({3, 0, 4, 1, 2, 3}, {6}));
      },
      "[cross_entropy] target 4 is out of range for C=4 classes (targets must be in "
      "[0, 4) or equal ignore_index=-100)");
  expect_error(
      [&] {
        return cross_entropy(L, ids({3, 0, -1, 1, 2, 3}, {6}));
      },
      "[cross_entropy] target -1 is out of range for C=4");
  // Lazily computed targets: the kernel checks them.
  expect_error(
      [&] {
        return cross_entropy(L, ids({3, 0, 1, 1, 2, 3}, {6}) * 2);
      },
      "[cross_entropy] target 6 is out of range for C=4");
  expect_error(
      [&] {
        return cross_entropy(L, ids({3, 0, 1}, {3}));
      },
      "[cross_entropy] targets of shape (3) do not match logits of shape (6, 4): "
      "expected targets (6)");
  expect_error(
      [&] {
        return cross_entropy(L, from_vector<float>({0, 1, 2, 3, 0, 1}, {6}));
      },
      "[cross_entropy] targets must be integer class indices (i32 or i64), got f32");
  expect_error(
      [&] {
        return cross_entropy(L, ids({0, 1, 2, 3, 0, 1}, {6}), -100, "avg");
      },
      "[cross_entropy] reduction must be 'mean', 'sum' or 'none', got 'avg'");
}

// ---- dropout ----------------------------------------------------------------------------------

TEST(NN, DropoutIsReproducibleAndScaled) {
  Tensor x = ones({100, 100}, Dtype::f32);
  Generator g1(42), g2(42), g3(43);
  auto a = dropout(x, 0.25, true, g1).to_vector<double>();
  auto b = dropout(x, 0.25, true, g2).to_vector<double>();
  auto c = dropout(x, 0.25, true, g3).to_vector<double>();
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  int kept = 0;
  for (double v : a) {
    EXPECT_TRUE(v == 0.0 || std::abs(v - 1.0 / 0.75) < 1e-6) << v;
    kept += v != 0.0;
  }
  EXPECT_NEAR(kept / 10000.0, 0.75, 0.02);
  // The next call draws a fresh mask from the same generator.
  EXPECT_NE(dropout(x, 0.25, true, g1).to_vector<double>(), a);
  // p = 0 or eval mode: the input itself.
  EXPECT_EQ(dropout(x, 0.0, true, g1).node(), x.node());
  EXPECT_EQ(dropout(x, 0.5, false, g1).node(), x.node());
  expect_close(dropout(x, 1.0, true, g1), std::vector<double>(10000, 0.0));
  expect_error([&] { return dropout(x, 1.5, true, g1); }, "[dropout] p must be in [0, 1], got 1.5");
  expect_error([&] { return dropout(x, -0.1, true, g1); }, "[dropout] p must be in [0, 1]");
}

TEST(NN, DropoutGradient) {
  // A fresh generator per call gives the same mask, so finite differences apply.
  auto f = [](const std::vector<Tensor>& in) {
    Generator g(7);
    return dropout(in[0], 0.4, true, g);
  };
  check_grad_fd(f, {X()});
  Tensor xg = X().requires_grad_();
  Generator g(7);
  Tensor y = dropout(xg, 0.4, true, g);
  sum(y).backward();
  auto yv = y.to_vector<double>(), xv = X().to_vector<double>(), gv = xg.grad().to_vector<double>();
  for (size_t i = 0; i < yv.size(); ++i)
    EXPECT_NEAR(gv[i] * xv[i], yv[i], 1e-12);  // grad = mask / (1 - p)
  Tensor yb = dropout(X(Dtype::bf16), 0.4, true, g);
  EXPECT_EQ(yb.dtype(), Dtype::bf16);
}
