// ONNX's backend node tests (Debian's libonnx-testdata, onnx 1.12; or, with
// HETRAIN_ONNX_NODE_TESTS=DIR, another copy such as the onnx PyPI package's
// onnx/backend/test/data/node: tests/cli/onnx_node_suite_pypi.sh) for the op types the
// importer implements: each test's model run on its inputs and compared with its outputs
// (rtol 1e-3, atol 1e-7, as ONNX's runner). Prints the pass rate per op; docs/ONNX.md quotes it.
#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "hetrain/base/error.h"
#include "hetrain/graph/ops.h"
#include "hetrain/interop/onnx.h"

using namespace hetrain;
namespace fs = std::filesystem;

namespace {

const char* const kDebianNodeTests = "/usr/share/libonnx-testdata/data/node";

// The op types issue 26 lists.
const std::set<std::string> kListed = {"Gemm",
                                       "MatMul",
                                       "Add",
                                       "Sub",
                                       "Mul",
                                       "Div",
                                       "Pow",
                                       "Sqrt",
                                       "Exp",
                                       "Log",
                                       "Tanh",
                                       "Sigmoid",
                                       "Erf",
                                       "Relu",
                                       "Gelu",
                                       "Softmax",
                                       "LogSoftmax",
                                       "Conv",
                                       "BatchNormalization",
                                       "LayerNormalization",
                                       "MaxPool",
                                       "AveragePool",
                                       "GlobalAveragePool",
                                       "Flatten",
                                       "Gather",
                                       "Reshape",
                                       "Transpose",
                                       "Concat",
                                       "Split",
                                       "Slice",
                                       "Squeeze",
                                       "Unsqueeze",
                                       "Expand",
                                       "Where",
                                       "Equal",
                                       "ReduceMean",
                                       "ReduceSum",
                                       "Dropout",
                                       "Identity",
                                       "Constant",
                                       "Shape",
                                       "Cast",
                                       "Trilu",
                                       "Range"};

// Tests left out, and why: types Hetrain has no tensors for, test data that contradicts its
// model, and random outputs no implementation can reproduce.
const std::map<std::string, std::string> kExcluded = {
    {"test_cast_FLOAT_to_STRING", "strings are not tensors Hetrain holds"},
    {"test_cast_STRING_to_FLOAT", "strings are not tensors Hetrain holds"},
    {"test_cast_BFLOAT16_to_FLOAT", "the test data stores the bfloat16 input as UINT16"},
    {"test_cast_FLOAT_to_BFLOAT16", "the test data stores the bfloat16 output as UINT16"},
    {"test_identity_opt", "optional types are not tensors"},
    {"test_identity_sequence", "sequence types are not tensors"},
    {"test_pow_types_float32_uint64", "uint64 has no Hetrain dtype"},
    {"test_training_dropout", "random mask (numpy's generator)"},
    {"test_training_dropout_default", "random mask (numpy's generator)"},
    {"test_training_dropout_default_mask", "random mask (numpy's generator)"},
    {"test_training_dropout_mask", "random mask (numpy's generator)"},
};

/// Why a model is left out whatever the op: an element type Hetrain has no dtype for (strings,
/// uint64, complex, fp8, int4, ...) or an opset newer than the importer's; "" otherwise.
std::string excluded_by_model(const onnx::ModelProto& m) {
  for (const auto& os : m.opset_import())
    if ((os.domain().empty() || os.domain() == "ai.onnx") &&
        os.version() > interop::kOnnxMaxImportOpset)
      return "opset " + std::to_string(os.version()) + " is newer than the importer's newest";
  static const std::set<int> held = {
      onnx::TensorProto::FLOAT,    onnx::TensorProto::DOUBLE, onnx::TensorProto::FLOAT16,
      onnx::TensorProto::BFLOAT16, onnx::TensorProto::INT8,   onnx::TensorProto::UINT8,
      onnx::TensorProto::INT16,    onnx::TensorProto::UINT16, onnx::TensorProto::INT32,
      onnx::TensorProto::UINT32,   onnx::TensorProto::INT64,  onnx::TensorProto::BOOL};
  for (const auto* values : {&m.graph().input(), &m.graph().output()})
    for (const auto& v : *values) {
      if (!v.type().has_tensor_type()) return "'" + v.name() + "' is not a tensor";
      if (!held.count(v.type().tensor_type().elem_type()))
        return "'" + v.name() + "' has an element type Hetrain has no dtype for";
    }
  return "";
}

/// Runs every test_data_set_K of a node-test directory; "" when all outputs agree (NumPy's
/// allclose rule with ONNX's runner tolerances), else the first disagreement.
std::string run_one(const fs::path& dir) {
  interop::OnnxModel m = interop::load_onnx((dir / "model.onnx").string());
  for (const auto& set : fs::directory_iterator(dir)) {
    if (set.path().filename().string().rfind("test_data_set_", 0) != 0) continue;
    std::vector<Tensor> inputs;
    for (size_t k = 0; k < m.inputs().size(); ++k)
      inputs.push_back(interop::read_tensor_file(
          (set.path() / ("input_" + std::to_string(k) + ".pb")).string()));
    NoGradScope ng;
    std::vector<Tensor> outs = m.forward(inputs);
    for (size_t k = 0; k < outs.size(); ++k) {
      Tensor want = interop::read_tensor_file(
          (set.path() / ("output_" + std::to_string(k) + ".pb")).string());
      if (outs[k].shape() != want.shape())
        return "output " + std::to_string(k) + " shape " + shape_str(outs[k].shape()) + " vs " +
               shape_str(want.shape());
      if (outs[k].dtype() != want.dtype())
        return "output " + std::to_string(k) + " is " + std::string(dtype_name(outs[k].dtype())) +
               ", not " + std::string(dtype_name(want.dtype()));
      std::vector<double> g = outs[k].to_vector<double>(), w = want.to_vector<double>();
      for (size_t i = 0; i < g.size(); ++i) {
        if (g[i] == w[i] || (std::isnan(g[i]) && std::isnan(w[i]))) continue;  // infinities too
        if (!(std::fabs(g[i] - w[i]) <= 1e-7 + 1e-3 * std::fabs(w[i])))
          return "output " + std::to_string(k) + "[" + std::to_string(i) + "] " +
                 std::to_string(g[i]) + " vs " + std::to_string(w[i]);
      }
    }
  }
  return "";
}

TEST(OnnxNodeSuite, ListedOpsPassAtLeast95Percent) {
  const char* env = std::getenv("HETRAIN_ONNX_NODE_TESTS");
  const std::string kNodeTests = env ? env : kDebianNodeTests;
  if (!fs::is_directory(kNodeTests)) {
    if (std::getenv("CI") || env) FAIL() << kNodeTests << " is missing";
    GTEST_SKIP() << kNodeTests << " is missing (Debian package libonnx-testdata)";
  }
  std::printf("node tests from %s\n", kNodeTests.c_str());
  std::map<std::string, std::pair<int, int>> per_op;  // passed, run
  std::vector<std::string> failures;
  int excluded = 0;
  std::vector<fs::path> dirs;
  for (const auto& e : fs::directory_iterator(kNodeTests)) dirs.push_back(e.path());
  std::sort(dirs.begin(), dirs.end());
  for (const auto& dir : dirs) {
    const std::string name = dir.filename().string();
    if (name.ends_with("_expanded")) continue;
    onnx::ModelProto proto;
    std::ifstream f(dir / "model.onnx", std::ios::binary);
    if (!proto.ParseFromIstream(&f)) continue;
    std::set<std::string> types;
    for (const auto& n : proto.graph().node()) types.insert(n.op_type());
    if (types.size() != 1 || !kListed.count(*types.begin())) continue;
    if (kExcluded.count(name) || !excluded_by_model(proto).empty()) {
      ++excluded;
      continue;
    }
    std::string problem;
    try {
      problem = run_one(dir);
    } catch (const std::exception& e) {
      problem = e.what();
    }
    auto& [passed, run] = per_op[*types.begin()];
    ++run;
    if (problem.empty())
      ++passed;
    else
      failures.push_back(name + ": " + problem.substr(0, 240));
  }
  int passed = 0, run = 0;
  std::printf("%-20s %s\n", "op", "passed/run");
  for (const auto& [op, pr] : per_op) {
    std::printf("%-20s %d/%d\n", op.c_str(), pr.first, pr.second);
    passed += pr.first;
    run += pr.second;
  }
  std::printf("overall %d/%d (%.1f%%), %d excluded\n", passed, run,
              100.0 * passed / std::max(run, 1), excluded);
  for (const auto& f : failures) std::printf("failed: %s\n", f.c_str());
  // onnx 1.12 (Debian) has 264 such tests, onnx 1.17 (PyPI) 290.
  EXPECT_GE(run, 250) << "fewer node tests found than onnx has for these ops";
  EXPECT_GE(passed * 100, run * 95) << passed << " of " << run << " passed";
}

/// The node-test directories Hetrain imports, of the directories named in `dirs` (':'-separated):
/// load_onnx accepts the model and no element type or opset rules it out.
std::vector<fs::path> importable_models(const std::string& dirs, int& seen) {
  std::vector<fs::path> out;
  std::stringstream list(dirs);
  for (std::string d; std::getline(list, d, ':');) {
    if (d.empty()) continue;
    std::vector<fs::path> models;
    for (const auto& e : fs::directory_iterator(d))
      if (fs::is_regular_file(e.path() / "model.onnx")) models.push_back(e.path());
    std::sort(models.begin(), models.end());
    for (const auto& dir : models) {
      ++seen;
      onnx::ModelProto proto;
      std::ifstream f(dir / "model.onnx", std::ios::binary);
      if (!proto.ParseFromIstream(&f) || !excluded_by_model(proto).empty()) continue;
      try {
        interop::load_onnx((dir / "model.onnx").string());
      } catch (const std::exception&) {
        continue;
      }
      out.push_back(dir);
    }
  }
  return out;
}

std::string read_text(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Random inputs through Hetrain and onnxruntime: every node-test model (expanded ones too, of
// both copies) that Hetrain imports gets random inputs of its declared shapes and types from
// tools/onnx_random_cases.py (fixed seed; domains respected: positive for Log/Sqrt/Pow's base,
// valid Gather indices, shape-deciding inputs kept from the test), which writes onnxruntime's
// outputs beside them (CPU, optimisations off); Hetrain must agree with every one of them to
// ONNX's runner tolerances. Run by tests/cli/onnx_node_random.sh (ctest
// interop.onnx_node_random), which passes the venv's Python, the node-test directories and a
// scratch directory. Exclusions, each printed with its reason: element types Hetrain or numpy
// cannot hold (strings, uint64, complex, fp8, int4; bfloat16 has no numpy type to feed
// onnxruntime), non-tensor values, opsets newer than the importer's, and random outputs
// (Dropout in training mode with a non-zero ratio, Random* ops).
TEST(OnnxNodeSuite, RandomInputsAgreeWithOnnxruntime) {
  const char* py = std::getenv("HETRAIN_ONNX_PYTHON");
  const char* dirs = std::getenv("HETRAIN_ONNX_RANDOM_NODE_DIRS");
  const char* scratch = std::getenv("HETRAIN_ONNX_RANDOM_OUT");
  const char* src = std::getenv("HETRAIN_SOURCE_DIR");
  if (!py || !dirs || !scratch || !src)
    GTEST_SKIP() << "run by ctest -R onnx_node_random (needs the onnx/onnxruntime venv)";
  int seen = 0;
  const std::vector<fs::path> models = importable_models(dirs, seen);
  std::printf("%zu of %d node-test models import\n", models.size(), seen);
  std::fflush(stdout);
  const fs::path out = fs::path(scratch) / "cases", list = fs::path(scratch) / "models.txt";
  {
    std::ofstream f(list);
    for (const auto& m : models) f << m.string() << "\n";
  }
  const std::string cmd = "'" + std::string(py) + "' '" + src + "/tools/onnx_random_cases.py' '" +
                          out.string() + "' '" + list.string() + "'";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::vector<fs::path> cases;
  for (const auto& e : fs::directory_iterator(out)) cases.push_back(e.path());
  std::sort(cases.begin(), cases.end());
  std::map<std::string, int> per_op;
  std::vector<std::string> failures, excluded, refused;
  int compared = 0;
  for (const auto& dir : cases) {
    const std::string name = dir.filename().string();
    if (fs::exists(dir / "excluded.txt")) {
      excluded.push_back(name + ": " + read_text(dir / "excluded.txt"));
      continue;
    }
    std::string problem;
    if (fs::exists(dir / "ort_error.txt")) {
      problem = "onnxruntime refused the random inputs: " + read_text(dir / "ort_error.txt");
    } else {
      try {
        problem = run_one(dir);
      } catch (const std::exception& e) {
        problem = e.what();
        // What the handlers refuse by design (3-D or dilated pooling, MaxPool's Indices), each
        // an error naming the node; anything else that throws is a failure.
        if (problem.find("] only 1-D and 2-D inputs are supported") != std::string::npos ||
            problem.find("] dilations other than 1 are not supported") != std::string::npos ||
            problem.find("] the Indices output is not supported") != std::string::npos) {
          refused.push_back(name + ": " + problem.substr(problem.find("node ")));
          continue;
        }
      }
    }
    ++compared;
    if (!problem.empty()) failures.push_back(name + ": " + problem.substr(0, 300));
    onnx::ModelProto proto;
    std::ifstream f(dir / "model.onnx", std::ios::binary);
    if (proto.ParseFromIstream(&f))
      for (const auto& n : proto.graph().node()) ++per_op[n.op_type()];
  }
  std::printf("op types in the compared models (nodes):");
  for (const auto& [op, count] : per_op) std::printf(" %s %d", op.c_str(), count);
  std::printf("\n");
  for (const auto& e : excluded) std::printf("excluded: %s\n", e.c_str());
  for (const auto& r : refused) std::printf("refused by Hetrain: %s\n", r.c_str());
  for (const auto& f : failures) std::printf("DISAGREES: %s\n", f.c_str());
  std::printf(
      "compared %d distinct models with onnxruntime on random inputs: %zu disagree; "
      "%zu excluded, %zu refused by Hetrain at run time\n",
      compared, failures.size(), excluded.size(), refused.size());
  EXPECT_TRUE(failures.empty()) << failures.size() << " of " << compared << " models disagree";
  EXPECT_GE(compared, 300) << "fewer models compared than the node tests hold for Hetrain's ops";
}

}  // namespace
