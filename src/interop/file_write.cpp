#include "interop/file_write.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "hetrain/base/error.h"
#include "hetrain/graph/ops.h"

namespace hetrain::interop {

namespace {

std::string errno_str() { return std::strerror(errno); }

/// Writes all of buf to fd, retrying short writes.
bool write_all(int fd, const char* buf, size_t n) {
  while (n > 0) {
    ssize_t w = ::write(fd, buf, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    buf += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

bool write_pieces(int fd, const std::vector<std::string_view>& pieces) {
  for (std::string_view p : pieces)
    if (!p.empty() && !write_all(fd, p.data(), p.size())) return false;
  return true;
}

}  // namespace

void write_file_atomically(const std::string& path, const std::vector<std::string_view>& pieces,
                           const std::string& who) {
  namespace fs = std::filesystem;
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
    if (S_ISDIR(st.st_mode)) fail(who, " ", path, " is a directory, expected a file name");
    // A device or FIFO: no temporary file can replace it, so write to it directly.
    int fd = ::open(path.c_str(), O_WRONLY);
    if (fd < 0) fail(who, " cannot open ", path, " for writing: ", errno_str());
    bool ok = write_pieces(fd, pieces);
    std::string err = errno_str();
    ::close(fd);
    if (!ok) fail(who, " ", path, ": write failed: ", err);
    return;
  }
  fs::path target(path);
  fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  std::string tmpl = (dir / ("." + target.filename().string() + ".tmp.XXXXXX")).string();
  std::vector<char> tmp_name(tmpl.begin(), tmpl.end());
  tmp_name.push_back('\0');
  int fd = ::mkstemp(tmp_name.data());
  if (fd < 0)
    fail(who, " ", path, ": cannot create a temporary file in ", dir.string(), ": ", errno_str());
  auto abandon = [&](const std::string& what) {
    std::string err = errno_str();
    ::close(fd);
    ::unlink(tmp_name.data());
    fail(who, " ", path, ": ", what, ": ", err);
  };
  (void)::fchmod(fd, 0644);  // mkstemp makes 0600; the result is an ordinary file
  if (!write_pieces(fd, pieces)) abandon("write failed");
  if (::fsync(fd) != 0) abandon("fsync failed");
  if (::close(fd) != 0) {
    std::string err = errno_str();
    ::unlink(tmp_name.data());
    fail(who, " ", path, ": close failed: ", err);
  }
  if (::rename(tmp_name.data(), path.c_str()) != 0) {
    std::string err = errno_str();
    ::unlink(tmp_name.data());
    fail(who, " ", path, ": rename failed: ", err);
  }
  // Make the rename itself durable.
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (dfd >= 0) {
    (void)::fsync(dfd);
    ::close(dfd);
  }
}

Array contiguous_host(const Array& in) {
  Array a = in;
  if (!a.contiguous() && a.numel() != 0) a = copy(make_leaf(a)).array();
  if (a.device().kind == DeviceKind::cuda) a = copy_to_device(a, Device::cpu());
  return a;
}

}  // namespace hetrain::interop
