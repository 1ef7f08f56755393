// A tiny GPT trained in-process, for the tests of where the model state lives (the state device,
// offload, ZeRO's buffers): a corpus in a temporary directory, gpt-mini shrunk to a few steps,
// and a run that records each step's loss and each parameter's values and device at the end.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "hetrain/training/nn.h"
#include "hetrain/training/trainer.h"

namespace hetrain::testing {

/// A temporary directory with corpus.txt in it, removed with the object.
class TinyCorpus {
 public:
  explicit TinyCorpus(const std::string& name)
      : dir_(std::filesystem::temp_directory_path() /
             ("hetrain_" + name + "_" + std::to_string(::getpid()))) {
    std::filesystem::create_directories(dir_);
    std::ofstream(dir_ / "corpus.txt") << std::string(4000, 'a') + "the quick brown fox jumps "
                                       << "over the lazy dog, again and again and again.\n";
  }
  ~TinyCorpus() {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  TinyCorpus(const TinyCorpus&) = delete;
  TinyCorpus& operator=(const TinyCorpus&) = delete;

  const std::filesystem::path& dir() const { return dir_; }
  std::string corpus() const { return (dir_ / "corpus.txt").string(); }

 private:
  std::filesystem::path dir_;
};

/// gpt-mini on `corpus`, `layers` x `width` with two heads, 3 steps of `batch` windows of
/// `context` bytes, one thread, no dropout, no progress bar and no final evaluation.
inline training::TrainConfig tiny_gpt_config(const std::string& corpus, int64_t layers,
                                             int64_t width, int64_t context, int64_t batch) {
  training::TrainConfig c = training::preset_config("gpt-mini");
  c.data = corpus;
  c.layers = layers;
  c.width = width;
  c.heads = 2;
  c.context = context;
  c.batch_size = batch;
  c.steps = 3;
  c.dropout = 0;
  c.threads = 1;
  c.progress = false;
  c.final_eval = false;
  return c;
}

struct RecordedRun {
  std::vector<double> losses;                        // one per step
  std::map<std::string, std::vector<float>> params;  // at the end
  std::map<std::string, std::string> where;          // parameter -> device of its array
};

/// Trains c, recording the losses and the final parameters and where they are.
inline RecordedRun train_recording(const training::TrainConfig& c) {
  RecordedRun r;
  training::StepHooks hooks;
  hooks.end = [&](int64_t, double loss) { r.losses.push_back(loss); };
  hooks.finished = [&](nn::Module& model) {
    for (auto& [name, p] : model.named_parameters()) {
      r.where[name] = p->array().device().str();
      r.params[name] = p->to_vector<float>();
    }
  };
  training::train(c, hooks);
  return r;
}

}  // namespace hetrain::testing
