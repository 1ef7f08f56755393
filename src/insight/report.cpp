#include "hetrain/insight/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>

namespace hetrain::insight {

using nlohmann::json;

namespace {

// Primitives whose FLOPs run on the GEMM path (oneDNN or OpenBLAS GEMMs and convolutions); a
// fused epilogue's producer is a matmul or a convolution.
bool gemm_like(const std::string& primitive) {
  static const char* const kGemm[] = {"matmul", "fused_epilogue", "conv2d", "conv2d_backward_input",
                                      "conv2d_backward_weight"};
  return std::any_of(std::begin(kGemm), std::end(kGemm),
                     [&](const char* n) { return primitive == n; });
}

}  // namespace

double compute_ceiling_gflops(const DeviceProfile& device, const std::string& primitive,
                              Dtype dtype) {
  const double fma = device.peak_gflops();
  if (!gemm_like(primitive)) return fma;
  // 0: oneDNN ran on a unit whose peak loop could not run here; the FMA peak is all we know.
  const double gemm = device.gemm_ceiling_gflops(dtype);
  return gemm > 0 ? gemm : fma;
}

std::vector<RooflineRow> roofline_rows(const std::vector<PrimitiveSummary>& summary,
                                       double step_seconds, const DeviceProfile& device) {
  std::vector<RooflineRow> rows;
  const double bw = device.roof_bw_gbs();
  for (const auto& s : summary) {
    RooflineRow r;
    r.s = s;
    r.percent_of_step = step_seconds > 0 ? 100.0 * s.total_s / step_seconds : 0;
    r.ceiling_gflops = compute_ceiling_gflops(device, s.name, s.dtype);
    const double i = s.intensity();
    r.attainable_gflops = std::min(r.ceiling_gflops, i * bw);
    r.of_roofline = r.attainable_gflops > 0 ? s.gflops_per_s() / r.attainable_gflops : 0;
    r.compute_bound = bw > 0 && r.ceiling_gflops > 0 && i >= r.ceiling_gflops / bw;
    rows.push_back(r);
  }
  return rows;
}

std::string ceilings_text(const std::vector<RooflineRow>& rows, const DeviceProfile& device) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "FMA peak %.1f GFLOP/s", device.peak_gflops());
  std::string text = buf;
  std::vector<Dtype> shown;
  for (const auto& r : rows) {
    if (r.ceiling_gflops == device.peak_gflops() ||
        std::find(shown.begin(), shown.end(), r.s.dtype) != shown.end())
      continue;
    shown.push_back(r.s.dtype);
    const std::string unit = r.s.dtype == Dtype::bf16 && !device.bf16_isa.empty()
                                 ? " (" + device.bf16_isa + ")"
                                 : std::string();
    std::snprintf(buf, sizeof buf, ", %s GEMM ceiling %.1f GFLOP/s%s",
                  std::string(dtype_name(r.s.dtype)).c_str(), r.ceiling_gflops, unit.c_str());
    text += buf;
  }
  return text;
}

namespace {

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string esc(const std::string& s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '&':
        o += "&amp;";
        break;
      case '<':
        o += "&lt;";
        break;
      case '>':
        o += "&gt;";
        break;
      case '"':
        o += "&quot;";
        break;
      default:
        o += c;
    }
  }
  return o;
}

// A number for a tick label: 1e-2, 0.5, 20, 3k, 2M.
std::string tick_label(double v) {
  const double a = std::fabs(v);
  if (a == 0) return "0";
  if (a >= 1e6) return fmt("%gM", v / 1e6);
  if (a >= 1e4) return fmt("%gk", v / 1e3);
  if (a < 1e-2) return fmt("%.0e", v);
  return fmt("%g", v);
}

/// A plot area with linear or log10 axes, writing SVG.
class Plot {
 public:
  static constexpr double W = 820, H = 380, L = 76, R = 24, T = 34, B = 54;

  Plot(std::string id, std::string title) : id_(std::move(id)) {
    os_ << "<svg id=\"" << id_ << "\" xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W
        << "\" height=\"" << H << "\" viewBox=\"0 0 " << W << " " << H
        << "\" font-family=\"sans-serif\" font-size=\"12\">\n"
        << "<title>" << esc(title) << "</title>\n"
        << "<rect x=\"0\" y=\"0\" width=\"" << W << "\" height=\"" << H << "\" fill=\"#fff\"/>\n"
        << "<text x=\"" << W / 2
        << "\" y=\"20\" text-anchor=\"middle\" font-size=\"15\" "
           "font-weight=\"bold\">"
        << esc(title) << "</text>\n";
  }
  void x_axis(double lo, double hi, bool log, const std::string& label) {
    xl_ = log, x0_ = lo, x1_ = hi;
    axis(true, label);
  }
  void y_axis(double lo, double hi, bool log, const std::string& label) {
    yl_ = log, y0_ = lo, y1_ = hi;
    axis(false, label);
  }
  double px(double x) const { return L + (W - L - R) * frac(x, x0_, x1_, xl_); }
  double py(double y) const { return H - B - (H - T - B) * frac(y, y0_, y1_, yl_); }
  std::ostringstream& raw() { return os_; }
  std::string finish() {
    os_ << "<rect x=\"" << L << "\" y=\"" << T << "\" width=\"" << W - L - R << "\" height=\""
        << H - T - B << "\" fill=\"none\" stroke=\"#444\"/>\n</svg>\n";
    return os_.str();
  }
  void polyline(const std::vector<std::pair<double, double>>& pts, const std::string& style) {
    os_ << "<polyline fill=\"none\" " << style << " points=\"";
    for (const auto& [x, y] : pts) os_ << fmt("%.1f", px(x)) << "," << fmt("%.1f", py(y)) << " ";
    os_ << "\"/>\n";
  }

 private:
  static double frac(double v, double lo, double hi, bool log) {
    if (log) {
      v = std::max(v, lo);
      return (std::log10(v) - std::log10(lo)) / (std::log10(hi) - std::log10(lo));
    }
    return hi > lo ? (v - lo) / (hi - lo) : 0;
  }
  void axis(bool x, const std::string& label) {
    const bool log = x ? xl_ : yl_;
    const double lo = x ? x0_ : y0_, hi = x ? x1_ : y1_;
    std::vector<double> ticks;
    if (log) {
      for (double e = std::floor(std::log10(lo)); e <= std::ceil(std::log10(hi)); e += 1) {
        const double v = std::pow(10.0, e);
        if (v >= lo * 0.999 && v <= hi * 1.001) ticks.push_back(v);
      }
    } else {
      const double span = hi - lo;
      const double raw = span / 6, mag = std::pow(10.0, std::floor(std::log10(raw)));
      const double step = raw / mag < 2 ? 2 * mag : raw / mag < 5 ? 5 * mag : 10 * mag;
      for (double v = std::ceil(lo / step) * step; v <= hi + 1e-9 * span; v += step)
        ticks.push_back(v);
    }
    for (double v : ticks) {
      if (x) {
        const double p = px(v);
        os_ << "<line x1=\"" << p << "\" y1=\"" << T << "\" x2=\"" << p << "\" y2=\"" << H - B
            << "\" stroke=\"#e4e4e4\"/>\n<text x=\"" << p << "\" y=\"" << H - B + 16
            << "\" text-anchor=\"middle\">" << tick_label(v) << "</text>\n";
      } else {
        const double p = py(v);
        os_ << "<line x1=\"" << L << "\" y1=\"" << p << "\" x2=\"" << W - R << "\" y2=\"" << p
            << "\" stroke=\"#e4e4e4\"/>\n<text x=\"" << L - 6 << "\" y=\"" << p + 4
            << "\" text-anchor=\"end\">" << tick_label(v) << "</text>\n";
      }
    }
    if (x)
      os_ << "<text x=\"" << (L + W - R) / 2 << "\" y=\"" << H - 14 << "\" text-anchor=\"middle\">"
          << esc(label) << "</text>\n";
    else
      os_ << "<text transform=\"translate(16," << (T + H - B) / 2
          << ") rotate(-90)\" text-anchor=\"middle\">" << esc(label) << "</text>\n";
  }

  std::string id_;
  std::ostringstream os_;
  bool xl_ = false, yl_ = false;
  double x0_ = 0, x1_ = 1, y0_ = 0, y1_ = 1;
};

const char* const kPalette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};

std::string roofline_svg(const ReportInput& in) {
  Plot p("roofline", "Roofline: each primitive against this machine's measured ceilings");
  const DeviceProfile& d = in.device;
  const double peak = d.peak_gflops(), bw = d.roof_bw_gbs(), ridge = d.ridge_flop_per_byte();
  // Ceilings above the FMA peak (the bf16 unit's, bounding bf16 GEMMs), one per dtype.
  std::vector<std::pair<Dtype, double>> gemm_roofs;
  for (const auto& r : in.rows)
    if (bw > 0 && r.ceiling_gflops > peak &&
        std::none_of(gemm_roofs.begin(), gemm_roofs.end(),
                     [&](const auto& g) { return g.first == r.s.dtype; }))
      gemm_roofs.emplace_back(r.s.dtype, r.ceiling_gflops);
  double imin = ridge, imax = ridge, gmin = peak, gmax = peak;
  for (const auto& [dt, roof] : gemm_roofs)
    imax = std::max(imax, roof / bw), gmax = std::max(gmax, roof);
  for (const auto& r : in.rows) {
    if (r.s.flops <= 0 || r.s.total_s <= 0) continue;
    imin = std::min(imin, r.s.intensity());
    imax = std::max(imax, r.s.intensity());
    gmin = std::min(gmin, r.s.gflops_per_s());
    gmax = std::max(gmax, r.s.gflops_per_s());
  }
  auto lo10 = [](double v) { return std::pow(10.0, std::floor(std::log10(std::max(v, 1e-9)))); };
  auto hi10 = [](double v) { return std::pow(10.0, std::ceil(std::log10(std::max(v, 1e-9)))); };
  const double x0 = lo10(imin / 2), x1 = hi10(imax * 2);
  const double y0 = lo10(std::min(gmin / 2, x0 * bw)), y1 = hi10(gmax * 2);
  p.x_axis(x0, x1, true, "compute density (FLOP/byte)");
  p.y_axis(y0, y1, true, "GFLOP/s");
  // Ceilings: memory slope up to the ridge, then the FMA peak; the f32 GEMM rate dashed grey,
  // the bf16 unit's ceiling dashed black.
  const double xs = std::max(x0, y0 / bw);
  p.polyline({{xs, xs * bw}, {ridge, peak}, {x1, peak}}, "stroke=\"#000\" stroke-width=\"2.5\"");
  auto& o = p.raw();
  o << "<text x=\"" << p.px(x1) - 4 << "\" y=\"" << p.py(peak) - 6
    << "\" text-anchor=\"end\">FMA peak " << fmt("%.0f", peak) << " GFLOP/s</text>\n";
  for (const auto& [dt, roof] : gemm_roofs) {
    p.polyline({{ridge, peak}, {roof / bw, roof}, {x1, roof}},
               "stroke=\"#000\" stroke-width=\"1.5\" stroke-dasharray=\"8,3\"");
    o << "<text x=\"" << p.px(x1) - 4 << "\" y=\"" << p.py(roof) - 6 << "\" text-anchor=\"end\">"
      << dtype_name(dt) << " GEMM ceiling " << fmt("%.0f", roof) << " GFLOP/s</text>\n";
  }
  o << "<text x=\"" << p.px(xs) + 6 << "\" y=\"" << p.py(xs * bw) - 8 << "\">triad "
    << fmt("%.1f", bw) << " GB/s</text>\n";
  const double gemm = d.gemm_f32_cpu_gflops > 0 ? d.gemm_f32_cpu_gflops : d.gemm_f32_tflops * 1e3;
  if (gemm > 0 && gemm < y1) {
    p.polyline({{x0, gemm}, {x1, gemm}}, "stroke=\"#888\" stroke-dasharray=\"6,4\"");
    o << "<text x=\"" << p.px(x0) + 6 << "\" y=\"" << p.py(gemm) - 5 << "\" fill=\"#666\">GEMM f32 "
      << fmt("%.0f", gemm) << " GFLOP/s</text>\n";
  }
  o << "<line x1=\"" << p.px(ridge) << "\" y1=\"" << p.py(y0) << "\" x2=\"" << p.px(ridge)
    << "\" y2=\"" << p.py(peak) << "\" stroke=\"#aaa\" stroke-dasharray=\"2,3\"/>\n";
  int k = 0, skipped = 0;
  for (const auto& r : in.rows) {
    if (r.s.flops <= 0 || r.s.total_s <= 0) {
      ++skipped;
      continue;
    }
    const double cx = p.px(r.s.intensity()), cy = p.py(r.s.gflops_per_s());
    const char* c = kPalette[k++ % 10];
    o << "<g class=\"point\"><circle cx=\"" << fmt("%.1f", cx) << "\" cy=\"" << fmt("%.1f", cy)
      << "\" r=\"" << fmt("%.1f", 3 + std::min(6.0, r.percent_of_step / 5)) << "\" fill=\"" << c
      << "\" fill-opacity=\"0.8\"><title>" << esc(r.s.label()) << ": "
      << fmt("%.2f", r.s.intensity()) << " FLOP/B, " << fmt("%.2f", r.s.gflops_per_s())
      << " GFLOP/s, " << fmt("%.1f", 100 * r.of_roofline) << "% of roof, "
      << fmt("%.1f", r.percent_of_step) << "% of step</title></circle>"
      << "<text x=\"" << fmt("%.1f", cx + 7) << "\" y=\"" << fmt("%.1f", cy + 4)
      << "\" font-size=\"10\" fill=\"" << c << "\">" << esc(r.s.label()) << "</text></g>\n";
  }
  if (skipped)
    o << "<text x=\"" << Plot::L + 6 << "\" y=\"" << Plot::H - Plot::B - 8
      << "\" fill=\"#666\" font-size=\"11\">" << skipped
      << " primitives without FLOPs (views, copies) not shown</text>\n";
  return p.finish();
}

std::string breakdown_svg(const ReportInput& in) {
  // Horizontal bars: the 14 longest primitives and the rest as "other".
  std::vector<std::pair<std::string, double>> bars;
  double other = 0;
  for (size_t i = 0; i < in.rows.size(); ++i) {
    if (i < 14)
      bars.emplace_back(in.rows[i].s.label(), in.rows[i].percent_of_step);
    else
      other += in.rows[i].percent_of_step;
  }
  if (other > 0) bars.emplace_back("other", other);
  std::ostringstream o;
  const double W = Plot::W, row = 22, top = 40, left = 170;
  const double H = top + row * static_cast<double>(std::max<size_t>(bars.size(), 1)) + 40;
  double vmax = 1;
  for (const auto& b : bars) vmax = std::max(vmax, b.second);
  o << "<svg id=\"time-breakdown\" xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W
    << "\" height=\"" << H << "\" viewBox=\"0 0 " << W << " " << H
    << "\" font-family=\"sans-serif\" font-size=\"12\">\n<title>Time breakdown</title>\n"
    << "<rect width=\"" << W << "\" height=\"" << H << "\" fill=\"#fff\"/>\n"
    << "<text x=\"" << W / 2
    << "\" y=\"20\" text-anchor=\"middle\" font-size=\"15\" font-weight=\"bold\">"
       "Time per primitive (% of step wall time, summed over workers)</text>\n";
  for (size_t i = 0; i < bars.size(); ++i) {
    const double y = top + row * static_cast<double>(i);
    const double w = (W - left - 90) * bars[i].second / vmax;
    o << "<text x=\"" << left - 6 << "\" y=\"" << y + 15 << "\" text-anchor=\"end\">"
      << esc(bars[i].first) << "</text>\n<rect class=\"bar\" x=\"" << left << "\" y=\"" << y + 3
      << "\" width=\"" << fmt("%.1f", std::max(w, 0.5)) << "\" height=\"" << row - 6 << "\" fill=\""
      << kPalette[i % 10] << "\"/>\n<text x=\"" << left + w + 6 << "\" y=\"" << y + 15 << "\">"
      << fmt("%.1f", bars[i].second) << "%</text>\n";
  }
  o << "</svg>\n";
  return o.str();
}

std::string memory_svg(const ReportInput& in) {
  Plot p("memory-timeline", "Host memory by tag (allocator counters)");
  const auto& mem = in.profiler->memory();
  if (mem.empty()) {
    p.x_axis(0, 1, false, "time (ms)");
    p.y_axis(0, 1, false, "MiB");
    return p.finish();
  }
  int64_t t0 = mem.front().t_ns, t1 = mem.back().t_ns;
  if (!in.profiler->steps().empty()) t0 = std::min(t0, in.profiler->steps().front().start_ns);
  t1 = std::max(t1, t0 + 1);
  // Buckets of time; each keeps its highest-total sample, so peaks stay visible.
  constexpr size_t kBins = 600;
  std::vector<const MemorySample*> bin(kBins, nullptr);
  for (const auto& m : mem) {
    size_t b = static_cast<size_t>(static_cast<double>(m.t_ns - t0) / static_cast<double>(t1 - t0) *
                                   (kBins - 1));
    b = std::min(b, kBins - 1);
    if (!bin[b] || m.total > bin[b]->total) bin[b] = &m;
  }
  std::vector<const MemorySample*> pts;
  for (auto* s : bin)
    if (s) pts.push_back(s);
  double ymax = 0;
  for (auto* s : pts) ymax = std::max(ymax, static_cast<double>(s->total) / (1 << 20));
  const double tms = 1e-6 * static_cast<double>(t1 - t0);
  p.x_axis(0, tms, false, "time since the first profiled step (ms)");
  p.y_axis(0, std::max(ymax * 1.1, 1e-3), false, "MiB");
  auto& o = p.raw();
  // Steps as shaded bands.
  for (const auto& s : in.profiler->steps()) {
    const double a = p.px(1e-6 * static_cast<double>(s.start_ns - t0));
    const double b = p.px(1e-6 * static_cast<double>(s.end_ns - t0));
    o << "<rect x=\"" << fmt("%.1f", a) << "\" y=\"" << Plot::T << "\" width=\""
      << fmt("%.1f", std::max(0.5, b - a)) << "\" height=\"" << Plot::H - Plot::T - Plot::B
      << "\" fill=\"#f3f3f3\"/>\n";
  }
  // Stacked areas, one per tag, drawn top-down so each polygon fills to its own base.
  for (int t = kNumMemoryTags - 1; t >= 0; --t) {
    o << "<polygon class=\"area\" fill=\"" << kPalette[t] << "\" fill-opacity=\"0.75\" points=\"";
    for (auto* s : pts) {
      double top = 0;
      for (int u = 0; u <= t; ++u) top += static_cast<double>(s->bytes[static_cast<size_t>(u)]);
      o << fmt("%.1f", p.px(1e-6 * static_cast<double>(s->t_ns - t0))) << ","
        << fmt("%.1f", p.py(top / (1 << 20))) << " ";
    }
    o << fmt("%.1f", p.px(1e-6 * static_cast<double>(pts.back()->t_ns - t0))) << "," << p.py(0)
      << " " << fmt("%.1f", p.px(1e-6 * static_cast<double>(pts.front()->t_ns - t0))) << ","
      << p.py(0) << "\"><title>" << memory_tag_name(static_cast<MemoryTag>(t))
      << "</title></polygon>\n";
  }
  for (int t = 0; t < kNumMemoryTags; ++t)
    o << "<rect x=\"" << Plot::L + 10 + 130 * t << "\" y=\"" << Plot::T + 6
      << "\" width=\"10\" height=\"10\" fill=\"" << kPalette[t] << "\"/><text x=\""
      << Plot::L + 24 + 130 * t << "\" y=\"" << Plot::T + 15 << "\">"
      << memory_tag_name(static_cast<MemoryTag>(t)) << "</text>\n";
  return p.finish();
}

std::string loss_svg(const ReportInput& in) {
  Plot p("loss-curve", "Training loss per step");
  std::vector<std::pair<double, double>> pts;
  for (const auto& [s, l] : in.losses)
    if (std::isfinite(l)) pts.emplace_back(static_cast<double>(s + 1), l);
  if (pts.empty()) {
    p.x_axis(0, 1, false, "step");
    p.y_axis(0, 1, false, "loss");
    return p.finish();
  }
  double lo = pts[0].second, hi = lo;
  for (const auto& q : pts) lo = std::min(lo, q.second), hi = std::max(hi, q.second);
  const double pad = std::max(1e-6, 0.08 * (hi - lo));
  p.x_axis(pts.front().first - (pts.size() == 1 ? 1 : 0), pts.back().first, false, "step");
  p.y_axis(std::max(0.0, lo - pad), hi + pad, false, "loss");
  p.polyline(pts, "stroke=\"#1f77b4\" stroke-width=\"2\"");
  for (const auto& [x, y] : pts)
    p.raw() << "<circle cx=\"" << fmt("%.1f", p.px(x)) << "\" cy=\"" << fmt("%.1f", p.py(y))
            << "\" r=\"2.5\" fill=\"#1f77b4\"/>\n";
  return p.finish();
}

const char* mode_colour(const std::string& mode) {
  if (mode == "none") return "#d62728";
  if (mode == "selective") return "#ff7f0e";
  if (mode == "full") return "#1f77b4";
  return "#2ca02c";  // auto
}

}  // namespace

std::string render_depth_svg(const std::vector<DepthPoint>& points, const std::string& title) {
  Plot p("activation-depth", title);
  std::vector<std::string> modes;
  double lo = 0, hi = 1, top = 1;
  for (const DepthPoint& d : points) {
    if (std::find(modes.begin(), modes.end(), d.mode) == modes.end()) modes.push_back(d.mode);
    const double l = static_cast<double>(d.layers);
    lo = lo == 0 ? l : std::min(lo, l);
    hi = std::max(hi, l);
    top = std::max({top, static_cast<double>(d.measured), static_cast<double>(d.predicted)});
  }
  constexpr double kMiB = 1024.0 * 1024.0;
  p.x_axis(lo, std::max(hi, lo + 1), false, "transformer layers");
  p.y_axis(0, 1.08 * top / kMiB, false, "activations peak (MiB)");
  double legend_y = Plot::T + 18;
  for (const std::string& m : modes) {
    std::vector<std::pair<double, double>> meas, pred;
    for (const DepthPoint& d : points) {
      if (d.mode != m) continue;
      meas.emplace_back(static_cast<double>(d.layers), static_cast<double>(d.measured) / kMiB);
      pred.emplace_back(static_cast<double>(d.layers), static_cast<double>(d.predicted) / kMiB);
    }
    const std::string c = mode_colour(m);
    p.polyline(meas, "stroke=\"" + c + "\" stroke-width=\"2\"");
    p.polyline(pred, "stroke=\"" + c + "\" stroke-width=\"1.5\" stroke-dasharray=\"5,4\"");
    for (const auto& [x, y] : meas)
      p.raw() << "<circle cx=\"" << fmt("%.1f", p.px(x)) << "\" cy=\"" << fmt("%.1f", p.py(y))
              << "\" r=\"3.5\" fill=\"" << c << "\"><title>" << esc(m) << ", " << fmt("%g", x)
              << " layers: " << fmt("%.1f", y) << " MiB</title></circle>\n";
    p.raw() << "<line x1=\"" << Plot::L + 12 << "\" y1=\"" << legend_y - 4 << "\" x2=\""
            << Plot::L + 36 << "\" y2=\"" << legend_y - 4 << "\" stroke=\"" << c
            << "\" stroke-width=\"2\"/><text x=\"" << Plot::L + 42 << "\" y=\"" << legend_y
            << "\">--recompute " << esc(m) << "</text>\n";
    legend_y += 16;
  }
  p.raw() << "<text x=\"" << Plot::L + 12 << "\" y=\"" << legend_y
          << "\" fill=\"#555\">solid: measured (allocator), dashed: predicted (memory model)"
             "</text>\n";
  return p.finish();
}

std::string render_depth_html(const std::vector<DepthPoint>& points, const std::string& title,
                              const std::string& command) {
  std::ostringstream o;
  o << "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>"
    << esc(title) << "</title>\n</head>\n<body>\n<h1>" << esc(title) << "</h1>\n<p><code>"
    << esc(command) << "</code></p>\n"
    << render_depth_svg(points, title)
    << "<table>\n<tr><th>recompute</th><th>layers</th><th>measured (bytes)</th>"
       "<th>predicted (bytes)</th></tr>\n";
  for (const DepthPoint& d : points)
    o << "<tr><td>" << esc(d.mode) << "</td><td>" << d.layers << "</td><td>" << d.measured
      << "</td><td>" << d.predicted << "</td></tr>\n";
  o << "</table>\n</body>\n</html>\n";
  return o.str();
}

std::string format_table(const std::vector<RooflineRow>& rows, double step_seconds, int steps) {
  std::ostringstream o;
  char buf[256];
  std::snprintf(buf, sizeof buf, "%-27s %7s %10s %7s %9s %8s %9s %-8s %7s\n", "primitive", "calls",
                "total ms", "% step", "GFLOP/s", "GB/s", "FLOP/B", "bound", "% roof");
  o << buf;
  double sum = 0;
  for (const auto& r : rows) {
    sum += r.s.total_s;
    std::snprintf(buf, sizeof buf, "%-27s %7lld %10.2f %7.1f %9.2f %8.2f %9.3f %-8s %7.1f\n",
                  r.s.label().c_str(), static_cast<long long>(r.s.calls), r.s.total_s * 1e3,
                  r.percent_of_step, r.s.gflops_per_s(), r.s.gbytes_per_s(), r.s.intensity(),
                  r.s.flops > 0 ? (r.compute_bound ? "compute" : "memory") : "-",
                  100 * r.of_roofline);
    o << buf;
  }
  std::snprintf(buf, sizeof buf,
                "%d steps, %.2f ms per step (wall); primitives sum to %.2f ms per step (%.1f%%)\n",
                steps, steps ? step_seconds * 1e3 / steps : 0.0, steps ? sum * 1e3 / steps : 0.0,
                step_seconds > 0 ? 100 * sum / step_seconds : 0.0);
  o << buf;
  return o.str();
}

json profile_json(const ReportInput& in) {
  json prims = json::array();
  for (const auto& r : in.rows)
    prims.push_back({{"name", r.s.name},
                     {"dtype", std::string(dtype_name(r.s.dtype))},
                     {"calls", r.s.calls},
                     {"total_s", r.s.total_s},
                     {"percent_of_step", r.percent_of_step},
                     {"flops", r.s.flops},
                     {"bytes_read", r.s.bytes_read},
                     {"bytes_written", r.s.bytes_written},
                     {"gflops_per_s", r.s.gflops_per_s()},
                     {"gbytes_per_s", r.s.gbytes_per_s()},
                     {"flop_per_byte", r.s.intensity()},
                     {"bound", r.s.flops > 0 ? (r.compute_bound ? "compute" : "memory") : "none"},
                     {"ceiling_gflops_per_s", r.ceiling_gflops},
                     {"attainable_gflops_per_s", r.attainable_gflops},
                     {"fraction_of_roofline", r.of_roofline}});
  json steps = json::array();
  for (const auto& s : in.profiler->steps()) {
    json st = {{"step", s.index}, {"seconds", s.seconds()}};
    if (std::isfinite(s.loss)) st["loss"] = s.loss;
    steps.push_back(st);
  }
  std::array<int64_t, kNumMemoryTags> peak{};
  int64_t peak_total = 0;
  for (const auto& m : in.profiler->memory()) {
    for (size_t t = 0; t < peak.size(); ++t) peak[t] = std::max(peak[t], m.bytes[t]);
    peak_total = std::max(peak_total, m.total);
  }
  json mem = json::object();
  for (int t = 0; t < kNumMemoryTags; ++t)
    mem[std::string(memory_tag_name(static_cast<MemoryTag>(t)))] = peak[static_cast<size_t>(t)];
  mem["total"] = peak_total;
  return {{"title", in.title},
          {"command", in.command},
          {"device",
           {{"name", in.device.name},
            {"fma_peak_gflops", in.device.peak_gflops()},
            {"gemm_bf16_ceiling_gflops", compute_ceiling_gflops(in.device, "matmul", Dtype::bf16)},
            {"gemm_bf16_impl", in.device.gemm_bf16_impl},
            {"mem_bw_gbs", in.device.mem_bw_gbs},
            {"roof_bw_gbs", in.device.roof_bw_gbs()},
            {"gemm_f32_gflops", in.device.gemm_f32_tflops * 1e3},
            {"gemm_f32_cpu_gflops", in.device.gemm_f32_cpu_gflops},
            {"ridge_flop_per_byte", in.device.ridge_flop_per_byte()},
            {"threads", in.device.threads},
            {"date", in.device.date}}},
          {"load_average_1min", in.load_average},
          {"steps", steps},
          {"step_seconds_total", in.profiler->step_seconds()},
          {"nodes", in.profiler->nodes().size()},
          {"peak_memory_bytes", mem},
          {"primitives", prims}};
}

std::string render_html_report(const ReportInput& in) {
  std::ostringstream o;
  const int nsteps = static_cast<int>(in.profiler->steps().size());
  const double step_s = in.profiler->step_seconds();
  o << "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
    << "<title>Hetrain profile: " << esc(in.title) << "</title>\n<style>\n"
    << "body{font-family:sans-serif;margin:24px;max-width:900px;color:#222}\n"
    << "h1{font-size:22px}h2{font-size:17px;margin-top:28px}\n"
    << "table{border-collapse:collapse;font-size:12px}td,th{padding:3px 8px;border-bottom:1px "
       "solid #ddd;text-align:right}td:first-child,th:first-child{text-align:left}\n"
    << "pre{background:#f6f6f6;padding:8px;font-size:12px;white-space:pre-wrap}\n"
    << "svg{display:block;margin:8px 0;border:1px solid #ddd}\n</style>\n</head>\n<body>\n";
  o << "<h1>Hetrain profile: " << esc(in.title) << "</h1>\n";
  o << "<p>" << nsteps << " profiled steps, " << fmt("%.2f", nsteps ? step_s * 1e3 / nsteps : 0)
    << " ms per step; " << in.profiler->nodes().size() << " nodes on " << in.profiler->workers()
    << " worker thread(s). Device: " << esc(in.device.name) << " &mdash; "
    << esc(ceilings_text(in.rows, in.device)) << ", triad " << fmt("%.2f", in.device.roof_bw_gbs())
    << " GB/s (per CPU second), ridge point " << fmt("%.1f", in.device.ridge_flop_per_byte())
    << " FLOP/byte (measured " << esc(in.device.date)
    << "). Achieved rates are per wall-clock second"
    << (in.load_average >= 0 ? "; 1-minute load average " + fmt("%.1f", in.load_average) : "")
    << ".</p>\n";
  o << "<pre>" << esc(in.command) << "\n" << esc(in.config) << "</pre>\n";
  o << "<h2>Roofline</h2>\n" << roofline_svg(in);
  o << "<h2>Time breakdown</h2>\n" << breakdown_svg(in);
  o << "<h2>Memory timeline</h2>\n" << memory_svg(in);
  o << "<h2>Loss</h2>\n" << loss_svg(in);
  o << "<h2>Primitives</h2>\n<table>\n<tr><th>primitive</th><th>calls</th><th>total "
       "ms</th><th>% step</th><th>GFLOP/s</th><th>GB/s</th><th>FLOP/B</th><th>bound</th><th>% "
       "of roof</th></tr>\n";
  for (const auto& r : in.rows)
    o << "<tr><td>" << esc(r.s.label()) << "</td><td>" << r.s.calls << "</td><td>"
      << fmt("%.2f", r.s.total_s * 1e3) << "</td><td>" << fmt("%.1f", r.percent_of_step)
      << "</td><td>" << fmt("%.2f", r.s.gflops_per_s()) << "</td><td>"
      << fmt("%.2f", r.s.gbytes_per_s()) << "</td><td>" << fmt("%.3f", r.s.intensity())
      << "</td><td>" << (r.s.flops > 0 ? (r.compute_bound ? "compute" : "memory") : "-")
      << "</td><td>" << fmt("%.1f", 100 * r.of_roofline) << "</td></tr>\n";
  o << "</table>\n</body>\n</html>\n";
  return o.str();
}

}  // namespace hetrain::insight
