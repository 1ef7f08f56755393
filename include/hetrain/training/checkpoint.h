// A training checkpoint directory: safetensors files ("parts": the weights, the training state)
// and an index, checkpoint.json, that names them with their sizes and CRC-32s.
//
//   checkpoint::write(dir, step, {{"model", weights, {}}, {"train_state", state, meta}});
//   checkpoint::Contents c = checkpoint::read(dir);   // c.parts.at("model").tensors ...
//
// The index is the commit point. A write puts every part in a new file (model.<generation>.
// safetensors), fsyncs it, then replaces the index atomically, and only then removes the
// previous generation's files. A crash or a full disk at any moment leaves the directory at
// the old checkpoint or at the new one, both complete; a part that does not match the index
// (a file copied in from another checkpoint, a torn or edited file) is refused by name.
// Directories written before the index existed (model.safetensors and train_state.safetensors,
// version 1) are still read.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "hetrain/interop/safetensors.h"

namespace hetrain::training::checkpoint {

constexpr const char* kIndexFile = "checkpoint.json";

struct Part {
  std::string name;  // "model", "train_state": a plain word, the file's stem
  std::vector<std::pair<std::string, Tensor>> tensors;
  std::map<std::string, std::string> metadata;
};

/// Writes the parts as the checkpoint of `step` into dir (created if missing). Throws Error
/// naming the file on failure, with dir still holding its previous checkpoint.
void write(const std::string& dir, int64_t step, const std::vector<Part>& parts);

struct Contents {
  int64_t step = 0;
  int version = 0;  // 2: indexed; 1: the two files without an index
  std::map<std::string, safetensors::File> parts;
  std::map<std::string, std::string> files;  // part -> path of its file, for messages
};

/// Reads the checkpoint in dir: the index, each part it names, each checked against the
/// index's size and CRC-32. Throws Error naming the directory or file at fault.
Contents read(const std::string& dir);

/// Whether dir holds a checkpoint (an index, or a version-1 pair).
bool exists(const std::string& dir);

/// The checkpoint to resume from in dir: dir's own or one of the step-<N> subdirectories that
/// periodic saves (--save-every) write, whichever is at the highest step. A subdirectory without
/// an index (a save killed before its commit point) is not a checkpoint and is skipped. dir itself
/// when it holds none, or when its own index is damaged (read() then says what is wrong).
std::string latest(const std::string& dir);

/// A metadata field read as a whole integer: "12abc", "", "+-1" and out-of-range values are
/// refused. Throws Error naming the file and the field.
int64_t metadata_int(const std::map<std::string, std::string>& m, const std::string& key,
                     const std::string& file);
uint64_t metadata_uint(const std::map<std::string, std::string>& m, const std::string& key,
                       const std::string& file);

}  // namespace hetrain::training::checkpoint
