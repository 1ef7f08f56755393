// The two f32 GEMM libraries behind Matmul (oneDNN's sgemm and OpenBLAS's), each forced in
// turn, against an f64 reference; and the order in which the library is chosen: a bench's
// override, then HETRAIN_SGEMM, then the device profile's measurement (set_sgemm_path), then
// the built-in rule. A CPU takes only one of the two by default, so without forcing, the other
// would go untested there.
//
// Tolerance: f32 inputs, so the f64 product of the same values is exact up to f64 rounding; an
// f32 sum of K products differs from it by at most about K * 2^-24 * sum_k |a_ik b_kj|. We allow
// 2^-24 * (K + 4) * sum|a||b|, which a wrong element (a product missed or doubled, a transpose
// taken the wrong way) exceeds by orders of magnitude.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "backends/cpu/gemm.h"
#include "hetrain/base/thread_pool.h"
#include "hetrain/graph/ops.h"

using namespace hetrain;

namespace {

struct Case {
  int64_t M, N, K;
  bool ta, tb;
};

// Small and odd shapes, and ones large enough that gemm_blocks splits them over the threads
// (by rows where M >= N, else by columns).
const Case kCases[] = {{37, 53, 29, false, false}, {33, 17, 65, true, false},
                       {20, 31, 40, false, true},  {16, 16, 300, true, true},
                       {1, 40, 70, false, false},  {300, 200, 64, false, true},
                       {96, 384, 128, true, false}};

std::string name(const Case& c) {
  return "M=" + std::to_string(c.M) + " N=" + std::to_string(c.N) + " K=" + std::to_string(c.K) +
         (c.ta ? " ta" : "") + (c.tb ? " tb" : "");
}

void expect_matches_f64(const Case& c, const std::string& library) {
  Generator gen(21);
  // Transposed operands are views, which Matmul passes to the GEMM as transposed.
  Tensor a = c.ta ? transpose(randn({c.K, c.M}, Dtype::f32, gen), 0, 1)
                  : randn({c.M, c.K}, Dtype::f32, gen);
  Tensor b = c.tb ? transpose(randn({c.N, c.K}, Dtype::f32, gen), 0, 1)
                  : randn({c.K, c.N}, Dtype::f32, gen);
  const std::vector<double> av = a.to_vector<double>(), bv = b.to_vector<double>();
  const std::vector<double> got = matmul(a, b).to_vector<double>();
  ASSERT_EQ(got.size(), static_cast<size_t>(c.M * c.N));
  int bad = 0;
  for (int64_t i = 0; i < c.M; ++i)
    for (int64_t j = 0; j < c.N; ++j) {
      double ref = 0, scale = 0;
      for (int64_t k = 0; k < c.K; ++k) {
        const double p =
            av[static_cast<size_t>(i * c.K + k)] * bv[static_cast<size_t>(k * c.N + j)];
        ref += p;
        scale += std::abs(p);
      }
      const double tol = std::ldexp(scale * static_cast<double>(c.K + 4), -24);
      const double g = got[static_cast<size_t>(i * c.N + j)];
      if (!(std::abs(g - ref) <= tol) && ++bad <= 3)
        ADD_FAILURE() << library << " " << name(c) << " [" << i << "," << j << "]: got " << g
                      << ", want " << ref << " +- " << tol;
    }
  EXPECT_EQ(bad, 0) << library << " " << name(c);
}

TEST(SgemmPath, BothLibrariesMatchF64ThroughMatmul) {
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    for (const cpu::SgemmPath path : {cpu::SgemmPath::onednn, cpu::SgemmPath::openblas}) {
      const cpu::SgemmPathOverride use(path);
      ASSERT_EQ(cpu::sgemm_path(), path);
      for (const Case& c : kCases)
        expect_matches_f64(c, std::string(cpu::sgemm_path_name(path)) + " on " +
                                  std::to_string(threads) + " thread(s)");
    }
  }
  set_num_threads(0);
}

TEST(SgemmPath, OverrideThenEnvironmentThenMeasurementThenRule) {
  const char* env = std::getenv("HETRAIN_SGEMM");
  const bool env_set = env != nullptr && *env != '\0';
  // Before any measurement: the rule, unless the environment names a library.
  EXPECT_EQ(cpu::sgemm_path_source(), env_set ? cpu::SgemmSource::env : cpu::SgemmSource::rule);
  if (!env_set) {
    EXPECT_EQ(cpu::sgemm_path(), cpu::sgemm_rule_path());
  }
  for (const cpu::SgemmPath measured : {cpu::SgemmPath::openblas, cpu::SgemmPath::onednn}) {
    cpu::set_sgemm_path(measured);
    if (env_set) {
      EXPECT_EQ(cpu::sgemm_path_source(), cpu::SgemmSource::env);
      EXPECT_STREQ(cpu::sgemm_path_name(cpu::sgemm_path()), env);
    } else {
      EXPECT_EQ(cpu::sgemm_path_source(), cpu::SgemmSource::measured);
      EXPECT_EQ(cpu::sgemm_path(), measured);
    }
    const cpu::SgemmPath other =
        measured == cpu::SgemmPath::onednn ? cpu::SgemmPath::openblas : cpu::SgemmPath::onednn;
    {
      const cpu::SgemmPathOverride use(other);  // beats both
      EXPECT_EQ(cpu::sgemm_path(), other);
    }
    if (!env_set) {
      EXPECT_EQ(cpu::sgemm_path(), measured);
    }
  }
}

}  // namespace
