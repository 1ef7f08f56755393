// Output files written whole: the one way Hetrain writes a file a user names (a report, a trace,
// a JSON result, a checkpoint) or keeps (the caches).
//
//   hetrain::check_output_file(path, "--json file");   // before any work: refuse early
//   ...
//   hetrain::write_output_file(path, text, "--json file");
//
// A regular file (or a new one) is replaced atomically: a temporary file in the same directory,
// fsync, rename, the directory fsynced. Readers see the old or the new contents, never a mix;
// a failed write (a full disk) leaves the old file as it was and no temporary file behind.
// A symbolic link is followed: its target is replaced and the link stays a link. Anything else
// that is not a directory (a device such as /dev/stdout or /dev/null, a FIFO) is written
// through, never replaced by a regular file. A directory is refused.
#pragma once

#include <span>
#include <string>
#include <string_view>

namespace hetrain {

/// Checks, without creating or changing anything, that `path` can be written: not a directory,
/// and either an existing writable file, or a new name in an existing writable directory
/// (directories are not created here or by write_output_file).
/// Throws Error "cannot write <what> '<path>': <why>".
void check_output_file(const std::string& path, const std::string& what);

/// Writes the concatenation of `pieces` to `path` as described above. Throws Error naming
/// `what` and the path (and errno's reason) on failure.
void write_output_file(const std::string& path, std::span<const std::string_view> pieces,
                       const std::string& what);
inline void write_output_file(const std::string& path, std::string_view bytes,
                              const std::string& what) {
  write_output_file(path, std::span<const std::string_view>(&bytes, 1), what);
}

}  // namespace hetrain
