// Catalog loading, device profile, search and the measured-runs report.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>

#include "hetrain/base/error.h"
#include "hetrain/planning/calibration.h"
#include "hetrain/planning/plan.h"
#include "hetrain/planning/report.h"
#include "testing.h"

using namespace hetrain;
using namespace hetrain::planning;
namespace fs = std::filesystem;

using hetrain::testing::error_of;

namespace {
std::string catalog_path() { return std::string(HETRAIN_SOURCE_DIR) + "/data/hardware.json"; }

std::string write_temp(const std::string& name, const std::string& text) {
  fs::path p =
      fs::temp_directory_path() / ("hetrain_test_" + std::to_string(::getpid()) + "_" + name);
  std::ofstream(p) << text;
  return p.string();
}

/// The `local` hardware of a device profile given as JSON text (it must load).
Hardware load_local(const std::string& json) {
  std::string path = write_temp("local_profile.json", json);
  Catalog c;
  std::string warning;
  EXPECT_TRUE(c.load_device_profile(path, &warning)) << warning;
  fs::remove(path);
  return c.get("local");
}

}  // namespace

TEST(PlanCatalog, HasTheRequiredHardwareWithSources) {
  Catalog c = Catalog::load(catalog_path());
  for (const char* id : {"v100-sxm2-32gb", "a100-40gb-sxm", "a100-80gb-sxm", "h100-sxm", "h200-sxm",
                         "rtx-4090", "rtx-3090", "mi250x", "mi300x", "tpu-v5e"}) {
    ASSERT_TRUE(c.contains(id)) << id;
    const Hardware& h = c.get(id);
    EXPECT_GE(h.sources.size(), 7u) << id;
    for (const auto& [k, s] : h.sources) EXPECT_FALSE(s.date.empty()) << id << " " << k;
  }
  // Spot checks against the datasheets.
  EXPECT_DOUBLE_EQ(c.get("a100-80gb-sxm").tflops_bf16, 312);
  EXPECT_DOUBLE_EQ(c.get("a100-80gb-sxm").mem_gb, 80);
  EXPECT_DOUBLE_EQ(c.get("h100-sxm").tflops_bf16, 989.4);
  EXPECT_DOUBLE_EQ(c.get("h200-sxm").mem_gb, 141);
  EXPECT_DOUBLE_EQ(c.get("mi300x").mem_gb, 192);
  EXPECT_DOUBLE_EQ(c.get("tpu-v5e").tflops_bf16, 197);
}

TEST(PlanCatalog, MissingSourceIsAnErrorNamingTheField) {
  std::string text = R"({"hardware": [{"id": "x", "name": "X", "vendor": "v",
    "peak_tflops": {"f32": 1, "tf32": 1, "bf16": 1, "f16": 1, "fp8": 0},
    "mem_gb": 1, "mem_bw_gbs": 1, "link": {"kind": "pcie", "gbs": 1, "gpus_per_node": 1},
    "pcie_gen": 4, "tdp_w": 1, "price_usd_per_hour": 1, "host_mem_gb_per_device": 1,
    "host_mem_bw_gbs_per_device": 1, "network_gbs_per_device": 1,
    "sources": {"peak_tflops": {"doc": "d", "date": "2024"}}}]})";
  std::string path = write_temp("cat.json", text);
  std::string e = error_of([&] { Catalog::load(path); });
  EXPECT_NE(e.find("hardware 'x': sources.memory is missing"), std::string::npos) << e;
  fs::remove(path);
  EXPECT_NE(error_of([] { Catalog::load("/nonexistent/hw.json"); }).find("cannot open"),
            std::string::npos);
}

TEST(PlanCatalog, DeviceProfileJoinsAsLocal) {
  Catalog c = Catalog::load(catalog_path());
  std::string warning;
  EXPECT_FALSE(c.load_device_profile("/nonexistent/profile.json", &warning));
  EXPECT_TRUE(warning.empty());
  std::string bad = write_temp("bad_profile.json", "{\"version\": 1, \"gemm_tflops\": 3}");
  EXPECT_FALSE(c.load_device_profile(bad, &warning));
  EXPECT_NE(warning.find(bad), std::string::npos);
  EXPECT_FALSE(c.contains("local"));
  std::string good = write_temp(
      "profile.json",
      R"({"version": 1, "gemm_tflops": {"f32": 1.5, "bf16": 3.0}, "mem_bw_gbs": 40, "mem_bytes": 16e9})");
  EXPECT_TRUE(c.load_device_profile(good, &warning)) << warning;
  EXPECT_DOUBLE_EQ(c.get("local").tflops_bf16, 3.0);
  EXPECT_DOUBLE_EQ(c.get("local").mem_gb, 16);
  fs::remove(bad);
  fs::remove(good);
  // One that `hetrain bench` made on another CPU is set aside, with the reason.
  std::string foreign =
      write_temp("foreign_profile.json",
                 R"({"version": 1, "cpu_model": "Some Other CPU 9000", "gemm_tflops": {"f32": 1.5},
          "mem_bw_gbs": 40, "mem_bytes": 16e9})");
  Catalog c2 = Catalog::load(catalog_path());
  EXPECT_FALSE(c2.load_device_profile(foreign, &warning));
  EXPECT_NE(warning.find("foreign: measured on '\"Some Other CPU 9000\"'"), std::string::npos)
      << warning;
  EXPECT_FALSE(c2.contains("local"));
  fs::remove(foreign);
}

TEST(PlanSearch, Gpt3On8A100DoesNotFitAndSaysWhy) {
  // The seed says "175B needs at least 8 A100 80GB". Model states alone are 16 bytes x
  // 174.6B = 2.79 TB; 8 x 80 GB is 640 GB, and even full offload needs 18 bytes/param of
  // host memory, more than the 8 GPUs' share of their node's.
  Catalog c = Catalog::load(catalog_path());
  Job j;
  j.model = preset("gpt3-175b");
  j.tokens = 300e9;
  j.global_batch = 1536;
  SearchOptions o;
  o.hardware = {"a100-80gb-sxm"};
  o.gpus = {8};
  SearchResult r = search(j, c, o);
  EXPECT_TRUE(r.plans.empty());
  ASSERT_EQ(r.rejected.size(), 1u);
  EXPECT_NE(r.rejected[0].reason.find("does not fit"), std::string::npos) << r.rejected[0].reason;
}

// (How long the search takes is bench/bench_plan's to measure, not a test's.)
TEST(PlanSearch, WholeCatalogRankedByCost) {
  Catalog c = Catalog::load(catalog_path());
  Job j;
  j.model = preset("gpt3-175b");
  j.tokens = 300e9;
  j.global_batch = 1536;
  SearchOptions o;
  o.deadline_days = 90;
  SearchResult r = search(j, c, o);
  ASSERT_GE(r.plans.size(), 2u);
  for (size_t i = 1; i < r.plans.size(); ++i)
    if (r.plans[i].priced) {
      EXPECT_LE(r.plans[i - 1].cost_usd, r.plans[i].cost_usd);
    }
  for (const auto& p : r.plans) {
    EXPECT_TRUE(p.fits);
    EXPECT_LE(p.train_days, 90);
  }
  // V100 has no bf16 path: rejected with that reason.
  bool v100 = false;
  for (const auto& x : r.rejected)
    if (x.hardware == "v100-sxm2-32gb") v100 = x.reason.find("bf16") != std::string::npos;
  EXPECT_TRUE(v100);
}

TEST(PlanSearch, BudgetAndDeadlineReject) {
  Catalog c = Catalog::load(catalog_path());
  Job j;
  j.model = preset("llama-7b");
  j.tokens = 1e12;
  j.global_batch = 512;
  SearchOptions o;
  o.hardware = {"h100-sxm"};
  o.budget_usd = 1000;
  SearchResult r = search(j, c, o);
  ASSERT_EQ(r.rejected.size(), 1u);
  EXPECT_NE(r.rejected[0].reason.find("over budget"), std::string::npos) << r.rejected[0].reason;
  o.budget_usd.reset();
  o.deadline_days = 0.01;
  r = search(j, c, o);
  ASSERT_EQ(r.rejected.size(), 1u);
  EXPECT_NE(r.rejected[0].reason.find("over deadline"), std::string::npos) << r.rejected[0].reason;
}

TEST(PlanCalibration, ReportsErrorAndCorrects) {
  Catalog c = Catalog::load(catalog_path());
  // Two runs: what does the model predict? Write "measured" times 25% slower.
  Job j;
  j.model = preset("gpt2-124m");
  j.global_batch = 8;
  j.tokens = 8 * 1024;
  Strategy s;
  s.micro_batch = 8;
  double t1 = evaluate(j, c.get("a100-80gb-sxm"), 1, s).time.step;
  s.micro_batch = 4;
  double t2 = evaluate(j, c.get("a100-80gb-sxm"), 1, s).time.step;
  std::string text = R"({"version": 1, "runs": [
    {"label": "a", "model": {"preset": "gpt2-124m"}, "hardware": "a100-80gb-sxm", "gpus": 1,
     "global_batch": 8, "micro_batch": 8, "step_time_s": )" +
                     std::to_string(1.25 * t1) + R"(},
    {"label": "b", "model": {"preset": "gpt2-124m"}, "hardware": "a100-80gb-sxm", "gpus": 1,
     "global_batch": 8, "micro_batch": 4, "step_time_s": )" +
                     std::to_string(1.25 * t2) + R"(}]})";
  std::string path = write_temp("runs.json", text);
  CalibrationReport rep = compare_measured(load_measured_runs(path), c);
  ASSERT_EQ(rep.runs.size(), 2u);
  EXPECT_NEAR(rep.runs[0].step_error, -0.2, 1e-3);
  EXPECT_NEAR(rep.mean_abs_step_error, 0.2, 1e-3);
  EXPECT_NEAR(rep.step_scale.at("a100-80gb-sxm"), 1.25, 1e-3);
  ASSERT_TRUE(rep.mean_abs_loo_error.has_value());
  EXPECT_LT(*rep.mean_abs_loo_error, 0.05);  // the compute-bound part scales; little else
  fs::remove(path);
  std::string bad = write_temp(
      "bad_runs.json",
      R"({"version": 1, "runs": [{"model": {"preset": "gpt2-124m"}, "hardware": "x"}]})");
  std::string e = error_of([&] { load_measured_runs(bad); });
  EXPECT_NE(e.find("runs[0]: 'gpus' must be a number"), std::string::npos) << e;
  fs::remove(bad);
}

TEST(PlanReport, JsonHasTheFieldsScriptsDependOn) {
  Catalog c = Catalog::load(catalog_path());
  Job j;
  j.model = preset("gpt2-124m");
  j.tokens = 10e9;
  j.global_batch = 512;
  Strategy s;
  s.micro_batch = 16;
  nlohmann::json p = to_json(evaluate(j, c.get("h100-sxm"), 8, s));
  for (const char* k : {"params", "flops_per_step", "fits", "step_time_s", "tokens_per_s",
                        "achieved_tflops_per_gpu", "mfu", "train_days", "gpu_hours", "cost_usd",
                        "hardware", "gpus", "strategy"})
    EXPECT_TRUE(p.contains(k)) << k;
  for (const char* k : {"weights", "gradients", "optimizer", "activations", "total"})
    EXPECT_TRUE(p["memory_per_gpu_bytes"].contains(k)) << k;
  EXPECT_EQ(p["params"].get<int64_t>(), 124'439'808);
  SearchOptions o;
  o.hardware = {"h100-sxm", "mi250x"};
  o.budget_usd = 1e6;
  nlohmann::json r = to_json(search(j, c, o));
  ASSERT_TRUE(r.contains("plans") && r.contains("rejected"));
  ASSERT_FALSE(r["plans"].empty());
  EXPECT_EQ(r["plans"][0]["hardware"], "h100-sxm");
  ASSERT_EQ(r["rejected"].size(), 1u);  // mi250x has no price: a budget cannot be checked
  EXPECT_EQ(r["rejected"][0]["hardware"], "mi250x");
  EXPECT_NE(r["rejected"][0]["reason"].get<std::string>().find("no price"), std::string::npos);
}

// The planner's descriptions of Hetrain's own mlp and cnn have the engine's parameter counts
// (`hetrain train` prints 535818 and 77754 for the fashion-mlp and fashion-cnn presets).
TEST(PlanModels, SmallModelsMatchTheEngine) {
  EXPECT_EQ(mlp_model(784, {512, 256}, 10).params(), 535818);
  EXPECT_EQ(small_resnet(1, 28, {16, 32, 64}, 1, 10).params(), 77754);
  // 2 x (784*512 + 512*256 + 256*10) multiply-adds
  EXPECT_DOUBLE_EQ(mlp_model(784, {512, 256}, 10).forward_flops_per_sample(),
                   2.0 * (784 * 512 + 512 * 256 + 256 * 10));
}

// Per-part calibration: runs "measured" with known part scales are fitted back, and a run
// left out is predicted from the others.
TEST(PlanCalibration, FitsPartScales) {
  Catalog c = Catalog::load(catalog_path());
  Hardware slow = c.get("a100-80gb-sxm");
  slow.part_scale = {2.0, 1.5, 1.0, 3.0};  // gemm, conv, attention, memory
  struct R {
    std::string model;
    ModelSpec spec;
    int64_t batch;
  };
  std::vector<R> runs = {
      {R"({"family": "mlp", "inputs": 784, "hidden": [512, 256], "classes": 10})",
       mlp_model(784, {512, 256}, 10), 128},
      {R"({"family": "mlp", "inputs": 784, "hidden": [2048, 2048], "classes": 10})",
       mlp_model(784, {2048, 2048}, 10), 512},
      {R"({"family": "resnet-small", "channels": 1, "image": 28, "widths": [16, 32, 64], "blocks": 1, "classes": 10})",
       small_resnet(1, 28, {16, 32, 64}, 1, 10), 128},
      {R"({"family": "resnet-small", "channels": 1, "image": 28, "widths": [64, 128, 256], "blocks": 2, "classes": 10})",
       small_resnet(1, 28, {64, 128, 256}, 2, 10), 256},
      {R"({"layers": 4, "hidden": 128, "heads": 4, "seq": 64, "vocab": 256})",
       gpt_model(4, 128, 4, 64, 256), 32},
      {R"({"layers": 12, "hidden": 768, "heads": 12, "seq": 1024, "vocab": 50257})",
       gpt_model(12, 768, 12, 1024, 50257), 8}};
  std::string text = R"({"version": 1, "runs": [)";
  for (size_t i = 0; i < runs.size(); ++i) {
    Job j;
    j.model = runs[i].spec;
    j.global_batch = runs[i].batch;
    j.tokens = static_cast<double>(runs[i].batch * j.model.tokens_per_sample());
    Strategy s;
    s.micro_batch = runs[i].batch;
    double t = evaluate(j, slow, 1, s).time.step;
    text += (i ? "," : "") + std::string(R"({"model": )") + runs[i].model +
            R"(, "hardware": "a100-80gb-sxm", "gpus": 1, "global_batch": )" +
            std::to_string(runs[i].batch) + R"(, "micro_batch": )" + std::to_string(runs[i].batch) +
            R"(, "step_time_s": )" + nlohmann::json(t).dump() + "}";
  }
  text += "]}";
  std::string path = write_temp("part_runs.json", text);
  CalibrationReport rep = compare_measured(load_measured_runs(path), c);
  fs::remove(path);
  ASSERT_EQ(rep.part_scale.count("a100-80gb-sxm"), 1u);
  const auto& sc = rep.part_scale.at("a100-80gb-sxm");
  EXPECT_NEAR(sc[0], 2.0, 0.2);
  EXPECT_NEAR(sc[1], 1.5, 0.15);
  EXPECT_NEAR(sc[3], 3.0, 0.3);
  ASSERT_TRUE(rep.mean_abs_loo_error.has_value());
  EXPECT_LT(*rep.mean_abs_loo_error, 0.10);
  EXPECT_GT(rep.mean_abs_step_error, 0.3);  // uncalibrated, the model is well off
  // calibrated() carries the fitted scales into the catalog.
  Catalog cal = calibrated(c, rep);
  EXPECT_NEAR(cal.get("a100-80gb-sxm").part_scale[3], sc[3], 1e-12);
}

// The `local` device's engine-measured rates: a GEMM grid, convolutions by shape, the attention
// core, elementwise and batch-norm curves (hetrain bench writes them; docs/PLANNING.md).
TEST(PlanLocal, GemmGridInterpolatesInLogSpaceAndExtrapolatesAsDocumented) {
  GemmGrid g;
  g.m = g.n = {100, 400};
  g.k = {100, 400};
  // m-major: the first four shapes have m = 100 and run at 1, the last four (m = 400) at 4.
  g.rates = {1, 1, 1, 1, 4, 4, 4, 4};
  EXPECT_DOUBLE_EQ(g.at(100, 100, 100), 1.0);
  EXPECT_DOUBLE_EQ(g.at(400, 100, 400), 4.0);
  EXPECT_NEAR(g.at(200, 250, 300), 2.0, 1e-12);  // halfway in log m: geometric mean of 1 and 4
  EXPECT_NEAR(g.at(800, 100, 100), 4.0, 1e-12);  // above the grid: the largest size's rate
  EXPECT_NEAR(g.at(25, 100, 50), 1.0 / 4 / 2, 1e-12);  // below: in proportion to each dim
}

TEST(PlanLocal, ConvRateIsTheNearestMeasuredShapeOfThatKernel) {
  std::vector<ConvRate> rates = {{3, 1, 16, 16, 28, 40},
                                 {3, 1, 64, 64, 7, 60},
                                 {3, 2, 16, 32, 14, 30},
                                 {1, 2, 16, 32, 14, 10}};
  ConvLayer l{ConvLayer::Kind::conv, 16, 16, 3, 1, 28, 28, false, 0};
  EXPECT_DOUBLE_EQ(conv_rate_gflops(rates, l), 40);  // a measured shape: its rate
  l = {ConvLayer::Kind::conv, 16, 32, 3, 2, 14, 14, false, 0};
  EXPECT_DOUBLE_EQ(conv_rate_gflops(rates, l), 30);  // stride 2 uses the stride-2 entry only
  // Halfway (in log channels and log size) between the two stride-1 entries: their geometric mean.
  l = {ConvLayer::Kind::conv, 32, 32, 3, 1, 14, 14, false, 0};
  EXPECT_NEAR(conv_rate_gflops(rates, l), std::sqrt(40.0 * 60.0), 1e-9);
  l = {ConvLayer::Kind::conv, 16, 16, 7, 2, 14, 14, false, 0};
  EXPECT_EQ(conv_rate_gflops(rates, l), 0);  // no 7x7 measured: the GEMM model stands in
  l = {ConvLayer::Kind::conv, 16, 32, 1, 1, 28, 28, false, 0};
  EXPECT_DOUBLE_EQ(conv_rate_gflops(rates, l), 10);  // 1x1 stride 1: the 1x1 entry of stride 2
}

TEST(PlanLocal, ProfileRatesReachTheStepTime) {
  const std::string base =
      R"({"version": 1, "gemm_tflops": {"f32": 0.1}, "mem_bw_gbs": 10, "mem_bytes": 16e9,
          "gemm_f32_curve": [[64, 20], [2048, 100]])";
  auto load = [&](const std::string& extra) { return load_local(base + extra + "}"); };
  Job job;
  job.model = small_resnet(1, 28, {16, 32}, 1, 10);
  job.global_batch = 64;
  job.tokens = 6400;
  job.precision = Precision::fp32;
  Strategy s;
  s.micro_batch = 64;
  auto compute = [&](const Hardware& h) {
    Plan p = evaluate(job, h, 1, s);
    return p.time.compute;
  };
  // Every conv measured at 50 GFLOP/s, the norms at 1 GB/s, elementwise work at 10 GB/s.
  const std::string convs =
      R"(, "conv_f32_rates": [{"kernel": 3, "stride": 1, "in": 16, "out": 16, "out_hw": 28, "gflops": 50},
                              {"kernel": 3, "stride": 2, "in": 16, "out": 32, "out_hw": 14, "gflops": 50},
                              {"kernel": 1, "stride": 2, "in": 16, "out": 32, "out_hw": 14, "gflops": 50}],
         "norm_f32_curve": [[1e3, 1], [1e9, 1]], "stream_f32_curve": [[1e3, 10], [1e9, 10]])";
  const Hardware measured = load(convs);
  // Expected: conv FLOPs x 3 at 50 GFLOP/s (x 2 for the stem: no gradient for the images) +
  // batch-norm tensors (f32) x 1 s/GB + the residual add/ReLU (2 tensors forward, 1.5x that
  // backward) at 10 GB/s + the linear head from the curve.
  double conv_flops = 0, norm_bytes = 0, act_bytes = 0, stem_flops = -1;
  for (const auto& l : job.model.conv.layers) {
    const double px = 64.0 * l.out_h * l.out_w;
    if (l.kind == ConvLayer::Kind::conv) {
      conv_flops += 2 * px * l.out * l.in * l.kernel * l.kernel;
      if (stem_flops < 0) stem_flops = conv_flops;
    }
    if (l.kind == ConvLayer::Kind::batchnorm) norm_bytes += 4 * px * l.out;
    if (l.kind == ConvLayer::Kind::activation) act_bytes += 2 * 4 * px * l.out;
  }
  const double head = compute(load(
      R"(, "conv_f32_rates": [{"kernel": 3, "stride": 1, "in": 16, "out": 16, "out_hw": 28, "gflops": 1e12},
       {"kernel": 1, "stride": 1, "in": 16, "out": 16, "out_hw": 28, "gflops": 1e12}],
       "norm_f32_curve": [[1e3, 1e12]], "stream_f32_curve": [[1e3, 1e12]])"));
  const double expected =
      (3 * conv_flops - stem_flops) / 50e9 + norm_bytes / 1e9 + 2.5 * act_bytes / 10e9 + head;
  EXPECT_NEAR(compute(measured), expected, 1e-3 * expected);
  // Twice the conv rate: the conv share halves.
  std::string faster = convs;
  for (size_t at; (at = faster.find("\"gflops\": 50")) != std::string::npos;)
    faster.replace(at, 12, "\"gflops\": 100");
  EXPECT_NEAR(compute(measured) - compute(load(faster)),
              (1.5 * conv_flops - 0.5 * stem_flops) / 50e9, 1e-3 * expected);
}

namespace {
/// The compute time of one f32 step of `model` (an MLP or conv net) on `batch` images, one device.
double mlp_step_compute(const Hardware& h, const ModelSpec& model, int64_t batch) {
  Job job;
  job.model = model;
  job.global_batch = batch;
  job.tokens = static_cast<double>(batch);
  job.precision = Precision::fp32;
  Strategy s;
  s.micro_batch = batch;
  return evaluate(job, h, 1, s).time.compute;
}
}  // namespace

TEST(PlanLocal, FirstLayerHasNoInputGradient) {
  // An MLP at a flat 100 GFLOP/s with free memory traffic: forward F, backward 2F less the
  // input gradient of the first layer, which reads the images (the engine never computes it).
  const Hardware h = load_local(
      R"({"version": 1, "gemm_tflops": {"f32": 0.1}, "mem_bw_gbs": 1e9, "mem_bytes": 16e9,
          "gemm_f32_curve": [[1, 100], [100000, 100]], "stream_f32_curve": [[1, 1e9], [1e12, 1e9]]})");
  const double first = 2.0 * 128 * 784 * 512;
  const double all = first + 2.0 * 128 * (512 * 256 + 256 * 10);
  EXPECT_NEAR(mlp_step_compute(h, mlp_model(784, {512, 256}, 10), 128), (3 * all - first) / 100e9,
              1e-3 * all / 100e9);
}

TEST(PlanLocal, BackwardGemmsRunAtTheirOwnShapes) {
  // A measured grid where a GEMM whose inner size is the batch (128) runs at half the rate of
  // one whose inner size is 1024. MLP 1024 -> 1024 -> 1024, batch 128, F FLOPs per layer:
  // forward F/100 twice; backward the first layer's weight gradient (1024 x 1024, inner 128)
  // F/50, the second's input gradient (128 x 1024, inner 1024) F/100 and weight gradient F/50.
  const Hardware h = load_local(
      R"({"version": 1, "gemm_tflops": {"f32": 0.1}, "mem_bw_gbs": 1e9, "mem_bytes": 16e9,
          "gemm_f32_curve": [[1, 100], [100000, 100]], "stream_f32_curve": [[1, 1e9], [1e12, 1e9]],
          "gemm_f32_grid": {"m": [128, 1024], "n": [128, 1024], "k": [128, 1024],
                            "gflops": [50, 100, 50, 100, 50, 100, 50, 100]}})");
  const double F = 2.0 * 128 * 1024 * 1024;
  EXPECT_NEAR(mlp_step_compute(h, mlp_model(1024, {1024}, 1024), 128), F * (2 + 2 + 1 + 2) / 100e9,
              1e-3 * F / 100e9);
}

TEST(PlanLocal, LayerElementwiseRateReachesTheGptStepTime) {
  // A GPT whose elementwise passes are charged at the measured layer rate: 1 GB/s against
  // 2 GB/s takes exactly those bytes' time more, forward and backward, on every layer.
  const std::string base =
      R"({"version": 1, "gemm_tflops": {"f32": 0.1}, "mem_bw_gbs": 10, "mem_bytes": 16e9,
          "gemm_f32_curve": [[64, 20], [2048, 100]], "layer_f32_curve": )";
  auto load = [&](const std::string& curve) { return load_local(base + curve + "}"); };
  Job job;
  job.model = gpt_model(4, 128, 4, 64, 256);
  job.global_batch = 32;
  job.tokens = 32 * 64;
  job.precision = Precision::fp32;
  Strategy s;
  s.micro_batch = 32;
  const double slow = evaluate(job, load("[[1e3, 1], [1e12, 1]]"), 1, s).time.compute;
  const double fast = evaluate(job, load("[[1e3, 2], [1e12, 2]]"), 1, s).time.compute;
  const ElementwisePasses e = transformer_elementwise_passes(job.model.tf, 1, false);
  const double bytes = 4.0 * job.model.tf.layers * 32 * 64 * (e.forward + e.backward);
  EXPECT_NEAR(slow - fast, bytes / 1e9 - bytes / 2e9, 1e-6 * slow);
}

TEST(PlanTime, ElementwisePassesCountTheLayersOps) {
  // GPT-2 (GELU 4h MLP, biases): forward 2 norms x 2 + 2 residual adds x 3 + GELU 2 x 4h + bias
  // adds 2 x (3h + h + 4h + h) = 36h; backward norms 2 x 3 + residual sums 2 x 3 + GELU 3 x 4h
  // + bias sums (3h + h + 4h + h) = 33h; dropout adds 2 x 3h each way.
  TransformerSpec gpt = gpt_model(4, 128, 4, 64, 256).tf;
  gpt.dropout = false;
  ElementwisePasses e = transformer_elementwise_passes(gpt, 1, false);
  EXPECT_DOUBLE_EQ(e.forward, 36 * 128);
  EXPECT_DOUBLE_EQ(e.backward, 33 * 128);
  gpt.dropout = true;
  e = transformer_elementwise_passes(gpt, 1, false);
  EXPECT_DOUBLE_EQ(e.forward, 42 * 128);
  EXPECT_DOUBLE_EQ(e.backward, 39 * 128);
  // LLaMA-style (SwiGLU of f, no biases, no dropout), tp 2 with sequence parallelism: every
  // width halves. Forward 4h + 6h + 3f, backward 6h + 6h + 5f.
  TransformerSpec llama = gpt;
  llama.mlp = MlpKind::swiglu, llama.bias = false, llama.dropout = false, llama.ffn_hidden = 344;
  e = transformer_elementwise_passes(llama, 2, true);
  EXPECT_DOUBLE_EQ(e.forward, (10 * 128 + 3 * 344) / 2.0);
  EXPECT_DOUBLE_EQ(e.backward, (12 * 128 + 5 * 344) / 2.0);
  // Without sequence parallelism the (tokens x hidden) passes stay whole on each device.
  e = transformer_elementwise_passes(llama, 2, false);
  EXPECT_DOUBLE_EQ(e.forward, 10 * 128 + 3 * 344 / 2.0);
}

TEST(PlanLocal, MalformedMeasuredRatesAreNamedAndTheProfileSkipped) {
  const std::string base =
      R"({"version": 1, "gemm_tflops": {"f32": 0.1}, "mem_bw_gbs": 10, "mem_bytes": 16e9, )";
  for (
      auto [extra, field] : std::vector<std::pair<std::string, std::string>>{
          {R"("gemm_f32_grid": {"m": [1, 2], "n": [1], "k": [1], "gflops": [5]})", "gemm_f32_grid"},
          {R"("gemm_f32_grid": {"m": [2, 1], "n": [1], "k": [1], "gflops": [5, 5]})",
           "strictly increasing"},
          {R"("conv_f32_rates": [{"kernel": 3, "stride": 0, "in": 1, "out": 1, "out_hw": 1, "gflops": 1}])",
           "'stride'"},
          {R"("stream_f32_curve": [[1, 2], [1, 3]])", "two entries"},
          {R"("norm_f32_curve": [[1, -2]])", "norm_f32_curve"}}) {
    std::string path = write_temp("bad_local.json", base + extra + "}");
    Catalog c;
    std::string warning;
    EXPECT_FALSE(c.load_device_profile(path, &warning)) << extra;
    EXPECT_NE(warning.find(field), std::string::npos) << warning;
    EXPECT_FALSE(c.contains("local"));
    fs::remove(path);
  }
}
