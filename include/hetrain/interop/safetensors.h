// safetensors checkpoints (https://github.com/huggingface/safetensors):
//
//   using namespace hetrain;
//   safetensors::save("model.safetensors", {{"w", w}, {"b", b}}, {{"step", "100"}});
//   safetensors::File f = safetensors::load("model.safetensors");
//   Tensor w2 = f.tensors.at("w");
//
// Layout: an 8-byte little-endian header length N, N bytes of JSON {name: {"dtype", "shape",
// "data_offsets": [begin, end]}, "__metadata__": {str: str}}, then the tensor data, row-major
// and contiguous, offsets relative to the end of the header.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "hetrain/graph/tensor.h"

namespace hetrain::safetensors {

/// What save wrote: the file's size and the CRC-32 (zlib's) of all its bytes.
struct Written {
  uint64_t bytes = 0;
  uint32_t crc32 = 0;
};

/// Writes tensors (evaluated as needed) in the safetensors format. Dtype names F64 F32 F16 BF16
/// I32 I64 BOOL. Written by write_output_file (base/file_output.h): a temporary file in the same
/// directory, fsync, rename; an existing file is never left half-written. Throws Error naming
/// the file on failure.
Written save(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
             const std::map<std::string, std::string>& metadata = {});

struct File {
  std::map<std::string, Tensor> tensors;
  std::map<std::string, std::string> metadata;
  uint64_t bytes = 0;  // the file's size
  uint32_t crc32 = 0;  // CRC-32 of the whole file, as Written reports it
};

/// Reads and validates everything (header length against file size, JSON, dtype names, shapes,
/// offsets in order, contiguous and in bounds, sizes = numel * itemsize); an error names the
/// file and the field at fault, and nothing is loaded.
File load(const std::string& path);

/// The safetensors name of a dtype ("F32", ...) and back; the latter throws on unknown names.
const char* dtype_to_name(Dtype dt);
Dtype dtype_from_name(const std::string& name);

}  // namespace hetrain::safetensors
