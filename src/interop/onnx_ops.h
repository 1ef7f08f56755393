// The importer's op table: for each ONNX op type, the opset versions at which its schema
// changed (since_version) and those whose semantics the handler implements, and the handler
// that builds Hetrain ops for one node.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "hetrain/graph/tensor.h"
#include "interop/onnx_proto.h"

namespace hetrain::interop {

/// One node being built: its proto, the resolved since_version, its input tensors (undefined
/// for omitted optional inputs).
struct OnnxNodeCtx {
  const onnx::NodeProto& node;
  int version = 0;
  std::vector<Tensor> in;

  const onnx::AttributeProto* attr(const std::string& name) const;
  int64_t attr_int(const std::string& name, int64_t def) const;
  double attr_float(const std::string& name, double def) const;
  std::string attr_string(const std::string& name, const std::string& def) const;
  std::vector<int64_t> attr_ints(const std::string& name) const;
  bool has_attr(const std::string& name) const { return attr(name) != nullptr; }
  bool has_input(size_t i) const { return i < in.size() && in[i].defined(); }
  /// Input i evaluated to integers (a shape, axes, sizes); empty when the input is omitted.
  std::vector<int64_t> ints(size_t i) const;
  /// Throws when input i's values are not known while building (simulation, not a constant).
  void check_known(size_t i) const;
  /// "[Conv 'conv1'] " for errors.
  std::string where() const;
};

/// ONNX Reshape's target for an input of shape `in`: a 0 copies the input's dim (unless
/// allow_zero), at most one -1 (left for reshape to infer); sizes bounded, errors naming the node.
Shape onnx_reshape_target(const OnnxNodeCtx& c, const Shape& in, std::vector<int64_t> shape,
                          bool allow_zero);

using OnnxHandler = std::function<std::vector<Tensor>(const OnnxNodeCtx&)>;

struct OnnxOpDef {
  std::vector<int> versions;   // every since_version of the op up to kOnnxMaxOpset
  std::vector<int> supported;  // those the handler implements
  OnnxHandler fn;
};

// Handlers of the neural-network ops (onnx_ops_nn.cpp).
std::vector<Tensor> onnx_gemm(const OnnxNodeCtx& c);
std::vector<Tensor> onnx_conv(const OnnxNodeCtx& c);
std::vector<Tensor> onnx_pool(const OnnxNodeCtx& c, bool is_max);
std::vector<Tensor> onnx_global_avg_pool(const OnnxNodeCtx& c);
std::vector<Tensor> onnx_batch_norm(const OnnxNodeCtx& c);
std::vector<Tensor> onnx_layer_norm(const OnnxNodeCtx& c);
std::vector<Tensor> onnx_dropout(const OnnxNodeCtx& c);

/// Op type (default domain) -> definition.
const std::map<std::string, OnnxOpDef>& onnx_op_table();

/// The domain of the nodes import-time fusion writes (onnx_fusion.cpp).
inline constexpr const char* kOnnxFusedDomain = "hetrain";
/// Replaces the subgraphs the fusion rules recognise (tanh-GELU, causal attention on a packed
/// projection) by single nodes of kOnnxFusedDomain; versions follows the node list.
void fuse_onnx_graph(onnx::GraphProto& g, std::vector<int>& versions);
/// Fused op type -> definition (version 1).
const std::map<std::string, OnnxOpDef>& onnx_fused_op_table();

/// The since_version of `op` in a model importing `opset`: the newest version <= opset; 0
/// when the op did not exist yet.
int onnx_resolve_version(const OnnxOpDef& def, int opset);

}  // namespace hetrain::interop
