// Pieces of the ONNX subcommands shared with `hetrain train --export-onnx`.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "hetrain/interop/onnx.h"
#include "hetrain/planning/model_spec.h"
#include "hetrain/training/trainer.h"

namespace hetrain::nn {
class Module;
}

namespace hetrain::cli {

/// "8,3" -> {8, 3}; the error names the flag.
std::vector<int64_t> parse_int_list(const std::string& text, const std::string& flag);
/// Writes test_data_set_K/{input_0,output_0}.pb beside model_path: random inputs of batch
/// batches[K] and the model's outputs for them. Returns the directories.
std::vector<std::string> write_onnx_test_data(nn::Module& model, const training::TrainConfig& cfg,
                                              const std::string& model_path,
                                              const std::vector<int64_t>& batches);
nlohmann::json export_info_json(const interop::OnnxExportInfo& info, const std::string& path);
std::string export_info_line(const interop::OnnxExportInfo& info, const std::string& path);

/// Points cfg at an imported model for train/profile/simulate --onnx: an input `(N, 1, 28, 28)`
/// f32 trains on Fashion-MNIST, `(N, T)` integer ids on the text corpus (context T when fixed);
/// the outputs must be 10 logits per image or 256 per position. data_given: --data was set (else
/// the family's default dataset). Returns the factory that builds it as a trainable module.
training::ModelFactory onnx_model_factory(training::TrainConfig& cfg, const std::string& path,
                                          bool data_given);

/// An imported model described for the planner (onnx_plan.cpp): its graph built for one sample,
/// read node by node; symbolic axes after the batch take `seq` (else the file's hetrain.context).
planning::ModelSpec onnx_model_spec(const std::string& path, std::optional<int64_t> seq);

}  // namespace hetrain::cli
