// The profiler: the FLOPs and bytes it records equal the analytic formulas, its Chrome trace
// is well formed (positive durations, every node inside its step), and on one thread the
// per-primitive times add up to the measured step time.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>

#include "hetrain/base/error.h"
#include "hetrain/base/thread_pool.h"
#include "hetrain/graph/ops.h"
#include "hetrain/insight/profiler.h"
#include "hetrain/insight/report.h"
#include "hetrain/memory/allocator.h"
#include "hetrain/training/trainer.h"

namespace hetrain::insight {
namespace {

/// Runs fn with the profiler on and returns the single event of primitive `name`.
template <class F>
NodeEvent profile_one(const char* name, F&& fn) {
  Profiler prof;
  prof.start();
  fn();
  prof.stop();
  const NodeEvent* found = nullptr;
  for (const auto& e : prof.nodes()) {
    if (e.primitive != name) continue;
    EXPECT_EQ(found, nullptr) << "more than one " << name << " node";
    found = &e;
  }
  if (!found) {
    ADD_FAILURE() << "no " << name << " node recorded";
    return {};
  }
  EXPECT_GE(found->end_ns, found->start_ns);
  EXPECT_EQ(found->device.kind, DeviceKind::cpu);
  return *found;
}

TEST(ProfilerCost, MatmulIs2MNK) {
  const double M = 33, K = 20, N = 17, B = 3;
  Generator g(1);
  Tensor a = randn({3, 33, 20}, Dtype::f32, g).eval(), b = randn({20, 17}, Dtype::f32, g).eval();
  NodeEvent e = profile_one("matmul", [&] { matmul(a, b).eval(); });
  EXPECT_DOUBLE_EQ(e.flops, 2 * B * M * N * K);
  EXPECT_DOUBLE_EQ(e.bytes_read, 4 * (B * M * K + K * N));
  EXPECT_DOUBLE_EQ(e.bytes_written, 4 * B * M * N);
  EXPECT_EQ(e.dtype, Dtype::f32);
  // matmul folds the batch of a 3-D operand against a 2-D weight into the rows.
  EXPECT_EQ(e.shapes, "f32[99,20] f32[20,17] -> f32[99,17]");
}

TEST(ProfilerCost, Conv2dIs2NOHoWoCKhKw) {
  // x (2, 3, 11, 9), w (5, 3, 3, 2), stride (2, 1), padding (1, 0):
  // Ho = (11 + 2 - 3) / 2 + 1 = 6, Wo = (9 - 2) / 1 + 1 = 8.
  const double N = 2, C = 3, H = 11, W = 9, O = 5, kh = 3, kw = 2, Ho = 6, Wo = 8;
  Generator g(2);
  Tensor x = randn({2, 3, 11, 9}, Dtype::f32, g).eval();
  Tensor w = randn({5, 3, 3, 2}, Dtype::f32, g).eval(), bias = randn({5}, Dtype::f32, g).eval();
  NodeEvent e = profile_one("conv2d", [&] { conv2d(x, w, bias, {2, 1}, {1, 0}).eval(); });
  EXPECT_DOUBLE_EQ(e.flops, 2 * N * O * Ho * Wo * C * kh * kw);
  EXPECT_DOUBLE_EQ(e.bytes_read, 4 * (N * C * H * W + O * C * kh * kw + O));
  EXPECT_DOUBLE_EQ(e.bytes_written, 4 * N * O * Ho * Wo);
}

TEST(ProfilerCost, AttentionIsTwoGemmsPlusSoftmax) {
  // q k^T: 2 L S E; softmax: 4 L S (max, exp, sum, scale); p v: 2 L S Ev; per batch x head.
  const double B = 2, Hh = 3, L = 7, S = 7, E = 8, Ev = 8;
  Generator g(3);
  Tensor q = randn({2, 3, 7, 8}, Dtype::f32, g).eval(),
         k = randn({2, 3, 7, 8}, Dtype::f32, g).eval(),
         v = randn({2, 3, 7, 8}, Dtype::f32, g).eval();
  NodeEvent full =
      profile_one("sdpa", [&] { scaled_dot_product_attention(q, k, v, false).eval(); });
  EXPECT_DOUBLE_EQ(full.flops, B * Hh * L * S * (2 * E + 4 + 2 * Ev));
  EXPECT_DOUBLE_EQ(full.bytes_read, 4 * (3 * B * Hh * L * E));
  // Outputs: o (B, H, L, Ev) and the f32 log-sum-exp per row (B, H, L).
  EXPECT_DOUBLE_EQ(full.bytes_written, 4 * (B * Hh * L * Ev + B * Hh * L));
  // Causal: row i sees i + 1 keys, L (L + 1) / 2 pairs.
  NodeEvent causal =
      profile_one("sdpa", [&] { scaled_dot_product_attention(q, k, v, true).eval(); });
  EXPECT_DOUBLE_EQ(causal.flops, B * Hh * (L * (L + 1) / 2) * (2 * E + 4 + 2 * Ev));
}

TEST(ProfilerCost, LayerNormIs8FlopsPerElement) {
  // Per row of C: mean C, variance 3C (sub, square, add), normalise 2C, affine 2C.
  const double R = 12, C = 40;
  Generator g(4);
  Tensor x = randn({3, 4, 40}, Dtype::f32, g).eval(), w = randn({40}, Dtype::f32, g).eval(),
         b = randn({40}, Dtype::f32, g).eval();
  NodeEvent e = profile_one("layer_norm", [&] { layer_norm(x, {40}, w, b).eval(); });
  EXPECT_DOUBLE_EQ(e.flops, 8 * R * C);
  EXPECT_DOUBLE_EQ(e.bytes_read, 4 * (R * C + 2 * C));
  // y and the saved (mean, rstd) per row in f32.
  EXPECT_DOUBLE_EQ(e.bytes_written, 4 * (R * C + 2 * R));
}

TEST(Profiler, OffByDefaultAndOneAtATime) {
  Generator g(5);
  Tensor a = randn({4, 4}, Dtype::f32, g).eval();
  Profiler p1;
  (a + a).eval();
  EXPECT_TRUE(p1.nodes().empty());
  EXPECT_TRUE(p1.memory().empty());
  p1.start();
  Profiler p2;
  EXPECT_THROW(p2.start(), Error);
  (a * a).eval();
  p1.stop();
  (a - 1.0).eval();
  ASSERT_EQ(p1.nodes().size(), 1u);
  EXPECT_EQ(p1.nodes()[0].primitive, "mul");
  // The output buffer's allocation was seen by the memory timeline.
  ASSERT_FALSE(p1.memory().empty());
  EXPECT_GE(p1.memory().back().total, 64);
  p2.start();  // free again once p1 stopped
  p2.stop();
}

// A few steps of a small GPT through the trainer, profiled as `hetrain profile` does.
struct ProfiledRun {
  Profiler prof;
  training::TrainResult result;
};

void profile_gpt(ProfiledRun& run, int threads, int64_t warmup, int64_t steps) {
  training::TrainConfig cfg = training::preset_config("gpt-mini");
  for (auto [k, v] : {std::pair{"layers", "2"},
                      {"width", "128"},
                      {"heads", "4"},
                      {"context", "64"},
                      {"batch-size", "16"}})
    training::apply_setting(cfg, k, v, "test");
  cfg.threads = threads;
  cfg.steps = warmup + steps;
  cfg.progress = false;
  cfg.final_eval = false;
  training::StepHooks hooks;
  hooks.begin = [&](int64_t s) {
    if (s < warmup) return;
    if (s == warmup) run.prof.start();
    run.prof.begin_step(s);
  };
  hooks.end = [&](int64_t s, double loss) {
    if (s < warmup) return;
    run.prof.end_step(loss);
  };
  run.result = training::train(cfg, hooks);
  run.prof.stop();
}

TEST(Profiler, ChromeTraceParsesAndNodesNestInSteps) {
  ProfiledRun run;
  profile_gpt(run, 2, 1, 2);
  const nlohmann::json trace = nlohmann::json::parse(run.prof.chrome_trace().dump());
  ASSERT_TRUE(trace.contains("traceEvents"));
  struct Span {
    double ts, end;
  };
  std::map<std::pair<int, int64_t>, Span> steps;  // (tid, step) -> span
  int nodes = 0, counters = 0, names = 0;
  for (const auto& e : trace["traceEvents"]) {
    const std::string ph = e.at("ph");
    if (ph == "X") {
      EXPECT_GT(e.at("dur").get<double>(), 0) << e.dump();
      if (e.at("cat") == "step")
        steps[{e.at("tid").get<int>(), e["args"]["step"].get<int64_t>()}] = {
            e["ts"].get<double>(), e["ts"].get<double>() + e["dur"].get<double>()};
    } else if (ph == "C") {
      ++counters;
      EXPECT_TRUE(e["args"].contains("activations"));
      EXPECT_TRUE(e["args"].contains("parameters"));
    } else if (ph == "M") {
      ++names;
    }
  }
  EXPECT_EQ(steps.size() >= 2, true);
  for (const auto& e : trace["traceEvents"]) {
    if (e.at("ph") != "X" || e.at("cat") != "node") continue;
    ++nodes;
    const auto it = steps.find({e.at("tid").get<int>(), e["args"]["step"].get<int64_t>()});
    ASSERT_NE(it, steps.end()) << "node outside any step on its track: " << e.dump();
    const double ts = e["ts"].get<double>(), end = ts + e["dur"].get<double>();
    EXPECT_GE(ts, it->second.ts) << e.dump();
    EXPECT_LE(end, it->second.end + 1e-3) << e.dump();
    EXPECT_TRUE(e["args"].contains("flops"));
    EXPECT_TRUE(e["args"].contains("bytes_read"));
    EXPECT_TRUE(e["args"].contains("bytes_written"));
  }
  EXPECT_EQ(static_cast<size_t>(nodes), run.prof.nodes().size());
  EXPECT_GT(nodes, 100);
  EXPECT_GT(counters, 10);
  EXPECT_GE(names, 2);  // process and at least one thread name
  // Each step's loss is the trainer's.
  ASSERT_EQ(run.prof.steps().size(), 2u);
  EXPECT_DOUBLE_EQ(run.prof.steps().back().loss, run.result.train_loss);
}

TEST(Profiler, PrimitiveTimesAddUpToStepTimeOnOneThread) {
  ProfiledRun run;
  profile_gpt(run, 1, 1, 3);
  const double step_s = run.prof.step_seconds();
  double sum = 0;
  int64_t calls = 0;
  for (const auto& s : run.prof.summary()) sum += s.total_s, calls += s.calls;
  EXPECT_EQ(calls, static_cast<int64_t>(run.prof.nodes().size()));
  EXPECT_EQ(run.prof.workers(), 1);
  std::printf("node time / step time = %.3f\n", sum / step_s);
  // Graph building, autodiff and the optimizer's bookkeeping are the rest of the step.
  EXPECT_NEAR(sum / step_s, 1.0, 0.10) << "nodes " << sum << " s, steps " << step_s << " s";
  // The summary agrees with the trainer's own step clock.
  double trainer_s = 0;
  for (size_t i = 1; i < run.result.step_seconds.size(); ++i)
    trainer_s += run.result.step_seconds[i];
  EXPECT_NEAR(step_s, trainer_s, 0.05 * trainer_s);
  set_num_threads(0);
}

TEST(Profiler, SummarySplitsAPrimitiveByComputeDtype) {
  // The same GEMM in f32 and in bf16, whose result is cast back to f32 as autocast does: two
  // rows, each with its own calls and FLOPs, the bf16 one labelled with its dtype. The cast
  // may be fused into the GEMM's node; the GEMM's operands still say what it computed in.
  Generator g(9);
  Tensor a = randn({16, 32}, Dtype::f32, g).eval(), b = randn({32, 8}, Dtype::f32, g).eval();
  Tensor a16 = cast(a, Dtype::bf16).eval(), b16 = cast(b, Dtype::bf16).eval();
  Profiler prof;
  prof.start();
  matmul(a, b).eval();
  cast(matmul(a16, b16), Dtype::f32).eval();
  prof.stop();
  const double gemm_flops = 2.0 * 16 * 32 * 8;
  std::map<std::pair<std::string, Dtype>, PrimitiveSummary> rows;
  for (const auto& s : prof.summary()) {
    EXPECT_TRUE(rows.emplace(std::make_pair(s.name, s.dtype), s).second)
        << s.label() << " appears twice";
  }
  ASSERT_TRUE(rows.count({"matmul", Dtype::f32}));
  const PrimitiveSummary& s32 = rows[{"matmul", Dtype::f32}];
  EXPECT_EQ(s32.calls, 1);
  EXPECT_DOUBLE_EQ(s32.flops, gemm_flops);
  EXPECT_EQ(s32.label(), "matmul");
  const bool fused = rows.count({"fused_epilogue", Dtype::bf16}) > 0;
  const std::string bf16_gemm = fused ? "fused_epilogue" : "matmul";
  ASSERT_TRUE(rows.count({bf16_gemm, Dtype::bf16})) << "no bf16 GEMM row";
  const PrimitiveSummary& s16 = rows[{bf16_gemm, Dtype::bf16}];
  EXPECT_EQ(s16.calls, 1);
  EXPECT_GE(s16.flops, gemm_flops);
  EXPECT_EQ(s16.label(), bf16_gemm + " bf16");
  // The node event keeps both: the output's dtype and the one it computed in.
  for (const auto& e : prof.nodes()) {
    if (e.primitive == bf16_gemm && e.compute_dtype == Dtype::bf16) {
      EXPECT_EQ(e.dtype, fused ? Dtype::f32 : Dtype::bf16);
    }
  }
}

TEST(Profiler, SummarizeKeysByNameAndDtype) {
  NodeEvent f32;
  f32.primitive = "fused_epilogue";
  f32.end_ns = 1000;
  f32.flops = 10;
  NodeEvent bf16 = f32;
  bf16.compute_dtype = Dtype::bf16;
  bf16.end_ns = 3000;
  auto v = summarize({f32, bf16, bf16});
  ASSERT_EQ(v.size(), 2u);
  EXPECT_EQ(v[0].label(), "fused_epilogue bf16");  // longest first
  EXPECT_EQ(v[0].calls, 2);
  EXPECT_DOUBLE_EQ(v[0].flops, 20);
  EXPECT_EQ(v[1].label(), "fused_epilogue");
  EXPECT_EQ(v[1].dtype, Dtype::f32);
  EXPECT_EQ(v[1].calls, 1);
}

TEST(Roofline, RowsClassifyAgainstTheRidgePoint) {
  DeviceProfile d;
  d.fma_peak_gflops = 100;
  d.mem_bw_gbs = 10;                                        // ridge at 10 FLOP/byte
  PrimitiveSummary gemm{"matmul", 1, 1.0, 50e9, 1e9, 1e9};  // 25 FLOP/B, 50 GFLOP/s
  PrimitiveSummary add{"add", 1, 1.0, 1e9, 8e9, 4e9};       // 1/12 FLOP/B, 12 GB/s
  auto rows = roofline_rows({gemm, add}, 4.0, d);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_TRUE(rows[0].compute_bound);
  EXPECT_DOUBLE_EQ(rows[0].attainable_gflops, 100);
  EXPECT_DOUBLE_EQ(rows[0].of_roofline, 0.5);
  EXPECT_DOUBLE_EQ(rows[0].percent_of_step, 25);
  EXPECT_FALSE(rows[1].compute_bound);
  EXPECT_NEAR(rows[1].attainable_gflops, 10.0 / 12, 1e-12);
  EXPECT_NEAR(rows[1].of_roofline, 1.2, 1e-12);
}

// A CPU whose bf16 GEMMs run on AMX: f32 FMA peak 100, AMX peak 1000 GFLOP/s.
DeviceProfile amx_device() {
  DeviceProfile d;
  d.fma_peak_gflops = 100;
  d.mem_bw_gbs = 10;  // FMA ridge at 10 FLOP/byte, the AMX one at 100
  d.gemm_bf16_impl = "brg:avx512_core_amx_bf16";
  d.bf16_isa = "amx-bf16";
  d.bf16_peak_gflops = 1000;
  return d;
}

TEST(Roofline, Bf16GemmsAreBoundedByTheBf16UnitsCeiling) {
  const DeviceProfile d = amx_device();
  // Both at 50 FLOP/byte: past the FMA ridge, short of the AMX one.
  PrimitiveSummary bf16{"fused_epilogue", 2, 1.0, 500e9, 6e9, 4e9, Dtype::bf16};   // 500 GFLOP/s
  PrimitiveSummary f32{"fused_epilogue", 2, 1.0, 50e9, 0.6e9, 0.4e9, Dtype::f32};  // 50 GFLOP/s
  PrimitiveSummary add{"add", 1, 1.0, 1e9, 8e9, 4e9, Dtype::bf16};  // not a GEMM: FMA peak
  auto rows = roofline_rows({bf16, f32, add}, 4.0, d);
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_DOUBLE_EQ(rows[0].ceiling_gflops, 1000);
  EXPECT_DOUBLE_EQ(rows[0].attainable_gflops, 500);  // 50 FLOP/B x 10 GB/s
  EXPECT_DOUBLE_EQ(rows[0].of_roofline, 1.0);        // 5.0 against the FMA peak
  EXPECT_FALSE(rows[0].compute_bound);
  EXPECT_DOUBLE_EQ(rows[1].ceiling_gflops, 100);
  EXPECT_DOUBLE_EQ(rows[1].attainable_gflops, 100);
  EXPECT_DOUBLE_EQ(rows[1].of_roofline, 0.5);
  EXPECT_TRUE(rows[1].compute_bound);
  EXPECT_DOUBLE_EQ(rows[2].ceiling_gflops, 100);
  for (const char* conv : {"conv2d", "conv2d_backward_input", "conv2d_backward_weight", "matmul"})
    EXPECT_DOUBLE_EQ(compute_ceiling_gflops(d, conv, Dtype::bf16), 1000) << conv;
  EXPECT_DOUBLE_EQ(compute_ceiling_gflops(d, "matmul", Dtype::f16), 100);
  EXPECT_DOUBLE_EQ(compute_ceiling_gflops(d, "sdpa", Dtype::bf16), 100);

  // The table names the dtype and the header the ceiling; f32 rows keep their bare names.
  const std::string table = format_table(rows, 4.0, 1);
  EXPECT_NE(table.find("fused_epilogue bf16 "), std::string::npos) << table;
  EXPECT_NE(table.find("\nfused_epilogue  "), std::string::npos) << table;
  EXPECT_EQ(ceilings_text(rows, d),
            "FMA peak 100.0 GFLOP/s, bf16 GEMM ceiling 1000.0 GFLOP/s (amx-bf16)");
}

TEST(Roofline, ProfilesWithoutABf16GemmMeasurementUseTheFmaPeak) {
  PrimitiveSummary bf16{"matmul", 1, 1.0, 50e9, 0.6e9, 0.4e9, Dtype::bf16};
  DeviceProfile old = amx_device();
  old.gemm_bf16_impl.clear();  // a profile cached before bf16 GEMMs were recorded
  DeviceProfile no_amx_loop = amx_device();
  no_amx_loop.bf16_isa = "avx512-bf16";  // oneDNN on AMX, but the AMX peak loop did not run
  for (const DeviceProfile& d : {old, no_amx_loop}) {
    auto rows = roofline_rows({bf16}, 1.0, d);
    ASSERT_EQ(rows.size(), 1u);
    EXPECT_DOUBLE_EQ(rows[0].ceiling_gflops, 100);
    EXPECT_DOUBLE_EQ(rows[0].of_roofline, 0.5);
    EXPECT_EQ(ceilings_text(rows, d), "FMA peak 100.0 GFLOP/s");
  }
}

}  // namespace
}  // namespace hetrain::insight
