// hetrain export: a trained checkpoint as an ONNX model (and, on request, test data computed
// by Hetrain's own forward pass in ONNX's test-data layout).
#include <algorithm>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/onnx_cli.h"
#include "hetrain/base/error.h"
#include "hetrain/graph/ops.h"
#include "hetrain/interop/onnx.h"
#include "hetrain/training/data.h"
#include "hetrain/training/nn.h"
#include "hetrain/training/trainer.h"

namespace hetrain::cli {

namespace fs = std::filesystem;

std::vector<int64_t> parse_int_list(const std::string& text, const std::string& flag) {
  std::vector<int64_t> out;
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, ',');) {
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != item.size() || item.empty() || v <= 0)
      fail("[", flag, "] expects positive integers separated by commas, got '", text, "'");
    out.push_back(v);
  }
  if (out.empty())
    fail("[", flag, "] expects positive integers separated by commas, got '", text, "'");
  return out;
}

std::vector<std::string> write_onnx_test_data(nn::Module& model, const training::TrainConfig& cfg,
                                              const std::string& model_path,
                                              const std::vector<int64_t>& batches) {
  NoGradScope ng;
  model.eval();
  Generator gen(cfg.seed + 1234);
  std::vector<std::string> dirs;
  const fs::path base = fs::path(model_path).parent_path();
  for (size_t k = 0; k < batches.size(); ++k) {
    const int64_t b = batches[k];
    Tensor x;
    if (cfg.model == "gpt") {
      // The first set at the full context, later ones shorter: the seq axis is symbolic.
      const int64_t seq = k == 0 ? cfg.context : std::max<int64_t>(1, cfg.context / 2);
      x = cast(rand({b, seq}, 0, 256, Dtype::f32, gen), Dtype::i64).eval().detach();
    } else {
      x = randn({b, 1, 28, 28}, Dtype::f32, gen);
    }
    Tensor y = model.forward(x);
    const fs::path dir = base / ("test_data_set_" + std::to_string(k));
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) fail("[export] cannot create ", dir.string(), ": ", ec.message());
    interop::write_tensor_pb((dir / "input_0.pb").string(), x,
                             cfg.model == "gpt" ? "ids" : "image");
    interop::write_tensor_pb((dir / "output_0.pb").string(), y, "logits");
    dirs.push_back(dir.string());
  }
  return dirs;
}

/// The evaluation set as `hetrain train` evaluates it (the test images, or the validation
/// windows: batch_size per batch, at most eval_batches for text), as DIR/batch_K/input_0.npy
/// and targets_0.npy, for measuring another runtime's accuracy or loss on the same examples.
int64_t write_eval_data(const training::TrainConfig& cfg, const std::string& dir) {
  std::shared_ptr<data::Dataset> ds;
  int64_t max_batches = 0;
  if (cfg.model == "gpt") {
    data::TextCorpus corpus = data::load_text_corpus(cfg.data);
    ds = data::make_text_dataset(std::move(corpus.val), cfg.context);
    max_batches = cfg.eval_batches;
  } else {
    ds = data::load_fashion_mnist(cfg.data, "test");
  }
  int64_t k = 0;
  for (const data::Batch& b : data::DataLoader::all_batches(*ds, cfg.batch_size)) {
    if (max_batches > 0 && k >= max_batches) break;
    const fs::path d = fs::path(dir) / ("batch_" + std::to_string(k++));
    std::error_code ec;
    fs::create_directories(d, ec);
    if (ec) fail("[export] cannot create ", d.string(), ": ", ec.message());
    interop::write_npy((d / "input_0.npy").string(), b.inputs);
    interop::write_npy((d / "targets_0.npy").string(), b.targets);
  }
  return k;
}

nlohmann::json export_info_json(const interop::OnnxExportInfo& info, const std::string& path) {
  return {{"path", path},
          {"opset", info.opset},
          {"ir_version", info.ir_version},
          {"inputs", info.inputs},
          {"outputs", info.outputs},
          {"nodes", info.nodes},
          {"initializers", info.initializers},
          {"parameter_bytes", info.parameter_bytes},
          {"external_data", info.external_data},
          {"checked", info.checked}};
}

std::string export_info_line(const interop::OnnxExportInfo& info, const std::string& path) {
  std::ostringstream os;
  os << "wrote " << path << ": opset " << info.opset << ", IR " << info.ir_version << ", "
     << info.nodes << " nodes, " << info.initializers << " initializers (" << info.parameter_bytes
     << " bytes" << (info.external_data ? ", in " + path + ".data" : "") << "), "
     << (info.checked ? "checked by onnx's checker"
                      : "not checked (Debian's onnx knows opsets up to 17)");
  return os.str();
}

training::ModelFactory onnx_model_factory(training::TrainConfig& cfg, const std::string& path,
                                          bool data_given) {
  interop::OnnxModel m = interop::load_onnx(path);
  if (m.inputs().size() != 1 || m.outputs().empty())
    fail("[onnx] ", path, ": training takes a model with one input, this one has ",
         m.inputs().size());
  const interop::OnnxValueInfo& in = m.inputs()[0];
  const interop::OnnxValueInfo& out = m.outputs()[0];
  auto fixed = [](const std::vector<int64_t>& d, size_t i, int64_t v) {
    return d.size() > i && (d[i] < 0 || d[i] == v);
  };
  const bool image = in.dtype == Dtype::f32 && in.dims.size() == 4 && fixed(in.dims, 1, 1) &&
                     fixed(in.dims, 2, 28) && fixed(in.dims, 3, 28);
  const bool text = (in.dtype == Dtype::i64 || in.dtype == Dtype::i32) && in.dims.size() == 2;
  if (!image && !text)
    fail("[onnx] ", path, ": input '", in.name,
         "' must be images (N, 1, 28, 28) f32 (Fashion-MNIST) "
         "or byte ids (N, T) int64 (the text corpus) to train on the built-in datasets");
  const size_t classes_axis = image ? 1 : 2;
  if (!out.dims.empty() &&
      (out.dims.size() != classes_axis + 1 || !fixed(out.dims, classes_axis, image ? 10 : 256)))
    fail("[onnx] ", path, ": output '", out.name, "' must be ", image ? "(N, 10)" : "(N, T, 256)",
         " logits");
  cfg.model = image ? "mlp" : "gpt";  // the data family (the model itself is the file's)
  cfg.preset = "onnx:" + fs::path(path).filename().string();
  if (text && in.dims[1] > 0) cfg.context = in.dims[1];
  // A symbolic seq: Hetrain's exports record the position table's length.
  if (auto context = m.context_metadata(); text && in.dims[1] < 0 && context)
    cfg.context = std::min<int64_t>(cfg.context, *context);
  if (!data_given) cfg.data = training::preset_config(image ? "fashion-mlp" : "gpt-mini").data;
  return [path](const training::TrainConfig&) -> std::shared_ptr<nn::Module> {
    return std::make_shared<interop::OnnxModule>(interop::load_onnx(path));
  };
}

int cmd_export(const Args& raw) {
  Args args = raw;
  for (auto& a : args)
    if (a == "-o") a = "--output";
  ArgParser p("export",
              "Export a trained checkpoint (the --save directory of 'hetrain train') as an ONNX\n"
              "model in inference form: BatchNormalization with the running statistics, no\n"
              "dropout; initializers named as the safetensors tensors. Inputs and outputs:\n"
              "'image' (batch, 1, 28, 28) f32 -> 'logits' (batch, 10) for fashion-mlp and\n"
              "fashion-cnn; 'ids' (batch, seq) int64 -> 'logits' (batch, seq, 256) for gpt-mini.\n"
              "usage: hetrain export CHECKPOINT_DIR -o MODEL.onnx [flags]");
  p.option("output", "FILE", "the ONNX file to write (also -o)")
      .option("opset", "N", "ONNX opset, 13..21 (17: IR 8, checked by Debian's onnx checker)",
              std::to_string(interop::kOnnxDefaultOpset))
      .flag("fold-bn",
            "fold each BatchNormalization into the convolution before it (fashion-cnn; "
            "initializers <conv>.weight_bn_folded and <conv>.bias_bn_folded)")
      .flag("external-data",
            "write the weights to FILE.data beside the model (automatic past 2 GB)")
      .option("test-data", "B1[,B2...]",
              "also write test_data_set_K/input_0.pb and output_0.pb beside the model: random "
              "inputs of batch BK and Hetrain's outputs for them")
      .option("eval-data", "DIR",
              "also write the evaluation set as 'hetrain train' evaluates it (test images or "
              "validation windows, the run's batch size and --eval-batches) as "
              "DIR/batch_K/input_0.npy and targets_0.npy (tools/onnx_conversion_loss.py)")
      .flag("json", "print a JSON summary")
      .epilog(
          "example:\n  hetrain train --preset fashion-mlp --steps 100 --save ckpt\n"
          "  hetrain export ckpt -o fashion-mlp.onnx");
  if (!p.parse(args)) return 0;
  if (p.positional().size() != 1)
    fail("[export] expected one checkpoint directory; see 'hetrain export --help'");
  if (!p.given("output")) fail("[export] -o/--output FILE is required");
  const std::string out = p.get("output");
  interop::OnnxExportOptions opt;
  opt.opset = static_cast<int>(p.get_int("opset"));
  opt.external_data = p.get_flag("external-data");
  opt.fold_bn = p.get_flag("fold-bn");
  std::vector<int64_t> batches;
  if (p.given("test-data")) batches = parse_int_list(p.get("test-data"), "--test-data");
  auto [cfg, model] = training::load_trained_model(p.positional()[0]);
  interop::OnnxExportInfo info = interop::export_onnx(cfg, *model, out, opt);
  std::vector<std::string> sets;
  if (!batches.empty()) sets = write_onnx_test_data(*model, cfg, out, batches);
  const int64_t eval_batches = p.given("eval-data") ? write_eval_data(cfg, p.get("eval-data")) : 0;
  if (p.get_flag("json")) {
    nlohmann::json j = export_info_json(info, out);
    j["test_data"] = sets;
    if (p.given("eval-data")) j["eval_batches"] = eval_batches;
    std::cout << j.dump(2) << "\n";
  } else {
    std::cout << export_info_line(info, out) << "\n";
    for (const auto& s : sets) std::cout << "wrote " << s << "\n";
    if (p.given("eval-data"))
      std::cout << "wrote " << eval_batches << " evaluation batches to " << p.get("eval-data")
                << "\n";
  }
  return 0;
}

}  // namespace hetrain::cli
