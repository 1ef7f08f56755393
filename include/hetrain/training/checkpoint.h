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
//
// Sharded checkpoints (version 3, ZeRO): each of the N ranks that trained writes one file,
// shard-<rank>.<generation>.safetensors, holding pieces of the checkpoint's tensors (1-D runs
// of a tensor's flat elements, named "<part>:<tensor>@<first element>"); then one rank commits
// the index, which names the N shard files with their sizes and CRC-32s and lists every part's
// metadata and tensors (dtype, shape). read() gathers the pieces into whole tensors: the same
// Contents a plain checkpoint gives, so a sharded checkpoint loads at any rank count and stage.
// Every element of every tensor must come from exactly one piece; a missing, extra, truncated
// or foreign shard file is refused by name.
//
//   uint64_t gen = checkpoint::begin_sharded(dir);                       // rank 0, broadcast
//   Written w = checkpoint::write_shard(dir, gen, rank, world, pieces);  // every rank
//   checkpoint::commit_sharded(dir, step, gen, stage, parts, all_w);     // rank 0, after all
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "hetrain/interop/safetensors.h"
#include "hetrain/training/checkpoint_piece.h"

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
  int version = 0;  // 3: sharded; 2: indexed; 1: the two files without an index
  std::map<std::string, safetensors::File> parts;
  std::map<std::string, std::string> files;  // part -> path of its file (the index if sharded)
  // Sharded checkpoints: the ranks that wrote it, their ZeRO stage, the shard files by rank.
  int world_size = 1;
  int stage = 0;
  std::vector<std::string> shard_files;
};

/// Reads the checkpoint in dir: the index, each part it names, each checked against the
/// index's size and CRC-32. Throws Error naming the directory or file at fault.
Contents read(const std::string& dir);

// ---- sharded checkpoints ------------------------------------------------------------------

/// A part of a sharded checkpoint as the index lists it: metadata and its tensors' layout
/// (Piece and TensorLayout: checkpoint_piece.h).
struct ShardedPart {
  std::string name;
  std::map<std::string, TensorLayout> tensors;
  std::map<std::string, std::string> metadata;
};
/// A shard file as written: its size and CRC-32 (safetensors::Written).
using ShardWritten = safetensors::Written;

/// Creates dir when missing and returns the generation the next checkpoint's files take.
uint64_t begin_sharded(const std::string& dir);
/// The file name of a rank's shard: "shard-<rank>.<generation>.safetensors".
std::string shard_file(int rank, uint64_t generation);
/// Writes this rank's shard file (fsynced). Throws Error naming the file.
ShardWritten write_shard(const std::string& dir, uint64_t generation, int rank, int world_size,
                         const std::vector<Piece>& pieces);
/// Commits the checkpoint: the index naming shards[r] as rank r's file, then removes the
/// previous generation's files. Call after every rank's write_shard returned.
void commit_sharded(const std::string& dir, int64_t step, uint64_t generation, int stage,
                    const std::vector<ShardedPart>& parts, const std::vector<ShardWritten>& shards);

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
