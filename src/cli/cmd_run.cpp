// hetrain run: an ONNX model on input files, its outputs written and/or compared.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli/args.h"
#include "cli/commands.h"
#include "hetrain/base/error.h"
#include "hetrain/base/thread_pool.h"
#include "hetrain/graph/ops.h"
#include "hetrain/interop/onnx.h"
#include "hetrain/runtime/eval.h"

namespace hetrain::cli {

namespace {

namespace fs = std::filesystem;

/// DIR/stem_K.pb or DIR/stem_K.npy (the .pb first); empty when neither exists.
std::string find_tensor_file(const std::string& dir, const std::string& stem, size_t k) {
  for (const char* ext : {".pb", ".npy"}) {
    fs::path p = fs::path(dir) / (stem + "_" + std::to_string(k) + ext);
    if (fs::exists(p)) return p.string();
  }
  return "";
}

struct Comparison {
  bool ok = true;
  std::string problem;  // shape or dtype mismatch
  double max_abs = 0, max_rel = 0;
  int64_t mismatches = 0, worst_index = -1;
  double worst_got = 0, worst_want = 0;
};

/// numpy.testing.assert_allclose's rule: |got - want| <= atol + rtol |want|; NaN equals NaN.
Comparison compare(const Tensor& got, const Tensor& want, double rtol, double atol) {
  Comparison c;
  if (got.shape() != want.shape()) {
    c.ok = false;
    c.problem = "shape " + shape_str(got.shape()) + ", expected " + shape_str(want.shape());
    return c;
  }
  std::vector<double> g = got.to_vector<double>(), w = want.to_vector<double>();
  double worst_excess = -1;
  for (size_t i = 0; i < g.size(); ++i) {
    if (std::isnan(g[i]) && std::isnan(w[i])) continue;
    const double err = std::fabs(g[i] - w[i]);
    const bool bad = std::isnan(err) ? g[i] != w[i] : err > atol + rtol * std::fabs(w[i]);
    if (!std::isnan(err)) {
      c.max_abs = std::max(c.max_abs, err);
      if (w[i] != 0) c.max_rel = std::max(c.max_rel, err / std::fabs(w[i]));
    }
    const double excess = std::isnan(err) ? INFINITY : err - (atol + rtol * std::fabs(w[i]));
    if (bad) ++c.mismatches;
    if (excess > worst_excess) {
      worst_excess = excess;
      c.worst_index = static_cast<int64_t>(i);
      c.worst_got = g[i];
      c.worst_want = w[i];
    }
  }
  c.ok = c.mismatches == 0;
  return c;
}

}  // namespace

int cmd_run(const Args& args) {
  ArgParser p("run",
              "Run an ONNX model with Hetrain: inputs from files in graph-input order, outputs\n"
              "written and/or compared with expected ones (the layout of ONNX's test data:\n"
              "DIR/input_K.pb, DIR/output_K.pb; .npy files too).\n"
              "usage: hetrain run MODEL.onnx --inputs DIR [--output-dir DIR] [--expect DIR]");
  p.option("inputs", "DIR", "reads DIR/input_K.pb (ONNX TensorProto) or DIR/input_K.npy")
      .option("output-dir", "DIR", "writes DIR/output_K.npy in graph-output order")
      .option("expect", "DIR", "compares with DIR/output_K.pb or .npy; exit 1 on a mismatch")
      .option("rtol", "X", "relative tolerance of --expect", "1e-3")
      .option("atol", "X", "absolute tolerance of --expect", "1e-7")
      .option("threads", "N", "worker threads (0: every core)", "0")
      .flag("json", "print a JSON summary")
      .epilog(
          "example:\n  hetrain run model.onnx --inputs test_data_set_0 --expect test_data_set_0");
  if (!p.parse(args)) return 0;
  if (p.positional().size() != 1) fail("[run] expected one MODEL.onnx; see 'hetrain run --help'");
  if (!p.given("inputs")) fail("[run] --inputs DIR is required");
  const double rtol = p.get_double("rtol"), atol = p.get_double("atol");
  set_num_threads(static_cast<int>(p.get_int("threads")));
  for (const char* flag : {"inputs", "expect"})
    if (p.given(flag) && !fs::is_directory(p.get(flag)))
      fail("[run] --", flag, " ", p.get(flag), " is not a directory");

  interop::OnnxModel model = interop::load_onnx(p.positional()[0]);
  std::vector<Tensor> inputs;
  for (size_t k = 0; k < model.inputs().size(); ++k) {
    std::string f = find_tensor_file(p.get("inputs"), "input", k);
    if (f.empty())
      fail("[run] ", p.get("inputs"), " has no input_", k, ".pb or input_", k, ".npy (input '",
           model.inputs()[k].name, "')");
    inputs.push_back(interop::read_tensor_file(f));
  }
  std::vector<Tensor> outs;
  {
    NoGradScope ng;
    outs = model.forward(inputs);
    eval(outs);
  }
  if (p.given("output-dir")) {
    std::error_code ec;
    fs::create_directories(p.get("output-dir"), ec);
    if (ec) fail("[run] cannot create --output-dir ", p.get("output-dir"), ": ", ec.message());
    for (size_t k = 0; k < outs.size(); ++k)
      interop::write_npy(
          (fs::path(p.get("output-dir")) / ("output_" + std::to_string(k) + ".npy")).string(),
          outs[k]);
  }
  nlohmann::json summary = {{"model", p.positional()[0]},
                            {"opset", model.opset()},
                            {"ir_version", model.ir_version()},
                            {"outputs", nlohmann::json::array()}};
  bool all_ok = true;
  for (size_t k = 0; k < outs.size(); ++k) {
    nlohmann::json o = {{"name", model.outputs()[k].name},
                        {"shape", outs[k].shape()},
                        {"dtype", std::string(dtype_name(outs[k].dtype()))}};
    if (p.given("expect")) {
      std::string f = find_tensor_file(p.get("expect"), "output", k);
      if (f.empty())
        fail("[run] ", p.get("expect"), " has no output_", k, ".pb or output_", k, ".npy");
      Comparison c = compare(outs[k], interop::read_tensor_file(f), rtol, atol);
      all_ok = all_ok && c.ok;
      o["match"] = c.ok;
      o["max_abs_error"] = c.max_abs;
      o["max_rel_error"] = c.max_rel;
      o["mismatches"] = c.mismatches;
      if (!c.problem.empty()) o["problem"] = c.problem;
      if (!p.get_flag("json")) {
        if (!c.problem.empty())
          std::printf("output %zu '%s': MISMATCH: %s\n", k, model.outputs()[k].name.c_str(),
                      c.problem.c_str());
        else
          std::printf(
              "output %zu '%s' %s: %s, max abs error %.3g, max rel error %.3g, %lld of %lld "
              "outside rtol %g atol %g; worst at flat index %lld: %.9g vs %.9g\n",
              k, model.outputs()[k].name.c_str(), shape_str(outs[k].shape()).c_str(),
              c.ok ? "ok" : "MISMATCH", c.max_abs, c.max_rel, static_cast<long long>(c.mismatches),
              static_cast<long long>(outs[k].numel()), rtol, atol,
              static_cast<long long>(c.worst_index), c.worst_got, c.worst_want);
      }
    } else if (!p.get_flag("json")) {
      std::printf("output %zu '%s': %s %s\n", k, model.outputs()[k].name.c_str(),
                  shape_str(outs[k].shape()).c_str(),
                  std::string(dtype_name(outs[k].dtype())).c_str());
    }
    summary["outputs"].push_back(o);
  }
  if (p.given("expect")) summary["match"] = all_ok;
  if (p.get_flag("json")) std::cout << summary.dump(2) << "\n";
  return all_ok ? 0 : 1;
}

}  // namespace hetrain::cli
