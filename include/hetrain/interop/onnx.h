// ONNX export and import (https://onnx.ai), through Debian's libonnx (generated protobuf
// classes and the C++ checker).
//
//   using namespace hetrain;
//   // export: a model built by training::build_model, in inference form
//   interop::export_onnx(cfg, *model, "model.onnx", {.opset = 17});
//   // import: initializers become named parameters; forward builds an ordinary Hetrain graph
//   interop::OnnxModel m = interop::load_onnx("model.onnx");
//   std::vector<Tensor> outs = m.forward({x});
//
// Exported graphs (docs/ONNX.md): inputs "image" (batch, 1, 28, 28) f32 for fashion-mlp and
// fashion-cnn, "ids" (batch, seq) i64 for gpt-mini; output "logits". Initializers carry the
// safetensors names ("blocks.0.attn.qkv.weight") and their data in raw_data, or in a file
// beside the model with external data.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "hetrain/graph/tensor.h"
#include "hetrain/training/nn.h"

namespace hetrain::training {
struct TrainConfig;
}

namespace hetrain::interop {

/// The opset versions the exporter writes, and the newest the importer reads (onnx 1.17's).
inline constexpr int kOnnxDefaultOpset = 17;
inline constexpr int kOnnxMaxOpset = 21;
inline constexpr int kOnnxMaxImportOpset = 22;

struct OnnxExportOptions {
  int opset = kOnnxDefaultOpset;  // 17 (IR 8, Debian's checker) .. 21; Gelu is one node from 20
  bool external_data = false;     // weights in `<model>.data` beside the model
  /// Each BatchNormalization folded into the convolution before it: a Conv with weight
  /// W * gamma / sqrt(var + eps) per output channel and bias beta - mean * that scale
  /// (initializers `<conv>.weight_bn_folded`, `<conv>.bias_bn_folded`).
  bool fold_bn = false;
  /// Models whose initializers pass this many bytes get external data whatever the flag says
  /// (protobuf cannot serialise a message of 2 GiB or more).
  int64_t external_threshold_bytes = int64_t{2000} << 20;
  std::string producer = "hetrain";
};

/// What export_onnx wrote.
struct OnnxExportInfo {
  int opset = 0;
  int64_t ir_version = 0;
  bool external_data = false;
  bool checked = false;  // by onnx's C++ checker (opset <= 17, IR <= 8)
  std::vector<std::string> inputs, outputs;
  int64_t initializers = 0, parameter_bytes = 0, nodes = 0;
};

/// Exports cfg's model (the preset's family: mlp, cnn or gpt; weights from `model`, which must
/// be the model training::build_model(cfg) builds) in inference form: BatchNormalization with
/// the running statistics, no dropout. The graph is checked before anything is written, and the
/// file is written atomically (temporary file, fsync, rename; an existing non-regular path such
/// as /dev/stdout is written through). Throws Error naming what cannot be expressed.
OnnxExportInfo export_onnx(const training::TrainConfig& cfg, nn::Module& model,
                           const std::string& path, const OnnxExportOptions& opt = {});

struct OnnxValueInfo {
  std::string name;
  Dtype dtype = Dtype::f32;
  /// Dimensions; -1 where symbolic or unknown (dim_params holds the symbol, or "").
  std::vector<int64_t> dims;
  std::vector<std::string> dim_params;
};

struct OnnxGraph;    // the parsed nodes (onnx_import.cpp)
struct OnnxNodeCtx;  // one node being built (onnx_ops.h)

/// An imported ONNX model: its initializers as named parameter leaves (requires_grad for
/// floating ones) and a forward that builds a Hetrain graph from its nodes.
class OnnxModel {
 public:
  OnnxModel();
  ~OnnxModel();
  OnnxModel(OnnxModel&&) noexcept;
  OnnxModel& operator=(OnnxModel&&) noexcept;

  const std::string& path() const { return path_; }
  int64_t ir_version() const { return ir_version_; }
  int opset() const { return opset_; }
  const std::vector<OnnxValueInfo>& inputs() const { return inputs_; }
  /// The model's metadata_props (Hetrain's exports: hetrain.preset, hetrain.context, ...).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  /// The hetrain.context metadata (the position table's length of Hetrain's GPT exports), when
  /// present; an error naming the file unless it is an integer in [1, 2^31).
  std::optional<int64_t> context_metadata() const;
  const std::vector<OnnxValueInfo>& outputs() const { return outputs_; }
  /// Initializers by name, in file order.
  std::vector<std::pair<std::string, Tensor>>& parameters() { return params_; }
  int64_t num_parameters() const;
  /// Node count per op type ("Conv": 3, ...).
  std::map<std::string, int64_t> op_counts() const;

  /// Builds the graph on these inputs (graph-input order, initializers excluded) and returns
  /// the outputs in graph-output order. Nodes computed from constants alone (integer
  /// initializers, Constant, Shape: the shape subgraphs) are folded, evaluated while building
  /// even under runtime::SimulateScope; everything else stays lazy, so grad works through it.
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) const;
  /// The same with some initializers replaced by name (a module's current parameters).
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs,
                              const std::map<std::string, Tensor>& params) const;

 private:
  friend OnnxModel load_onnx(const std::string& path);
  /// Builds one node into env; fold: its inputs are constants, evaluate its outputs now.
  void run_node(const OnnxNodeCtx& ctx, bool fold, std::map<std::string, Tensor>& env) const;
  std::string path_;
  int64_t ir_version_ = 0;
  int opset_ = 0;
  std::vector<OnnxValueInfo> inputs_, outputs_;
  std::map<std::string, std::string> metadata_;
  std::vector<std::pair<std::string, Tensor>> params_;
  std::unique_ptr<OnnxGraph> graph_;
};

/// An imported model as a trainable module: floating initializers are its parameters and the
/// others its buffers, under their ONNX names (so checkpoints and optimizers see them as any
/// module's); forward(x) runs the graph on its single input and returns its first output.
class OnnxModule : public nn::Module {
 public:
  explicit OnnxModule(OnnxModel model);
  Tensor forward(const Tensor& x) override;
  const OnnxModel& model() const { return model_; }

 private:
  OnnxModel model_;
};

/// Reads an ONNX file (external data resolved beside it). Every node whose op type, domain or
/// opset version the importer does not implement is listed in one error, before anything runs.
OnnxModel load_onnx(const std::string& path);

/// The op types load_onnx implements and, for each, the opset versions whose semantics it
/// implements (the schema's since_version).
std::map<std::string, std::vector<int>> onnx_supported_ops();

/// A tensor from an ONNX TensorProto file (.pb, the layout of ONNX's test data) or a NumPy
/// .npy file; the error names the file and the field at fault.
Tensor read_tensor_file(const std::string& path);
/// Writes a tensor as .npy (format 1.0, little-endian, C order), atomically.
void write_npy(const std::string& path, const Tensor& t);
/// Writes a tensor as an ONNX TensorProto (.pb), atomically.
void write_tensor_pb(const std::string& path, const Tensor& t, const std::string& name = "");

}  // namespace hetrain::interop
