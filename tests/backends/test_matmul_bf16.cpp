// bf16 GEMM against an f64 reference, through both bf16 paths: oneDNN's bf16 matmul primitive
// and convert-to-f32 + sgemm (whichever Matmul picks on this CPU, and each one forced).
//
// Tolerance: the inputs are bf16 values, so the f64 product of the same values is exact up
// to f64 rounding; the result differs from it by f32 accumulation (at most ~K * 2^-24 *
// sum|a||b|, far below the next term) plus the final rounding to bf16 (half an ulp: 2^-9
// relative). We allow |got - ref| <= 2^-8 * |ref| + 2^-12 * sum_k |a_ik b_kj|.
#include <gtest/gtest.h>

#include <cmath>
#include <thread>
#include <vector>

#include "backends/cpu/gemm.h"
#include "backends/cpu/omp_single.h"
#include "backends/cpu/path_choice.h"
#include "hetrain/graph/ops.h"

using namespace hetrain;

namespace {

struct Case {
  int64_t batch, M, N, K;
  bool ta, tb;
};

/// Row-major values of x (logical order) as f64.
std::vector<double> values(const Tensor& x) { return x.to_vector<double>(); }

/// ref[b][i][j] and the bound's scale sum_k |a||b| from f64 copies of a (batch, M, K), b
/// (batch, K, N).
void reference(const std::vector<double>& a, const std::vector<double>& b, const Case& c,
               std::vector<double>& ref, std::vector<double>& scale) {
  ref.assign(static_cast<size_t>(c.batch * c.M * c.N), 0.0);
  scale.assign(ref.size(), 0.0);
  for (int64_t z = 0; z < c.batch; ++z)
    for (int64_t i = 0; i < c.M; ++i)
      for (int64_t j = 0; j < c.N; ++j) {
        double s = 0, t = 0;
        for (int64_t k = 0; k < c.K; ++k) {
          const double p = a[static_cast<size_t>((z * c.M + i) * c.K + k)] *
                           b[static_cast<size_t>((z * c.K + k) * c.N + j)];
          s += p;
          t += std::abs(p);
        }
        ref[static_cast<size_t>((z * c.M + i) * c.N + j)] = s;
        scale[static_cast<size_t>((z * c.M + i) * c.N + j)] = t;
      }
}

void expect_within(const std::vector<double>& got, const std::vector<double>& ref,
                   const std::vector<double>& scale, const std::string& what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double tol = std::ldexp(std::abs(ref[i]), -8) + std::ldexp(scale[i], -12);
    if (!(std::abs(got[i] - ref[i]) <= tol) && ++bad <= 5)
      ADD_FAILURE() << what << " [" << i << "]: got " << got[i] << ", want " << ref[i] << " +- "
                    << tol;
  }
  EXPECT_EQ(bad, 0) << what;
}

const Case kCases[] = {
    {1, 64, 48, 96, false, false}, {1, 37, 53, 29, false, false}, {1, 33, 17, 65, true, false},
    {1, 20, 31, 40, false, true},  {1, 16, 16, 300, true, true},  {3, 9, 11, 13, false, false},
    {1, 1, 40, 70, false, false},  {1, 70, 1, 40, false, false},  {3, 19, 7, 33, true, true},
};

/// a (batch, M, K) and b (batch, K, N) in bf16, built transposed when the case says so (the
/// transpose is a view, which Matmul passes to the GEMM as a transposed operand); with pad > 0,
/// each is a view into rows pad elements wider than the matrix (leading dimension > extent).
std::pair<Tensor, Tensor> operands(const Case& c, Generator& gen, int64_t pad = 0) {
  // A (batch, rows, cols) matrix stored with `cols + pad` elements a row.
  const auto stored = [&](int64_t rows, int64_t cols) {
    Tensor t = randn({c.batch, rows, cols + pad}, Dtype::bf16, gen);
    return pad > 0 ? slice(t, 2, 0, cols) : t;
  };
  Tensor a = c.ta ? transpose(stored(c.K, c.M), 1, 2) : stored(c.M, c.K);
  Tensor b = c.tb ? transpose(stored(c.N, c.K), 1, 2) : stored(c.K, c.N);
  return {a, b};
}

std::string name(const Case& c) {
  return "batch=" + std::to_string(c.batch) + " M=" + std::to_string(c.M) +
         " N=" + std::to_string(c.N) + " K=" + std::to_string(c.K) + (c.ta ? " ta" : "") +
         (c.tb ? " tb" : "");
}

}  // namespace

TEST(MatmulBf16, MatchesF64ReferenceThroughMatmul) {
  Generator gen(11);
  for (const Case& c : kCases) {
    auto [a, b] = operands(c, gen);
    Tensor y = matmul(a, b);
    ASSERT_EQ(y.dtype(), Dtype::bf16);
    std::vector<double> ref, scale;
    reference(values(a), values(b), c, ref, scale);
    expect_within(values(y), ref, scale, "matmul " + name(c));
  }
}

TEST(MatmulBf16, ConvertedPathMatchesF64ReferenceInEveryLayout) {
  // Forced to convert + sgemm (the path of CPUs whose bf16 unit does not pay, and of every AVX2
  // CPU), with the operands transposed, batched, and cut from wider rows: the converted copy keeps
  // each operand's orientation, so its leading dimension is the copy's, not the source's.
  cpu::PathOverride convert(cpu::bf16_gemm_choice(),
                            static_cast<int>(cpu::Bf16GemmPath::convert_sgemm));
  Generator gen(14);
  for (const Case& c : kCases) {
    auto [a, b] = operands(c, gen);
    std::vector<double> ref, scale;
    reference(values(a), values(b), c, ref, scale);
    Tensor y = matmul(a, b);
    ASSERT_EQ(y.dtype(), Dtype::bf16);
    expect_within(values(y), ref, scale, "converted " + name(c));
    // Operands cut from wider rows.
    auto [wa, wb] = operands(c, gen, /*pad=*/5);
    reference(values(wa), values(wb), c, ref, scale);
    expect_within(values(matmul(wa, wb)), ref, scale, "converted, padded rows " + name(c));
  }
}

TEST(MatmulBf16, OneDnnPrimitiveMatchesF64Reference) {
  // Forced through oneDNN whatever this CPU's default, with f32 and bf16 outputs.
  if (!cpu::onednn_has_bf16_matmul())
    GTEST_SKIP() << "oneDNN has no bf16 matmul on this CPU (needs AVX-512); Matmul converts "
                    "to f32 here, which MatchesF64ReferenceThroughMatmul checks";
  Generator gen(12);
  for (const Case& c : kCases) {
    if (c.batch != 1) continue;
    // Contiguous storage of the operands as the GEMM sees them.
    Tensor as = randn({c.ta ? c.K : c.M, c.ta ? c.M : c.K}, Dtype::bf16, gen).eval();
    Tensor bs = randn({c.tb ? c.N : c.K, c.tb ? c.K : c.N}, Dtype::bf16, gen).eval();
    Tensor a = c.ta ? transpose(as, 0, 1) : as, b = c.tb ? transpose(bs, 0, 1) : bs;
    std::vector<double> ref, scale;
    reference(values(a), values(b), c, ref, scale);
    const auto* ap = as.array().data<BFloat16>();
    const auto* bp = bs.array().data<BFloat16>();
    std::vector<float> c32(static_cast<size_t>(c.M * c.N));
    cpu::gemm_bf16_onednn(c.ta, c.tb, c.M, c.N, c.K, ap, as.shape()[1], bp, bs.shape()[1],
                          c32.data(), /*c_bf16=*/false, c.N);
    expect_within(std::vector<double>(c32.begin(), c32.end()), ref, scale,
                  "oneDNN f32 out " + name(c));
    std::vector<BFloat16> c16(static_cast<size_t>(c.M * c.N));
    cpu::gemm_bf16_onednn(c.ta, c.tb, c.M, c.N, c.K, ap, as.shape()[1], bp, bs.shape()[1],
                          c16.data(), /*c_bf16=*/true, c.N);
    std::vector<double> got16;
    for (BFloat16 v : c16) got16.push_back(bf16_to_float(v.bits));
    expect_within(got16, ref, scale, "oneDNN bf16 out " + name(c));
  }
}

TEST(MatmulBf16, OneDnnPrimitiveRunsOnOtherThreadsAtOnce) {
  // The executor runs a cached primitive on whichever pool thread takes the node, and two nodes
  // at once: each run, on two threads together, one OpenMP thread each (as on the pool's
  // blocks), gives the bits of the run on the thread that built the primitive.
  if (!cpu::onednn_has_bf16_matmul())
    GTEST_SKIP() << "oneDNN has no bf16 matmul on this CPU (needs AVX-512)";
  const Case cases[] = {{1, 256, 128, 2048, true, false},
                        {1, 1024, 384, 128, false, true},
                        {1, 128, 512, 2048, true, false}};
  Generator gen(13);
  for (const Case& c : cases) {
    Tensor as = randn({c.ta ? c.K : c.M, c.ta ? c.M : c.K}, Dtype::bf16, gen).eval();
    Tensor bs = randn({c.tb ? c.N : c.K, c.tb ? c.K : c.N}, Dtype::bf16, gen).eval();
    const auto* ap = as.array().data<BFloat16>();
    const auto* bp = bs.array().data<BFloat16>();
    const auto run = [&](std::vector<float>& out) {
      cpu::SingleOmpThread one;
      cpu::gemm_bf16_onednn(c.ta, c.tb, c.M, c.N, c.K, ap, as.shape()[1], bp, bs.shape()[1],
                            out.data(), /*c_bf16=*/false, c.N);
    };
    std::vector<float> want(static_cast<size_t>(c.M * c.N));
    run(want);
    int mismatched[2] = {0, 0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 2; ++t)
      threads.emplace_back([&, t] {
        std::vector<float> got(want.size());
        for (int rep = 0; rep < 20; ++rep) {
          std::fill(got.begin(), got.end(), 0.0f);
          run(got);
          if (got != want) ++mismatched[t];
        }
      });
    for (auto& t : threads) t.join();
    EXPECT_EQ(mismatched[0] + mismatched[1], 0) << name(c) << ": runs on other threads differ";
  }
}

TEST(MatmulBf16, ToleranceIsTightEnoughToFail) {
  // A result off by one part in 64 must fail the bound above.
  std::vector<double> ref{1.0, -2.0}, scale{1.0, 2.0}, got{1.0 + 1.0 / 64, -2.0};
  const double tol = std::ldexp(1.0, -8) + std::ldexp(1.0, -12);
  EXPECT_GT(std::abs(got[0] - ref[0]), tol);
}
