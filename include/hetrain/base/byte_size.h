// Byte sizes as users write them ("2GiB", "512MiB", "1.5GB", "1048576") and as reports
// print them ("4.0 MiB").
#pragma once

#include <cstdint>
#include <string>

namespace hetrain {

/// Parses a positive size: a number with an optional unit B, KiB, MiB, GiB, TiB (powers of
/// 1024) or kB, MB, GB, TB (powers of 1000); no unit means bytes. The result is rounded down
/// to whole bytes and must be at least 1. Throws an Error naming `what` (a flag or a file
/// key) and the text on anything else.
int64_t parse_byte_size(const std::string& text, const std::string& what);

/// "512 B", "4.0 KiB", "61.2 MiB", "2.00 GiB": binary units, for messages and tables.
std::string format_bytes(int64_t bytes);

}  // namespace hetrain
