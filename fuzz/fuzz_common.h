// Shared by the fuzz targets. The parsers read files, so each input is written to a file in a
// scratch directory first. A parser may succeed or throw hetrain::Error (a user mistake, named);
// any other exception escapes the target and libFuzzer reports it as a crash: it is what a user
// would have seen as "unexpected error" naming no file. Crashes, sanitizer findings, leaks,
// timeouts and allocations past -malloc_limit_mb are findings too.
#pragma once

#include <stdlib.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>

#include "hetrain/base/error.h"

namespace hetrain::fuzz {

/// A private directory, removed at exit. The name lives on the heap, never destroyed: the exit
/// handler must not run after a static string's destructor.
inline const std::string& scratch_dir() {
  static const std::string* dir = [] {
    char tmpl[] = "/tmp/hetrain-fuzz-XXXXXX";
    if (!::mkdtemp(tmpl)) std::abort();
    auto* d = new std::string(tmpl);
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(scratch_dir(), ec);
    });
    return d;
  }();
  return *dir;
}

/// Writes the input to scratch_dir()/name and returns the path.
inline std::string write_input(const uint8_t* data, size_t size, const std::string& name) {
  const std::string path = scratch_dir() + "/" + name;
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f || (size && std::fwrite(data, 1, size, f) != size) || std::fclose(f) != 0) std::abort();
  return path;
}

/// Runs fn; hetrain::Error is an expected outcome, anything else escapes.
template <class Fn>
void expect_only_errors(Fn&& fn) {
  try {
    fn();
  } catch (const hetrain::Error&) {
  }
}

}  // namespace hetrain::fuzz
