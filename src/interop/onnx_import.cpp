// ONNX import: a model file becomes named parameters and a forward that builds Hetrain ops.
#include <filesystem>
#include <optional>
#include <set>
#include <sstream>

#include "hetrain/base/error.h"
#include "hetrain/graph/ops.h"
#include "hetrain/interop/onnx.h"
#include "hetrain/runtime/scheduler.h"
#include "interop/onnx_ops.h"

namespace hetrain::interop {

struct OnnxGraph {
  onnx::GraphProto graph;     // nodes and value infos; initializer data moved into params
  std::vector<int> versions;  // the resolved since_version of each node
};

OnnxModel::OnnxModel() = default;
OnnxModel::~OnnxModel() = default;
OnnxModel::OnnxModel(OnnxModel&&) noexcept = default;
OnnxModel& OnnxModel::operator=(OnnxModel&&) noexcept = default;

int64_t OnnxModel::num_parameters() const {
  int64_t n = 0;
  for (const auto& [name, t] : params_) n += t.numel();
  return n;
}

std::optional<int64_t> OnnxModel::context_metadata() const {
  auto it = metadata_.find("hetrain.context");
  if (it == metadata_.end()) return std::nullopt;
  const std::string& v = it->second;
  if (v.empty() || v.size() > 10 || v.find_first_not_of("0123456789") != std::string::npos ||
      std::stoll(v) < 1 || std::stoll(v) >= (int64_t{1} << 31))
    fail("[onnx] ", path_, ": metadata hetrain.context is '", v, "', not an integer in [1, 2^31)");
  return std::stoll(v);
}

std::map<std::string, int64_t> OnnxModel::op_counts() const {
  std::map<std::string, int64_t> out;
  if (graph_)
    for (const auto& n : graph_->graph.node())
      ++out[n.domain().empty() ? n.op_type() : n.domain() + "." + n.op_type()];
  return out;
}

std::map<std::string, std::vector<int>> onnx_supported_ops() {
  std::map<std::string, std::vector<int>> out;
  for (const auto& [op, def] : onnx_op_table()) out[op] = def.supported;
  return out;
}

namespace {

OnnxValueInfo value_info(const onnx::ValueInfoProto& vi, const std::string& path) {
  OnnxValueInfo v;
  v.name = vi.name();
  if (!vi.type().has_tensor_type())
    fail("[onnx] ", path, ": graph input/output '", vi.name(), "' is not a tensor");
  const auto& tt = vi.type().tensor_type();
  v.dtype = dtype_from_onnx(tt.elem_type(), path + ": '" + vi.name() + "'");
  if (tt.has_shape())
    for (const auto& d : tt.shape().dim()) {
      if (d.has_dim_value() && (d.dim_value() < 0 || d.dim_value() > kOnnxMaxElements))
        fail("[onnx] ", path, ": graph input/output '", vi.name(), "' has dimension ",
             d.dim_value(), ", outside [0, 2^40]");
      v.dims.push_back(d.has_dim_value() ? d.dim_value() : -1);
      v.dim_params.push_back(d.has_dim_param() ? d.dim_param() : "");
    }
  return v;
}

std::string describe(const OnnxValueInfo& v) {
  std::string s = "(";
  for (size_t i = 0; i < v.dims.size(); ++i) {
    if (i) s += ", ";
    s += v.dims[i] >= 0 ? std::to_string(v.dims[i])
                        : (v.dim_params[i].empty() ? "?" : v.dim_params[i]);
  }
  return s + ") " + std::string(dtype_name(v.dtype));
}

/// The model's default-domain opset; every node's op type and version checked against the
/// op table, all problems listed in one error.
int check_nodes(const onnx::ModelProto& m, const std::string& path, std::vector<int>& versions) {
  int opset = -1;
  for (const auto& os : m.opset_import())
    if (os.domain().empty() || os.domain() == "ai.onnx") opset = static_cast<int>(os.version());
  if (opset < 0) fail("[onnx] ", path, ": the model imports no version of the default ONNX opset");
  if (opset > kOnnxMaxImportOpset)
    fail("[onnx] ", path, ": opset ", opset, " is newer than the newest the importer knows (",
         kOnnxMaxImportOpset, ")");
  std::map<std::string, std::vector<std::string>> problems;  // "Op-version" -> node names
  const auto& table = onnx_op_table();
  for (const auto& n : m.graph().node()) {
    const std::string who =
        n.name().empty() ? "#" + std::to_string(versions.size()) : "'" + n.name() + "'";
    int v = 0;
    if (!n.domain().empty() && n.domain() != "ai.onnx") {
      problems[n.domain() + "::" + n.op_type() + " (custom domain)"].push_back(who);
    } else if (auto it = table.find(n.op_type()); it == table.end()) {
      problems[n.op_type() + " (opset " + std::to_string(opset) + ", op type not implemented)"]
          .push_back(who);
    } else {
      v = onnx_resolve_version(it->second, opset);
      const auto& sup = it->second.supported;
      if (v == 0 || std::find(sup.begin(), sup.end(), v) == sup.end())
        problems[n.op_type() + "-" + std::to_string(v) + " (opset " + std::to_string(opset) +
                 ", this version not implemented)"]
            .push_back(who);
    }
    versions.push_back(v);
  }
  if (!problems.empty()) {
    std::ostringstream os;
    os << "[onnx] " << path << ": " << problems.size()
       << " unsupported op type(s)/version(s), nothing was run:";
    for (const auto& [what, nodes] : problems) {
      os << "\n  " << what << ": " << nodes.size() << " node(s)";
      for (size_t i = 0; i < nodes.size() && i < 3; ++i) os << (i ? ", " : " ") << nodes[i];
      if (nodes.size() > 3) os << ", ...";
    }
    fail(os.str());
  }
  return opset;
}

}  // namespace

OnnxModel load_onnx(const std::string& path) {
  auto graph = std::make_unique<OnnxGraph>();
  onnx::ModelProto m;
  parse_proto_file(path, &m, "ONNX model");
  if (m.ir_version() < 3 || m.ir_version() > 10)
    fail("[onnx] ", path, ": IR version ", m.ir_version(), " is not supported (3 to 10)");
  if (!m.has_graph()) fail("[onnx] ", path, ": the model has no graph");
  OnnxModel model;
  model.path_ = path;
  model.ir_version_ = m.ir_version();
  model.opset_ = check_nodes(m, path, graph->versions);
  for (const auto& kv : m.metadata_props()) model.metadata_[kv.key()] = kv.value();
  const std::string dir = std::filesystem::path(path).parent_path().string();
  std::set<std::string> init_names;
  for (const auto& init : m.graph().initializer()) {
    if (init.name().empty()) fail("[onnx] ", path, ": an initializer has no name");
    Tensor t = tensor_from_proto(init, dir, path + ": initializer '" + init.name() + "'");
    if (is_floating(t.dtype())) t.requires_grad_(true);
    model.params_.emplace_back(init.name(), t);
    init_names.insert(init.name());
  }
  for (const auto& vi : m.graph().input())
    if (!init_names.count(vi.name())) model.inputs_.push_back(value_info(vi, path));
  for (const auto& vi : m.graph().output()) model.outputs_.push_back(value_info(vi, path));
  graph->graph = m.graph();
  graph->graph.clear_initializer();
  fuse_onnx_graph(graph->graph, graph->versions);
  model.graph_ = std::move(graph);
  return model;
}

void OnnxModel::run_node(const OnnxNodeCtx& ctx, bool fold,
                         std::map<std::string, Tensor>& env) const {
  const onnx::NodeProto& n = ctx.node;
  std::vector<Tensor> outs;
  try {
    std::optional<runtime::SimulatePause> real;  // a folded node's handler reads values too
    if (fold) real.emplace();
    const auto& table = n.domain() == kOnnxFusedDomain ? onnx_fused_op_table() : onnx_op_table();
    outs = table.at(n.op_type()).fn(ctx);
    if (fold)
      for (auto& t : outs)
        if (t.defined()) t = t.detach();
  } catch (const Error& e) {
    // Handlers' own errors start with the node ("[Op 'name'] "); core errors do not.
    const std::string what = e.what(), at = ctx.where();
    fail("[onnx] ", path_, ": node ", what.rfind(at, 0) == 0 ? what : at + what);
  }
  for (int o = 0; o < n.output_size(); ++o) {
    if (n.output(o).empty()) continue;
    if (static_cast<size_t>(o) >= outs.size())
      fail("[onnx] ", path_, ": node ", ctx.where(), "output ", o, " is not supported");
    env[n.output(o)] = outs[static_cast<size_t>(o)];
  }
}

std::vector<Tensor> OnnxModel::forward(const std::vector<Tensor>& inputs) const {
  return forward(inputs, {});
}

std::vector<Tensor> OnnxModel::forward(const std::vector<Tensor>& inputs,
                                       const std::map<std::string, Tensor>& params) const {
  if (inputs.size() != inputs_.size())
    fail("[onnx] ", path_, ": the model takes ", inputs_.size(), " input(s), got ", inputs.size());
  std::map<std::string, Tensor> env;
  for (const auto& [name, t] : params_) env[name] = t;
  for (const auto& [name, t] : params) {
    auto it = env.find(name);
    if (it == env.end()) fail("[onnx] ", path_, ": no initializer '", name, "' to replace");
    if (t.shape() != it->second.shape())
      fail("[onnx] ", path_, ": initializer '", name, "' is ", shape_str(it->second.shape()),
           ", its replacement ", shape_str(t.shape()));
    it->second = t;
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    const OnnxValueInfo& v = inputs_[i];
    const Tensor& x = inputs[i];
    bool ok = x.dtype() == v.dtype && (v.dims.empty() || v.dims.size() == x.shape().size());
    for (size_t d = 0; ok && d < v.dims.size(); ++d)
      ok = v.dims[d] < 0 || v.dims[d] == x.shape()[d];
    if (!ok)
      fail("[onnx] ", path_, ": input '", v.name, "' expects ", describe(v), ", got ",
           shape_str(x.shape()), " ", dtype_name(x.dtype()));
    env[v.name] = x;
  }
  // Constants: integer initializers, Shape's outputs and whatever is computed from constants
  // alone. Those nodes are folded (evaluated now, outside any SimulateScope) so that the shapes
  // and indices later nodes read are values, in a real run and a simulated one alike.
  std::set<std::string> constant;
  for (const auto& [name, t] : params_)
    if (!is_floating(t.dtype())) constant.insert(name);
  const auto& nodes = graph_->graph.node();
  for (int k = 0; k < nodes.size(); ++k) {
    const onnx::NodeProto& n = nodes[k];
    OnnxNodeCtx ctx{n, graph_->versions[static_cast<size_t>(k)], {}};
    bool fold = n.op_type() != "Dropout";
    for (const auto& name : n.input()) {
      if (name.empty()) {
        ctx.in.emplace_back();
        continue;
      }
      auto it = env.find(name);
      if (it == env.end())
        fail("[onnx] ", path_, ": node ", ctx.where(), "reads '", name,
             "', which no graph input, initializer or earlier node defines");
      ctx.in.push_back(it->second);
      fold = fold && constant.count(name);
    }
    run_node(ctx, fold, env);
    if (fold || n.op_type() == "Shape")
      for (const auto& name : n.output()) constant.insert(name);
  }
  std::vector<Tensor> out;
  for (const auto& v : outputs_) {
    auto it = env.find(v.name);
    if (it == env.end()) fail("[onnx] ", path_, ": graph output '", v.name, "' is never computed");
    out.push_back(it->second);
  }
  return out;
}

}  // namespace hetrain::interop

namespace hetrain::interop {

OnnxModule::OnnxModule(OnnxModel model) : model_(std::move(model)) {
  if (model_.inputs().size() != 1 || model_.outputs().empty())
    fail("[onnx] ", model_.path(), ": a module needs a model with one input, this one has ",
         model_.inputs().size());
  for (auto& [name, t] : model_.parameters()) {
    if (is_floating(t.dtype()))
      register_parameter(name, t);
    else
      register_buffer(name, t);
  }
}

Tensor OnnxModule::forward(const Tensor& x) {
  std::map<std::string, Tensor> current;
  for (auto& [name, p] : named_parameters()) current[name] = *p;
  for (auto& [name, b] : named_buffers()) current[name] = *b;
  return model_.forward({x}, current)[0];
}

}  // namespace hetrain::interop
