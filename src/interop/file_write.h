// Durable file writes shared by the interop formats (safetensors, ONNX, .npy, .pb).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "hetrain/memory/array.h"

namespace hetrain::interop {

/// Writes the pieces, in order, to path so that an existing file is never left half-written:
/// a temporary file in the same directory, fsync, rename, fsync of the directory. An existing
/// path that is not a regular file (a character device such as /dev/stdout, a FIFO) is written
/// through instead; a directory is refused. Errors start with `who` and name the path.
void write_file_atomically(const std::string& path, const std::vector<std::string_view>& pieces,
                           const std::string& who);

/// Row-major bytes of an evaluated array in host memory (copies a strided view or GPU data).
Array contiguous_host(const Array& a);

}  // namespace hetrain::interop
