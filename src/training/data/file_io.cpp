#include "training/data/file_io.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <utility>

#include "hetrain/base/error.h"
#include "hetrain/base/file_output.h"

namespace hetrain::data::detail {

namespace {

std::string errno_str(int e) { return std::strerror(e); }

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

}  // namespace

std::vector<uint8_t> read_file(const std::string& path) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) fail("[data] ", path, ": cannot open: ", errno_str(errno));
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) fail("[data] ", path, ": is a directory");
  const off_t size = ::lseek(fd.get(), 0, SEEK_END);
  if (size < 0 || ::lseek(fd.get(), 0, SEEK_SET) < 0)
    fail("[data] ", path, ": cannot seek: ", errno_str(errno));
  std::vector<uint8_t> out(static_cast<size_t>(size));
  size_t got = 0;
  while (got < out.size()) {
    const ssize_t r = ::read(fd.get(), out.data() + got, out.size() - got);
    if (r < 0) {
      if (errno == EINTR) continue;
      fail("[data] ", path, ": read failed: ", errno_str(errno));
    }
    if (r == 0) break;  // shrank while reading
    got += static_cast<size_t>(r);
  }
  out.resize(got);
  return out;
}

bool is_gzip(const std::vector<uint8_t>& b) {
  return b.size() >= 2 && b[0] == 0x1f && b[1] == 0x8b;
}

std::vector<uint8_t> gunzip(const std::vector<uint8_t>& gz, const std::string& path) {
  // ISIZE (the last 4 bytes) is the uncompressed size mod 2^32 of the last member: a good first
  // guess for the output size; the buffer grows if it is wrong.
  size_t guess = gz.size() * 2;
  if (gz.size() >= 18) {
    uint32_t isize;
    std::memcpy(&isize, gz.data() + gz.size() - 4, 4);
    // Deflate expands at most ~1032:1; a damaged trailer must not make a huge allocation.
    guess = std::clamp<size_t>(isize, 1024, gz.size() * 1032);
  }
  std::vector<uint8_t> out(guess);
  z_stream zs{};
  if (inflateInit2(&zs, 15 + 16) != Z_OK) fail("[data] ", path, ": zlib initialisation failed");
  zs.next_in = const_cast<Bytef*>(gz.data());
  size_t in_left = gz.size(), produced = 0;
  auto cleanup = [&] { inflateEnd(&zs); };
  while (true) {
    if (produced == out.size()) out.resize(out.size() * 2);
    // zlib counts in uInt: feed at most 1 GiB per call.
    const uInt in_chunk = static_cast<uInt>(std::min<size_t>(in_left, 1u << 30));
    const uInt out_chunk = static_cast<uInt>(std::min<size_t>(out.size() - produced, 1u << 30));
    zs.avail_in = in_chunk;
    zs.next_out = out.data() + produced;
    zs.avail_out = out_chunk;
    const int rc = inflate(&zs, Z_NO_FLUSH);
    in_left -= in_chunk - zs.avail_in;
    produced += out_chunk - zs.avail_out;
    if (rc == Z_STREAM_END) {
      // Another gzip member may follow (as `cat a.gz b.gz` makes); trailing zeros are padding.
      const uint8_t* rest = zs.next_in;
      if (in_left >= 2 && rest[0] == 0x1f && rest[1] == 0x8b) {
        inflateReset(&zs);
        continue;
      }
      if (std::any_of(rest, rest + in_left, [](uint8_t b) { return b != 0; })) {
        cleanup();
        fail("[data] ", path, ": corrupt gzip: ", in_left, " bytes of trailing data after the ",
             "compressed stream");
      }
      break;
    }
    if (rc == Z_OK) continue;
    if (rc == Z_BUF_ERROR && in_left == 0) {
      cleanup();
      fail("[data] ", path, ": truncated gzip stream (ends after ", gz.size(), " bytes, inflated ",
           produced, " bytes)");
    }
    if (rc == Z_BUF_ERROR && produced == out.size()) continue;  // needs more output space
    const std::string msg = zs.msg ? zs.msg : "error " + std::to_string(rc);
    cleanup();
    fail("[data] ", path, ": corrupt gzip stream: ", msg, " (after ", produced, " inflated bytes)");
  }
  cleanup();
  out.resize(produced);
  out.shrink_to_fit();
  return out;
}

std::vector<uint8_t> read_maybe_gzip(const std::string& path) {
  std::vector<uint8_t> b = read_file(path);
  if (is_gzip(b)) return gunzip(b, path);
  return b;
}

void write_file_atomic(const std::string& path, const void* data, size_t bytes) {
  try {
    write_output_file(path, std::string_view(static_cast<const char*>(data), bytes), "file");
  } catch (const Error& e) {
    fail("[data] ", e.what());
  }
}

}  // namespace hetrain::data::detail
