// Durable file writes shared by the interop formats (safetensors, ONNX, .npy, .pb).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "hetrain/memory/array.h"

namespace hetrain::interop {

/// Writes the pieces, in order, to path with write_output_file (base/file_output.h): a regular
/// file is replaced atomically (temporary file, fsync, rename, fsync of the directory), a
/// symlink is followed, a device or FIFO is written through, a directory is refused. Errors
/// start with `who` and name the path.
void write_file_atomically(const std::string& path, const std::vector<std::string_view>& pieces,
                           const std::string& who);

/// Row-major bytes of an evaluated array in host memory (copies a strided view or GPU data).
Array contiguous_host(const Array& a);

}  // namespace hetrain::interop
