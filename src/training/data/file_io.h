// File helpers for the data readers: whole-file reads, gunzip, atomic writes. Every error names the
// file.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace hetrain::data::detail {

/// The file's bytes; throws "[data] <path>: cannot open: <reason>".
std::vector<uint8_t> read_file(const std::string& path);
bool is_gzip(const std::vector<uint8_t>& bytes);
/// Inflates a gzip stream (one or more members); throws naming path on a corrupt or truncated
/// stream.
std::vector<uint8_t> gunzip(const std::vector<uint8_t>& gz, const std::string& path);
/// read_file, inflated when the content starts with the gzip magic.
std::vector<uint8_t> read_maybe_gzip(const std::string& path);
/// Writes to a temporary file beside path, fsyncs it, renames it over path and fsyncs the
/// directory, so a reader sees the old file or the new one, never a partial one.
void write_file_atomic(const std::string& path, const void* data, size_t bytes);

}  // namespace hetrain::data::detail
