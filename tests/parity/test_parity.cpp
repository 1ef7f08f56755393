// Table-driven parity against PyTorch: every case in tests/data/parity.safetensors (written by
// tools/gen_parity.py) is rebuilt here from the registry below, and its forward outputs and the
// gradients of sum(out * cotangent) are compared with PyTorch's at the tolerance of the dtype. One
// parameterised test per op, so a failure names its op; each failure names the case.
//
// HETRAIN_PARITY_DEVICE=cuda:0 (or sim:0) runs the same table with every node pinned to that
// device (forward and gradients): a case whose graph holds a primitive with no kernel there is
// listed, not failed; every other case must match PyTorch at the same tolerances.
//
// Tolerances, |got - want| <= atol + rtol * |want| with atol = rtol:
//   f64 1e-10   f32 1e-5   f16 2e-3 (about 2 ulp)   bf16 2e-2 (about 2.5 ulp)   ints, bool exact
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>

#include "hetrain/base/error.h"
#include "hetrain/graph/autodiff.h"
#include "hetrain/graph/ops.h"
#include "hetrain/graph/primitive.h"
#include "hetrain/interop/safetensors.h"
#include "hetrain/runtime/eval.h"
#include "hetrain/runtime/scheduler.h"

using namespace hetrain;
using nlohmann::json;

namespace {

// ---- the registry: op name -> how to build it from the case's inputs and attributes ------
using OpFn = std::function<std::vector<Tensor>(const std::vector<Tensor>&, const json&)>;

std::vector<int64_t> ints(const json& j) { return j.get<std::vector<int64_t>>(); }

/// The k-th input, or an undefined tensor (an optional argument left out).
Tensor opt(const std::vector<Tensor>& x, size_t k) { return x.size() > k ? x[k] : Tensor(); }

template <Tensor (*F)(const Tensor&)>
OpFn unary() {
  return [](const std::vector<Tensor>& x, const json&) { return std::vector<Tensor>{F(x[0])}; };
}
template <Tensor (*F)(const Tensor&, const Tensor&)>
OpFn binary() {
  return
      [](const std::vector<Tensor>& x, const json&) { return std::vector<Tensor>{F(x[0], x[1])}; };
}
template <Tensor (*F)(const Tensor&, std::vector<int64_t>, bool)>
OpFn reduction() {
  return [](const std::vector<Tensor>& x, const json& a) {
    return std::vector<Tensor>{F(x[0], ints(a["axes"]), a["keepdims"].get<bool>())};
  };
}
OpFn one(std::function<Tensor(const std::vector<Tensor>&, const json&)> f) {
  return [f](const std::vector<Tensor>& x, const json& a) { return std::vector<Tensor>{f(x, a)}; };
}

const std::map<std::string, OpFn>& registry() {
  using V = const std::vector<Tensor>&;
  using A = const json&;
  static const std::map<std::string, OpFn> r = {
      // elementwise unary
      {"neg", unary<hetrain::neg>()},
      {"abs", unary<hetrain::abs>()},
      {"exp", unary<hetrain::exp>()},
      {"log", unary<hetrain::log>()},
      {"sqrt", unary<hetrain::sqrt>()},
      {"rsqrt", unary<hetrain::rsqrt>()},
      {"square", unary<hetrain::square>()},
      {"tanh", unary<hetrain::tanh>()},
      {"sigmoid", unary<hetrain::sigmoid>()},
      {"relu", unary<hetrain::relu>()},
      {"silu", unary<hetrain::silu>()},
      {"gelu", one([](V x, A a) { return gelu(x[0], a["approximate"].get<std::string>()); })},
      // elementwise binary, comparisons, where
      {"add", binary<hetrain::add>()},
      {"sub", binary<hetrain::sub>()},
      {"mul", binary<hetrain::mul>()},
      {"div", binary<hetrain::div>()},
      {"pow", binary<hetrain::pow>()},
      {"pow_scalar", one([](V x, A a) { return pow(x[0], a["exponent"].get<double>()); })},
      {"maximum", binary<hetrain::maximum>()},
      {"minimum", binary<hetrain::minimum>()},
      {"equal", binary<hetrain::equal>()},
      {"not_equal", binary<hetrain::not_equal>()},
      {"less", binary<hetrain::less>()},
      {"less_equal", binary<hetrain::less_equal>()},
      {"greater", binary<hetrain::greater>()},
      {"greater_equal", binary<hetrain::greater_equal>()},
      {"where", one([](V x, A) { return where(x[0], x[1], x[2]); })},
      // reductions
      {"sum", reduction<hetrain::sum>()},
      {"mean", reduction<hetrain::mean>()},
      {"max", reduction<hetrain::max>()},
      {"min", reduction<hetrain::min>()},
      {"argmax", one([](V x, A a) { return argmax(x[0], a["axis"], a["keepdims"]); })},
      {"var",
       one([](V x, A a) { return var(x[0], ints(a["axes"]), a["correction"], a["keepdims"]); })},
      // linear algebra
      {"matmul", binary<hetrain::matmul>()},
      {"linear", one([](V x, A) { return linear(x[0], x[1], opt(x, 2)); })},
      // views and copies
      {"reshape", one([](V x, A a) { return reshape(x[0], ints(a["shape"])); })},
      {"flatten", one([](V x, A a) { return flatten(x[0], a["start"], a["end"]); })},
      {"squeeze", one([](V x, A a) { return squeeze(x[0], a["axis"]); })},
      {"unsqueeze", one([](V x, A a) { return unsqueeze(x[0], a["axis"]); })},
      {"permute", one([](V x, A a) { return permute(x[0], ints(a["dims"])); })},
      {"transpose", one([](V x, A a) { return transpose(x[0], a["a"], a["b"]); })},
      {"slice", one([](V x, A a) {
         int64_t stop =
             a["stop"].is_null() ? std::numeric_limits<int64_t>::max() : a["stop"].get<int64_t>();
         return slice(x[0], a["axis"], a["start"], stop, a["step"]);
       })},
      {"broadcast_to", one([](V x, A a) { return broadcast_to(x[0], ints(a["shape"])); })},
      {"expand", one([](V x, A a) { return expand(x[0], ints(a["shape"])); })},
      {"copy", unary<hetrain::copy>()},
      {"cast",
       one([](V x, A a) { return cast(x[0], dtype_from_name(a["to"].get<std::string>())); })},
      // joining
      {"concat", one([](V x, A a) { return concat(x, a["axis"]); })},
      {"split", [](V x, A a) { return split(x[0], ints(a["sizes"]), a["axis"]); }},
      // neural-network ops
      {"softmax", one([](V x, A a) { return softmax(x[0], a["axis"]); })},
      {"log_softmax", one([](V x, A a) { return log_softmax(x[0], a["axis"]); })},
      {"layer_norm", one([](V x, A a) {
         return layer_norm(x[0], ints(a["normalized_shape"]), opt(x, 1), opt(x, 2), a["eps"]);
       })},
      {"rms_norm", one([](V x, A a) {
         return rms_norm(x[0], ints(a["normalized_shape"]), opt(x, 1), a["eps"]);
       })},
      {"embedding", one([](V x, A) { return embedding(x[0], x[1]); })},
      {"index_select", one([](V x, A a) { return index_select(x[0], a["axis"], x[1]); })},
      {"gather", one([](V x, A a) { return gather(x[0], a["axis"], x[1]); })},
      {"cross_entropy", one([](V x, A a) {
         return cross_entropy(x[0], x[1], a["ignore_index"], a["reduction"].get<std::string>());
       })},
      // dropout: PyTorch's mask is not ours; the case checks statistics (see check_dropout).
      {"dropout", one([](V x, A a) {
         Generator gen(a["seed"].get<uint64_t>());
         return dropout(x[0], a["p"], true, gen);
       })},
      {"conv2d", one([](V x, A a) {
         return conv2d(x[0], x[1], opt(x, 2), ints(a["stride"]), ints(a["padding"]));
       })},
      {"max_pool2d", one([](V x, A a) {
         return max_pool2d(x[0], ints(a["kernel"]), ints(a["stride"]), ints(a["padding"]));
       })},
      {"avg_pool2d", one([](V x, A a) {
         return avg_pool2d(x[0], ints(a["kernel"]), ints(a["stride"]), ints(a["padding"]));
       })},
      {"sdpa", one([](V x, A a) {
         std::optional<double> scale;
         if (a.contains("scale")) scale = a["scale"].get<double>();
         return scaled_dot_product_attention(x[0], x[1], x[2], a["causal"], scale);
       })},
  };
  return r;
}

// ---- the reference file
// -------------------------------------------------------------------
struct Case {
  std::string name;
  json meta;
  std::vector<Tensor> in, out, cot,
      grad;  // cot[k] undefined for non-float outputs
};

std::string parity_path() {
  const char* env = std::getenv("HETRAIN_SOURCE_DIR");
  return std::string(env ? env : HETRAIN_SOURCE_DIR) + "/tests/data/parity.safetensors";
}

const std::vector<Case>& parity_cases() {
  static const std::vector<Case> cases = [] {
    safetensors::File f = safetensors::load(parity_path());
    std::vector<Case> cs;
    for (const auto& [name, text] : f.metadata) {
      Case c{name, json::parse(text), {}, {}, {}, {}};
      auto get = [&](const std::string& what, int k) {
        auto it = f.tensors.find(c.name + "." + what + std::to_string(k));
        return it == f.tensors.end() ? Tensor() : it->second;
      };
      for (int k = 0; k < c.meta["n_in"].get<int>(); ++k) c.in.push_back(get("in", k));
      for (int k = 0; k < c.meta["n_out"].get<int>(); ++k) {
        c.out.push_back(get("out", k));
        c.cot.push_back(get("cot", k));
      }
      for (size_t k = 0; k < c.meta["grads"].size(); ++k)
        c.grad.push_back(get("grad", static_cast<int>(k)));
      cs.push_back(std::move(c));
    }
    return cs;
  }();
  return cases;
}

// ---- comparison
// --------------------------------------------------------------------------
struct Tolerance {
  double atol, rtol;
};
Tolerance tolerance(Dtype dt) {
  switch (dt) {
    case Dtype::f64:
      return {1e-10, 1e-10};
    case Dtype::f32:
      return {1e-5, 1e-5};
    case Dtype::f16:
      return {2e-3, 2e-3};
    case Dtype::bf16:
      return {2e-2, 2e-2};
    default:
      return {0, 0};
  }
}

/// Worst |err| / (atol + rtol |want|) seen per dtype, for the summary each op test prints.
std::map<Dtype, double>& worst_ratio() {
  static std::map<Dtype, double> w;
  return w;
}

/// Empty when got matches want; otherwise what differs, with the worst element.
std::string compare(const Tensor& got, const Tensor& want) {
  std::ostringstream os;
  if (got.dtype() != want.dtype())
    os << "dtype " << dtype_name(got.dtype()) << ", want " << dtype_name(want.dtype()) << "; ";
  if (got.shape() != want.shape()) {
    os << "shape " << shape_str(got.shape()) << ", want " << shape_str(want.shape());
    return os.str();
  }
  std::vector<double> g = got.to_vector<double>(), w = want.to_vector<double>();
  Tolerance tol = tolerance(want.dtype());
  size_t bad = 0, worst = 0;
  double worst_excess = -1;
  for (size_t i = 0; i < g.size(); ++i) {
    bool ok;
    double excess = 0;
    if (std::isnan(w[i])) {
      ok = std::isnan(g[i]);
    } else if (std::isinf(w[i])) {
      ok = g[i] == w[i];
    } else {
      double err = std::abs(g[i] - w[i]), lim = tol.atol + tol.rtol * std::abs(w[i]);
      ok = err <= lim;  // false for a NaN got
      excess = std::isnan(err) ? std::numeric_limits<double>::infinity() : err / lim;
      if (lim > 0) worst_ratio()[want.dtype()] = std::max(worst_ratio()[want.dtype()], excess);
    }
    if (!ok) {
      ++bad;
      if (excess > worst_excess) worst_excess = excess, worst = i;
    }
  }
  if (bad)
    os << bad << " of " << g.size() << " elements differ; worst [" << worst << "] got " << g[worst]
       << ", want " << w[worst] << " (atol " << tol.atol << ", rtol " << tol.rtol << ")";
  return os.str();
}

/// The device of HETRAIN_PARITY_DEVICE; the CPU when unset.
Device parity_device() {
  static const Device d = [] {
    const char* env = std::getenv("HETRAIN_PARITY_DEVICE");
    if (!env || !*env) return Device{};
    Device dev = Device::parse(env);
    if (dev.kind != DeviceKind::cpu)
      runtime::configure({.devices = runtime::parse_devices(std::string("cpu,") + env),
                          .placement = runtime::PlacementPolicy::pinned});
    return dev;
  }();
  return d;
}

/// Names of the primitives in the graphs of `ts` that have no kernel on device kind k.
std::set<std::string> without_kernel(const std::vector<Tensor>& ts, DeviceKind k) {
  std::set<std::string> names;
  std::set<const Node*> seen;
  std::vector<const Node*> todo;
  for (const Tensor& t : ts)
    if (t.defined()) todo.push_back(t.node());
  while (!todo.empty()) {
    const Node* n = todo.back();
    todo.pop_back();
    if (!n || !seen.insert(n).second) continue;
    if (n->prim && !n->prim->has_kernel(k)) names.insert(n->prim->name());
    for (const Tensor& i : n->inputs)
      if (i.defined()) todo.push_back(i.node());
  }
  return names;
}

Tensor apply_layout(Tensor x, const json& views) {
  if (views.is_null()) return x;
  for (const json& v : views) {
    const std::string kind = v[0];
    if (kind == "transpose") {
      x = transpose(x, v[1], v[2]);
    } else if (kind == "permute") {
      x = permute(x, ints(v[1]));
    } else if (kind == "slice") {
      int64_t stop = v[3].is_null() ? std::numeric_limits<int64_t>::max() : v[3].get<int64_t>();
      x = slice(x, v[1], v[2], stop, v[4]);
    } else if (kind == "expand") {
      x = expand(x, ints(v[1]));
    } else {
      fail("[parity] unknown layout view '", kind, "'");
    }
  }
  return x;
}

/// Dropout draws its own mask, so values cannot match PyTorch's. Checked instead: every output
/// is 0 or x / (1 - p) (PyTorch's scaling, confirmed where both kept an element), the dropped
/// fraction is within 5 sigma of p, the same seed gives the same mask, and the gradient is the
/// cotangent through the same mask and scale.
std::vector<std::string> check_dropout(const Case& c, const Tensor& y,
                                       const std::vector<Tensor>& g) {
  std::vector<std::string> fails;
  const double p = c.meta["attrs"]["p"];
  const Tolerance tol = tolerance(c.in[0].dtype());
  auto x = c.in[0].to_vector<double>(), got = y.to_vector<double>();
  auto torch_y = c.out[0].to_vector<double>(), cot = c.cot[0].to_vector<double>();
  auto gx = g.empty() ? std::vector<double>() : g[0].to_vector<double>();
  size_t dropped = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double kept = x[i] / (1 - p);
    if (got[i] == 0 && x[i] != 0) ++dropped;
    if (got[i] != 0 && std::abs(got[i] - kept) > tol.atol + tol.rtol * std::abs(kept))
      fails.push_back("out[" + std::to_string(i) + "] is neither 0 nor x / (1 - p)");
    if (got[i] != 0 && torch_y[i] != 0 &&
        std::abs(got[i] - torch_y[i]) > tol.atol + tol.rtol * std::abs(torch_y[i]))
      fails.push_back("out[" + std::to_string(i) + "] kept with another scale than PyTorch");
    if (!gx.empty()) {
      double want = got[i] == 0 && x[i] != 0 ? 0 : cot[i] / (1 - p);
      if (std::abs(gx[i] - want) > tol.atol + tol.rtol * std::abs(want))
        fails.push_back("grad[" + std::to_string(i) + "] is not the cotangent through the mask");
    }
    if (fails.size() > 3) return fails;
  }
  const double n = static_cast<double>(x.size()), sigma = std::sqrt(n * p * (1 - p));
  if (std::abs(static_cast<double>(dropped) - n * p) > 5 * sigma + 1)
    fails.push_back("dropped " + std::to_string(dropped) + " of " + std::to_string(x.size()) +
                    ", expected about " + std::to_string(n * p));
  // The registry entry seeds a fresh generator from the case: a second run must agree.
  Tensor again;
  {
    DeviceScope on(parity_device());
    again = registry().at(c.meta["op"])({c.in[0]}, c.meta["attrs"])[0];
  }
  if (again.to_vector<double>() != got) fails.push_back("the same seed gave a different mask");
  return fails;
}

/// Runs one case on parity_device(); returns the failures (empty when it passes). A case whose
/// graph needs a primitive with no kernel on that device is not run: its names go to `missing`.
std::vector<std::string> run_case(const Case& c, std::set<std::string>& missing) {
  std::vector<std::string> fails;
  const Device dev = parity_device();
  DeviceScope on(dev);
  const json& m = c.meta;
  // Fresh leaves per run, so the shared reference tensors never join a graph.
  if (!m["layout"].is_array() || m["layout"].size() != c.in.size())
    fail("[parity] ", c.name, ": layout needs one entry per input");
  std::vector<Tensor> leaves, views;
  for (size_t k = 0; k < c.in.size(); ++k) {
    leaves.push_back(c.in[k].detach());
    if (is_floating(leaves.back().dtype())) leaves.back().requires_grad_();
    views.push_back(apply_layout(leaves.back(), m["layout"][k]));
  }
  std::vector<Tensor> outs = registry().at(m["op"])(views, m["attrs"]);
  if (outs.size() != c.out.size()) {
    fails.push_back("gave " + std::to_string(outs.size()) + " outputs, want " +
                    std::to_string(c.out.size()));
    return fails;
  }
  // Gradients (built before anything is evaluated, so the graph is still there).
  std::vector<Tensor> grads;
  if (!c.grad.empty()) {
    std::vector<Tensor> ys, cts, wrt;
    for (size_t k = 0; k < outs.size(); ++k)
      if (c.cot[k].defined() && is_floating(outs[k].dtype())) {
        ys.push_back(outs[k]);
        cts.push_back(c.cot[k]);
      }
    for (const json& k : m["grads"]) wrt.push_back(leaves[k.get<size_t>()]);
    grads = grad(ys, wrt, cts);
  }
  std::vector<Tensor> all = outs;
  all.insert(all.end(), grads.begin(), grads.end());
  if (dev.kind != DeviceKind::cpu) {
    std::set<std::string> no = without_kernel(all, dev.kind);
    if (!no.empty()) {
      missing.insert(no.begin(), no.end());
      return fails;
    }
  }
  eval(all);
  for (const Tensor& t : all)
    if (t.node()->prim && !(t.node()->device == dev))
      fails.push_back(std::string(t.node()->prim->name()) + " ran on " + t.node()->device.str() +
                      ", not on " + dev.str());
  if (m.contains("check") && m["check"] == "dropout") return check_dropout(c, outs[0], grads);
  for (size_t k = 0; k < outs.size(); ++k) {
    std::string d = compare(outs[k], c.out[k]);
    if (!d.empty()) fails.push_back("out" + std::to_string(k) + ": " + d);
  }
  for (size_t k = 0; k < grads.size(); ++k) {
    std::string d = compare(grads[k], c.grad[k]);
    if (!d.empty())
      fails.push_back("grad of in" + std::to_string(m["grads"][k].get<int>()) + ": " + d);
  }
  return fails;
}

std::vector<std::string> registered_ops() {
  std::vector<std::string> ops;
  for (const auto& [name, fn] : registry()) ops.push_back(name);
  return ops;
}

class OpParity : public ::testing::TestWithParam<std::string> {};

TEST_P(OpParity, MatchesPyTorch) {
  worst_ratio().clear();
  int n = 0, not_run = 0;
  std::set<std::string> missing;
  for (const Case& c : parity_cases()) {
    if (c.meta["op"] != GetParam()) continue;
    ++n;
    std::vector<std::string> fails;
    bool skipped = false;
    try {
      std::set<std::string> no;
      fails = run_case(c, no);
      skipped = !no.empty();
      missing.insert(no.begin(), no.end());
    } catch (const std::exception& e) {
      fails.push_back(std::string("threw: ") + e.what());
    }
    not_run += skipped ? 1 : 0;
    for (const auto& f : fails)
      ADD_FAILURE() << c.name << " " << GetParam() << " " << c.meta["dtype"].get<std::string>()
                    << " attrs " << c.meta["attrs"].dump() << " layout " << c.meta["layout"].dump()
                    << " (ref " << c.meta["ref"].get<std::string>() << "): " << f;
  }
  std::cout << "[parity] " << GetParam() << " on " << parity_device().str() << ": " << n
            << " cases; worst |err| / tolerance:";
  for (const auto& [dt, r] : worst_ratio()) std::cout << " " << dtype_name(dt) << " " << r;
  if (not_run > 0) {
    std::cout << "; " << not_run << " not run (no kernel there for";
    for (const std::string& m : missing) std::cout << " " << m;
    std::cout << ")";
  }
  std::cout << "\n";
  EXPECT_GT(n, 0) << "no cases for '" << GetParam() << "' in " << parity_path()
                  << "; run /usr/bin/python3 tools/gen_parity.py";
}

INSTANTIATE_TEST_SUITE_P(Parity, OpParity, ::testing::ValuesIn(registered_ops()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

TEST(ParityFile, EveryCaseHasARegisteredOp) {
  const auto& cases = parity_cases();
  EXPECT_GT(cases.size(), 100u);
  for (const Case& c : cases)
    EXPECT_TRUE(registry().count(c.meta["op"].get<std::string>()))
        << c.name << ": op '" << c.meta["op"].get<std::string>() << "' has no registry entry";
}

// The harness itself must be able to fail: a wrong value, dtype or shape is caught.
TEST(ParityFile, CompareCatchesDifferences) {
  Tensor want = from_vector<float>({1, 2, 3}, {3});
  EXPECT_EQ(compare(from_vector<float>({1, 2, 3}, {3}), want), "");
  EXPECT_NE(compare(from_vector<float>({1, 2.001f, 3}, {3}), want), "");
  EXPECT_NE(compare(from_vector<double>({1, 2, 3}, {3}), want), "");
  EXPECT_NE(compare(from_vector<float>({1, 2, 3}, {3, 1}), want), "");
  EXPECT_NE(compare(from_vector<float>({1, NAN, 3}, {3}), want), "");
  // bf16 within 2e-2 relative passes.
  Tensor wb = cast(want, Dtype::bf16);
  EXPECT_EQ(compare(cast(from_vector<float>({1, 2.01f, 3}, {3}), Dtype::bf16), wb), "");
}

}  // namespace
