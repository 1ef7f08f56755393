// hetrain bench's measurements: a quick run gives plausible ceilings, and the profile it
// writes is the one the planner reads as `local`.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "backends/cpu/conv_dnnl.h"
#include "backends/cpu/gemm.h"
#include "hetrain/base/cpu_features.h"
#include "hetrain/base/error.h"
#include "hetrain/base/thread_pool.h"
#include "hetrain/insight/device_profile.h"
#include "hetrain/planning/catalog.h"

namespace hetrain::insight {
namespace {

TEST(DeviceProfile, QuickMeasurementIsPlausibleAndPlannerReadsIt) {
  DeviceProfile p = measure_device({.quick = true});
  EXPECT_GT(p.fma_peak_gflops, 1.0);
  EXPECT_GT(p.gemm_f32_tflops, 0.0);
  EXPECT_GT(p.gemm_bf16_tflops, 0.0);
  EXPECT_GT(p.mem_bw_gbs, 0.5);
  EXPECT_LT(p.mem_bw_gbs, 5000.0);
  EXPECT_GT(p.mem_bytes, 1e8);
  // A GEMM cannot beat the register-only loop of the unit it ran on (10% slack for timing
  // noise on a shared machine): the f32 FMA peak at the widest vector width, and for bf16 the
  // bf16 unit's peak where oneDNN ran bf16 code on it (AMX, AVX512-BF16), else the FMA peak.
  EXPECT_EQ(p.isa, fma_kernel().isa);
  EXPECT_EQ(p.gemm_ceiling_gflops(Dtype::f32), p.fma_peak_gflops);
  EXPECT_LE(p.gemm_f32_tflops * 1e3, p.fma_peak_gflops * 1.1);
  EXPECT_LE(p.gemm_f16_tflops * 1e3, p.fma_peak_gflops * 1.1);
  if (bf16_kernel()) {
    EXPECT_EQ(p.bf16_isa, bf16_kernel()->isa);
    EXPECT_GT(p.bf16_peak_gflops, 0.0);
  }
  const double bf16_ceiling = p.gemm_ceiling_gflops(Dtype::bf16);
  if (bf16_ceiling > 0)
    EXPECT_LE(p.gemm_bf16_tflops * 1e3, bf16_ceiling * 1.1) << p.gemm_bf16_impl;
  else
    ADD_FAILURE() << "no ceiling for bf16 GEMMs run by " << p.gemm_bf16_impl << " (bf16 unit "
                  << p.bf16_isa << ")";
  EXPECT_FALSE(p.rows.empty());
  // Both f32 GEMM libraries were timed; the one with the lower time ratio is the choice, and
  // this process takes it unless HETRAIN_SGEMM names one.
  EXPECT_GT(p.sgemm_onednn_s, 0.0);
  EXPECT_GT(p.sgemm_openblas_s, 0.0);
  EXPECT_EQ(p.sgemm_choice, p.sgemm_openblas_over_onednn < 1 ? "openblas" : "onednn");
  if (cpu::sgemm_path_source() != cpu::SgemmSource::env) {
    EXPECT_EQ(cpu::sgemm_path_name(cpu::sgemm_path()), p.sgemm_choice);
  }
  // The same for the convolution kernels: both orders timed, the faster taken.
  EXPECT_GT(p.conv_own_s, 0.0);
  EXPECT_GT(p.conv_onednn_s, 0.0);
  EXPECT_EQ(p.conv_choice, p.conv_own_over_onednn > 1 ? "onednn" : "own");
  if (cpu::conv_choice().source() != cpu::PathSource::env) {
    EXPECT_STREQ(cpu::conv_choice().name(static_cast<int>(cpu::conv_path())),
                 p.conv_choice.c_str());
  }
  // And for bf16 layers, where oneDNN has bf16 kernels at all.
  if (cpu::onednn_has_bf16_matmul()) {
    EXPECT_GT(p.bf16_onednn_s, 0.0);
    EXPECT_GT(p.bf16_f32_s, 0.0);
    EXPECT_EQ(p.bf16_choice, p.bf16_f32_over_onednn < 1 ? "sgemm" : "onednn");
    if (cpu::bf16_gemm_choice().source() != cpu::PathSource::env) {
      EXPECT_EQ(cpu::bf16_gemm_path() == cpu::Bf16GemmPath::onednn, p.bf16_choice == "onednn");
    }
  } else {
    EXPECT_EQ(p.bf16_choice, "");
    EXPECT_EQ(cpu::bf16_gemm_path(), cpu::Bf16GemmPath::convert_sgemm);
  }
  // The engine's own kernels: every rate positive and under the FMA ceiling (the attention
  // rate counts the masked half of a causal product as done, so it gets twice the ceiling).
  ASSERT_EQ(p.gemm_f32_grid.rates.size(), 8u);
  for (double r : p.gemm_f32_grid.rates) EXPECT_LE(r, p.fma_peak_gflops * 1.1);
  ASSERT_FALSE(p.conv_f32_rates.empty());
  // Rates count a direct convolution's products; Winograd F(2x2,3x3), which the engine runs for
  // 3x3 stride-1 layers of 8+ channels, does 16 of every 36 of them: up to 2.25x the ceiling.
  for (const auto& r : p.conv_f32_rates) {
    EXPECT_GT(r.gflops, 0.0);
    const double products = r.kernel == 3 && r.stride == 1 && std::min(r.in, r.out) >= 8 ? 2.25 : 1;
    EXPECT_LE(r.gflops, p.fma_peak_gflops * products * 1.1)
        << r.kernel << "x" << r.kernel << " " << r.in;
  }
  ASSERT_EQ(p.attention_f32_curve.size(), 2u);
  for (auto [size, r] : p.attention_f32_curve) EXPECT_LE(r, p.fma_peak_gflops * 2.2) << size;
  ASSERT_EQ(p.stream_f32_curve.size(), 2u);
  ASSERT_EQ(p.norm_f32_curve.size(), 1u);
  ASSERT_EQ(p.layer_f32_curve.size(), 1u);
  // Bytes of a 2048-token, width-128 GPT layer's passes (69 widths of f32 per token); a rate
  // between nothing and far past any memory.
  EXPECT_DOUBLE_EQ(p.layer_f32_curve[0].first, 2048.0 * 69 * 128 * 4);
  EXPECT_GT(p.layer_f32_curve[0].second, 0.0);
  EXPECT_LT(p.layer_f32_curve[0].second, 1000.0);

  const std::string dir =
      std::filesystem::temp_directory_path() / ("hetrain_profile_" + std::to_string(getpid()));
  const std::string path = dir + "/hetrain/device_profile.json";
  write_json_atomic(path, p.to_json());
  planning::Catalog cat;
  std::string warning;
  ASSERT_TRUE(cat.load_device_profile(path, &warning)) << warning;
  const planning::Hardware& h = cat.get("local");
  EXPECT_NEAR(h.tflops_f32, p.gemm_f32_tflops, 1e-12);
  EXPECT_NEAR(h.tflops_bf16, p.gemm_bf16_tflops, 1e-12);
  EXPECT_NEAR(h.mem_bw_gbs, p.mem_bw_gbs, 1e-9);
  EXPECT_TRUE(h.measured);
  EXPECT_EQ(h.conv_rates.size(), p.conv_f32_rates.size());
  EXPECT_NEAR(h.gemm_grid.rates[3] * 1e3, p.gemm_f32_grid.rates[3], 1e-9);
  EXPECT_EQ(h.attention_curve.size(), 2u);
  EXPECT_NEAR(h.stream_curve[1].second, p.stream_f32_curve[1].second, 1e-9);
  EXPECT_NEAR(h.norm_curve[0].second, p.norm_f32_curve[0].second, 1e-9);
  ASSERT_EQ(h.layer_curve.size(), 1u);
  EXPECT_NEAR(h.layer_curve[0].second, p.layer_f32_curve[0].second, 1e-9);
  std::filesystem::remove_all(dir);
}

// Each peak loop does the work it is rated for: its result after n iterations is the closed
// form, and the widest unit the CPU reports is the one measured.
TEST(DeviceProfile, PeakLoopsComputeTheirClosedFormOnEveryUnitPresent) {
  const CpuFeatures& f = cpu_features();
  const std::vector<PeakKernel> ks = peak_kernels();
  ASSERT_FALSE(ks.empty());
  EXPECT_STREQ(fma_kernel().isa, f.avx512f ? "avx512f" : f.avx2 && f.fma ? "avx2+fma" : "sse");
  EXPECT_EQ(bf16_kernel().has_value(), f.avx512bf16 || (f.amx_tile && f.amx_bf16));
  for (const PeakKernel& k : ks) {
    for (int64_t iters : {int64_t{1}, int64_t{1000}}) {
      const double want = k.result(iters), got = k.fn(iters);
      EXPECT_NEAR(got, want, 1e-4 * std::abs(want)) << k.isa << " after " << iters;
    }
  }
  // Flops per iteration: 12 chains of one vector each (f32 FMA: 2 flops a lane).
  for (const PeakKernel& k : ks) {
    const std::string isa = k.isa;
    const double want = isa == "avx512f"       ? 12 * 16 * 2
                        : isa == "avx2+fma"    ? 12 * 8 * 2
                        : isa == "sse"         ? 12 * 4 * 2
                        : isa == "avx512-bf16" ? 12 * 16 * 2 * 2
                                               : 4 * 16 * 16 * 32 * 2;  // amx-bf16: 4 tiles
    EXPECT_EQ(k.flops_per_iter, want) << isa;
  }
}

TEST(DeviceProfile, Bf16CeilingFollowsTheImplementationThatRan) {
  DeviceProfile p;
  p.fma_peak_gflops = 100;
  p.bf16_peak_gflops = 800;
  p.bf16_isa = "amx-bf16";
  EXPECT_EQ(p.gemm_ceiling_gflops(Dtype::bf16), 100);  // converted to f32
  p.gemm_bf16_impl = "brg:avx512_core_amx_bf16";
  EXPECT_EQ(p.gemm_ceiling_gflops(Dtype::bf16), 800);
  p.gemm_bf16_impl = "jit_bf16:avx512_core";  // bf16 emulated on the FMA units
  EXPECT_EQ(p.gemm_ceiling_gflops(Dtype::bf16), 100);
  p.gemm_bf16_impl = "brg:avx512_core_bf16";
  EXPECT_EQ(p.gemm_ceiling_gflops(Dtype::bf16), 800);
  EXPECT_EQ(p.gemm_ceiling_gflops(Dtype::f32), 100);
  p.bf16_isa = "avx512-bf16";
  p.gemm_bf16_impl = "brg:avx512_core_amx_bf16";  // AMX ran but its loop was not measured
  EXPECT_EQ(p.gemm_ceiling_gflops(Dtype::bf16), 0);
  // The profile keeps all three through its JSON form.
  p.gemm_f32_tflops = 0.05, p.mem_bw_gbs = 10, p.mem_bytes = 1e9;
  const DeviceProfile q = DeviceProfile::from_json(p.to_json());
  EXPECT_EQ(q.bf16_peak_gflops, 800);
  EXPECT_EQ(q.bf16_isa, "avx512-bf16");
  EXPECT_EQ(q.gemm_bf16_impl, "brg:avx512_core_amx_bf16");
}

TEST(DeviceProfile, UnwritablePathIsAnErrorAndLeavesNothing) {
  EXPECT_THROW(check_writable("/proc/forbidden/profile.json", "--json file"), Error);
  const std::string dir =
      std::filesystem::temp_directory_path() / ("hetrain_w_" + std::to_string(getpid()));
  check_writable(dir + "/a/profile.json", "--json file");
  EXPECT_FALSE(std::filesystem::exists(dir + "/a/profile.json"));
  EXPECT_THROW(check_writable(dir, "--json file"), Error);  // a directory
  std::filesystem::remove_all(dir);
}

TEST(DeviceProfile, AtomicWriteReplacesTheFile) {
  const std::string path = std::filesystem::temp_directory_path() /
                           ("hetrain_atomic_" + std::to_string(getpid()) + ".json");
  write_json_atomic(path, {{"a", 1}});
  write_json_atomic(path, {{"a", 2}});
  std::ifstream in(path);
  EXPECT_EQ(nlohmann::json::parse(in)["a"], 2);
  std::filesystem::remove(path);
}

// The f32 GEMM library and convolution kernels a stored profile found faster are the ones a run
// takes (unless HETRAIN_SGEMM or HETRAIN_CONV_PATH name one); a profile without timings, or
// with a choice that names neither path, leaves the path alone and says why.
TEST(DeviceProfile, PathChoicesAreStoredReadAndTaken) {
  const std::string dir =
      std::filesystem::temp_directory_path() / ("hetrain_sgemm_" + std::to_string(getpid()));
  const std::string path = dir + "/device_profile.json";
  DeviceProfile p;
  p.cpu_model = cpu_features().model;
  p.hetrain_version = HETRAIN_VERSION;
  p.fma_peak_gflops = 100;
  p.gemm_f32_tflops = 0.05;
  p.mem_bw_gbs = 10;
  p.mem_bytes = 1e9;
  const bool env = cpu::sgemm_path_source() == cpu::SgemmSource::env;
  const bool conv_env = cpu::conv_choice().source() == cpu::PathSource::env;
  const bool bf16_env = cpu::bf16_gemm_choice().source() == cpu::PathSource::env;

  write_json_atomic(path, p.to_json());
  EXPECT_NE(apply_path_choices(path).gemm.find("has no sgemm timings"), std::string::npos);
  EXPECT_NE(apply_path_choices(path).conv.find("has no convolution timings"), std::string::npos);
  EXPECT_NE(apply_path_choices(path).bf16.find("has no bf16 timings"), std::string::npos);

  for (const auto& [choice, ratio] : {std::pair{"openblas", 0.8}, std::pair{"onednn", 1.25}}) {
    p.sgemm_onednn_s = 0.01;
    p.sgemm_openblas_s = 0.01 * ratio;
    p.sgemm_openblas_over_onednn = ratio;
    p.sgemm_choice = choice;
    write_json_atomic(path, p.to_json());
    DeviceProfile back;
    std::string why;
    ASSERT_TRUE(load_device_profile(path, 0, &back, &why)) << why;
    EXPECT_EQ(back.sgemm_choice, choice);
    EXPECT_DOUBLE_EQ(back.sgemm_openblas_over_onednn, ratio);
    const std::string said = apply_path_choices(path).gemm;
    EXPECT_EQ(said.rfind(choice, 0), 0u) << said;
    if (!env) {
      EXPECT_STREQ(cpu::sgemm_path_name(cpu::sgemm_path()), choice);
    }
  }

  for (const auto& [choice, ratio] : {std::pair{"onednn", 1.25}, std::pair{"own", 0.8}}) {
    p.conv_own_s = 0.01 * ratio;
    p.conv_onednn_s = 0.01;
    p.conv_own_over_onednn = ratio;
    p.conv_choice = choice;
    write_json_atomic(path, p.to_json());
    DeviceProfile back;
    std::string why;
    ASSERT_TRUE(load_device_profile(path, 0, &back, &why)) << why;
    EXPECT_EQ(back.conv_choice, choice);
    EXPECT_DOUBLE_EQ(back.conv_own_over_onednn, ratio);
    const std::string said = apply_path_choices(path).conv;
    EXPECT_EQ(said.rfind(choice, 0), 0u) << said;
    if (!conv_env) {
      EXPECT_STREQ(cpu::conv_choice().name(static_cast<int>(cpu::conv_path())), choice);
    }
  }

  for (const auto& [choice, ratio] : {std::pair{"sgemm", 0.8}, std::pair{"onednn", 1.25}}) {
    p.bf16_onednn_s = 0.01;
    p.bf16_f32_s = 0.01 * ratio;
    p.bf16_f32_over_onednn = ratio;
    p.bf16_choice = choice;
    write_json_atomic(path, p.to_json());
    DeviceProfile back;
    std::string why;
    ASSERT_TRUE(load_device_profile(path, 0, &back, &why)) << why;
    EXPECT_EQ(back.bf16_choice, choice);
    EXPECT_DOUBLE_EQ(back.bf16_f32_over_onednn, ratio);
    const std::string said = apply_path_choices(path).bf16;
    EXPECT_EQ(said.rfind(choice, 0), 0u) << said;
    // Converted wherever oneDNN has no bf16 kernels, whatever the profile says.
    if (!bf16_env) {
      EXPECT_EQ(cpu::bf16_gemm_path() == cpu::Bf16GemmPath::onednn,
                cpu::onednn_has_bf16_matmul() && std::string(choice) == "onednn");
    }
  }

  // A choice that names neither path: the profile is corrupt, and the field is named.
  for (const char* field : {"sgemm", "conv", "bf16_gemm"}) {
    nlohmann::json j = p.to_json();
    j[field]["choice"] = "mkl";
    std::ofstream(path) << j.dump();
    const PathChoiceNotes said = apply_path_choices(path);
    for (const std::string& note : {said.gemm, said.conv, said.bf16}) {
      EXPECT_NE(note.find("corrupt"), std::string::npos) << note;
      EXPECT_NE(note.find(std::string(field) + ".choice"), std::string::npos) << note;
    }
  }
  if (!env) {
    EXPECT_EQ(cpu::sgemm_path(), cpu::SgemmPath::onednn);
  }  // the last ones taken
  if (!conv_env) {
    EXPECT_EQ(cpu::conv_path(), cpu::ConvPath::own);
  }
  cpu::conv_choice().set_measured(static_cast<int>(cpu::conv_rule_path()));
  cpu::bf16_gemm_choice().set_measured(static_cast<int>(cpu::bf16_gemm_rule_path()));
  std::filesystem::remove_all(dir);
}

// A stored profile is used only when it was made by this version on this CPU model; anything
// else is named in the reason and re-measured.
TEST(DeviceProfile, StaleForeignOrCorruptProfilesAreRejected) {
  const std::string dir =
      std::filesystem::temp_directory_path() / ("hetrain_stale_" + std::to_string(getpid()));
  const std::string path = dir + "/device_profile.json";
  DeviceProfile good;
  good.name = "test";
  good.cpu_model = cpu_features().model;
  good.hetrain_version = HETRAIN_VERSION;
  good.threads = 3;
  good.fma_peak_gflops = 100;
  good.gemm_f32_tflops = 0.05;
  good.mem_bw_gbs = 10;
  good.mem_bytes = 1e9;
  DeviceProfile got;
  std::string why;

  write_json_atomic(path, good.to_json());
  ASSERT_TRUE(load_device_profile(path, 3, &got, &why)) << why;
  EXPECT_DOUBLE_EQ(got.fma_peak_gflops, 100);
  EXPECT_DOUBLE_EQ(got.ridge_flop_per_byte(), 10);
  EXPECT_FALSE(load_device_profile(path, 2, &got, &why));
  EXPECT_NE(why.find("measured with 3 threads"), std::string::npos) << why;

  DeviceProfile old = good;
  old.hetrain_version = "0.0.1";
  write_json_atomic(path, old.to_json());
  EXPECT_FALSE(load_device_profile(path, 0, &got, &why));
  EXPECT_NE(why.find("stale"), std::string::npos) << why;

  DeviceProfile foreign = good;
  foreign.cpu_model = "Some Other CPU 9000";
  write_json_atomic(path, foreign.to_json());
  EXPECT_FALSE(load_device_profile(path, 0, &got, &why));
  EXPECT_NE(why.find("foreign"), std::string::npos) << why;

  for (const char* bad : {"{\"version\": 1, \"gemm_tflops\"", "[1, 2]",
                          "{\"version\": 1, \"gemm_tflops\": {\"f32\": -1}}"}) {
    std::ofstream(path) << bad;
    EXPECT_FALSE(load_device_profile(path, 0, &got, &why));
    EXPECT_NE(why.find("corrupt"), std::string::npos) << why;
  }
  EXPECT_FALSE(load_device_profile(dir + "/missing.json", 0, &got, &why));

  // The corrupt file is re-measured and replaced by a usable profile.
  set_num_threads(0);
  DeviceProfile fresh = stored_or_measured_profile(path);
  EXPECT_GT(fresh.fma_peak_gflops, 1.0);
  ASSERT_TRUE(load_device_profile(path, 0, &got, &why)) << why;
  EXPECT_DOUBLE_EQ(got.mem_bw_gbs, fresh.mem_bw_gbs);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace hetrain::insight
