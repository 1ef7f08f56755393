// What `hetrain profile` shows: the per-primitive table against the measured roofline, its
// JSON form, and a self-contained HTML report whose charts (roofline, time breakdown, memory
// timeline by tag, loss curve) are inline SVG drawn here.
//
//   auto rows = hetrain::insight::roofline_rows(prof.summary(), prof.step_seconds(), device);
//   std::string html = hetrain::insight::render_html_report({.title = "gpt-mini", ...});
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "hetrain/insight/device_profile.h"
#include "hetrain/insight/profiler.h"

namespace hetrain::insight {

/// The compute ceiling (GFLOP/s per CPU second) of the unit that ran `primitive` in `dtype`:
/// for GEMM-like primitives (matmul, convolutions, a fused epilogue on either) the GEMM path's
/// (DeviceProfile::gemm_ceiling_gflops: the AMX or AVX512-BF16 peak for bf16 where oneDNN ran
/// bf16 on it), for all others the f32 FMA peak. The FMA peak too where the profile has no
/// measurement of the bf16 unit (a profile from before bf16 GEMMs were recorded).
double compute_ceiling_gflops(const DeviceProfile& device, const std::string& primitive,
                              Dtype dtype);

/// One primitive in one compute dtype against the roofline of the device profile.
struct RooflineRow {
  PrimitiveSummary s;
  double percent_of_step = 0;    // total time / summed step wall time
  double ceiling_gflops = 0;     // compute_ceiling_gflops(device, s.name, s.dtype)
  double attainable_gflops = 0;  // min(ceiling, intensity x triad bandwidth)
  double of_roofline = 0;        // achieved / attainable (0 for primitives without FLOPs)
  bool compute_bound = false;    // intensity at or beyond the ridge point of its ceiling
};

/// Rows in the order of `summary` (longest first).
std::vector<RooflineRow> roofline_rows(const std::vector<PrimitiveSummary>& summary,
                                       double step_seconds, const DeviceProfile& device);

/// The roofline's ceilings for `hetrain profile`'s header: "FMA peak 478.0 GFLOP/s", followed
/// by "bf16 GEMM ceiling 7405.2 GFLOP/s (amx-bf16)" where a row is bounded by it.
std::string ceilings_text(const std::vector<RooflineRow>& rows, const DeviceProfile& device);

/// The table as printed by `hetrain profile`.
std::string format_table(const std::vector<RooflineRow>& rows, double step_seconds, int steps);

struct ReportInput {
  std::string title;    // e.g. "gpt-mini"
  std::string command;  // the command line that produced it
  std::string config;   // settings, one per line
  const Profiler* profiler = nullptr;
  DeviceProfile device;
  std::vector<RooflineRow> rows;
  std::vector<std::pair<int64_t, double>> losses;  // (step, loss) of every step run
  double load_average = -1;  // 1-minute load average after the run (-1: unknown)
};

/// The `--json` document: device ceilings, steps, and one record per primitive.
nlohmann::json profile_json(const ReportInput& in);

/// One point of a depth sweep (`hetrain profile --sweep-layers`): the activations peak of a
/// step as the allocator measured it and as the memory model predicted it from the graph.
struct DepthPoint {
  std::string mode;  // the --recompute mode
  int64_t layers = 0;
  int64_t measured = 0, predicted = 0;  // bytes
};

/// Activations peak against depth, one colour per recompute mode (measured: solid line and
/// dots; predicted: dashed): a standalone SVG with id activation-depth.
std::string render_depth_svg(const std::vector<DepthPoint>& points, const std::string& title);
/// The same chart in an HTML page with the points as a table.
std::string render_depth_html(const std::vector<DepthPoint>& points, const std::string& title,
                              const std::string& command);

/// One HTML page, no external resources and no script: four inline SVG charts with ids
/// roofline, time-breakdown, memory-timeline and loss-curve, plus the table.
std::string render_html_report(const ReportInput& in);

}  // namespace hetrain::insight
