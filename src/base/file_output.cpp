// Output files written whole (file_output.h): atomic replacement of regular files, write-through
// for devices and FIFOs, symbolic links followed.
#include "hetrain/base/file_output.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

#include "hetrain/base/error.h"

namespace hetrain {

namespace fs = std::filesystem;

namespace {

[[noreturn]] void cannot(const std::string& what, const std::string& path, const std::string& why) {
  fail("cannot write ", what, " '", path, "': ", why);
}

/// The path a write to `path` lands on: symbolic links followed (also a dangling one, whose
/// target is then created).
fs::path resolve(const std::string& path, const std::string& what) {
  fs::path p(path);
  for (int depth = 0; depth < 40; ++depth) {
    struct stat st;
    if (::lstat(p.c_str(), &st) != 0 || !S_ISLNK(st.st_mode)) return p;
    std::error_code ec;
    fs::path link = fs::read_symlink(p, ec);
    if (ec) cannot(what, path, "cannot read the symbolic link: " + ec.message());
    p = link.is_absolute() ? link : p.parent_path() / link;
  }
  cannot(what, path, "too many levels of symbolic links");
}

fs::path dir_of(const fs::path& p) { return p.has_parent_path() ? p.parent_path() : fs::path("."); }

bool write_all(int fd, std::span<const std::string_view> pieces) {
  for (std::string_view piece : pieces) {
    const char* buf = piece.data();
    size_t n = piece.size();
    while (n > 0) {
      const ssize_t w = ::write(fd, buf, n);
      if (w < 0) {
        if (errno == EINTR) continue;
        return false;
      }
      buf += w;
      n -= static_cast<size_t>(w);
    }
  }
  return true;
}

/// A device or FIFO: written through, never replaced.
void write_through(const fs::path& target, std::span<const std::string_view> pieces,
                   const std::string& path, const std::string& what) {
  const int fd = ::open(target.c_str(), O_WRONLY | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) cannot(what, path, std::strerror(errno));
  if (!write_all(fd, pieces)) {
    const int e = errno;
    ::close(fd);
    cannot(what, path, std::strerror(e));
  }
  if (::close(fd) != 0) cannot(what, path, std::strerror(errno));
}

/// A regular file or a new one: a temporary file, fsync, rename, the directory fsynced.
void replace_atomically(const fs::path& target, std::span<const std::string_view> pieces,
                        const std::string& path, const std::string& what, const struct stat* old) {
  const fs::path dir = dir_of(target);
  std::string tmpl = (dir / ("." + target.filename().string() + ".tmp.XXXXXX")).string();
  std::vector<char> tmp(tmpl.begin(), tmpl.end());
  tmp.push_back('\0');
  const int fd = ::mkstemp(tmp.data());
  if (fd < 0)
    cannot(what, path,
           "cannot create a temporary file in " + dir.string() + ": " + std::strerror(errno));
  auto give_up = [&](const char* step, int e, bool open) {
    if (open) ::close(fd);
    ::unlink(tmp.data());
    cannot(what, path, std::string(step) + " failed: " + std::strerror(e));
  };
  // mkstemp makes 0600; keep an existing file's mode, else what a plain create would give.
  mode_t mode = 0;
  if (old) {
    mode = old->st_mode & 07777;
  } else {
    const mode_t mask = ::umask(0);
    ::umask(mask);
    mode = 0666 & ~mask;
  }
  (void)::fchmod(fd, mode);
  if (!write_all(fd, pieces)) give_up("write", errno, true);
  if (::fsync(fd) != 0) give_up("fsync", errno, true);
  if (::close(fd) != 0) give_up("close", errno, false);
  if (::rename(tmp.data(), target.c_str()) != 0) give_up("rename", errno, false);
  // Make the rename itself durable.
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    (void)::fsync(dfd);
    ::close(dfd);
  }
}

}  // namespace

void check_output_file(const std::string& path, const std::string& what) {
  if (path.empty()) cannot(what, path, "the path is empty");
  const fs::path target = resolve(path, what);
  struct stat st;
  if (::stat(target.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) cannot(what, path, "it is a directory");
    if (::access(target.c_str(), W_OK) != 0) cannot(what, path, std::strerror(errno));
    // A regular file is replaced through a temporary file beside it.
    if (S_ISREG(st.st_mode) && ::access(dir_of(target).c_str(), W_OK) != 0)
      cannot(what, path, "its directory is not writable: " + std::string(std::strerror(errno)));
    return;
  }
  if (errno != ENOENT) cannot(what, path, std::strerror(errno));
  // A new file: its directory must exist and be writable.
  const fs::path dir = dir_of(target);
  if (::stat(dir.c_str(), &st) != 0) cannot(what, path, dir.string() + ": " + std::strerror(errno));
  if (!S_ISDIR(st.st_mode)) cannot(what, path, dir.string() + " is not a directory");
  if (::access(dir.c_str(), W_OK) != 0)
    cannot(what, path, dir.string() + ": " + std::strerror(errno));
}

void write_output_file(const std::string& path, std::span<const std::string_view> pieces,
                       const std::string& what) {
  if (path.empty()) cannot(what, path, "the path is empty");
  const fs::path target = resolve(path, what);
  struct stat st;
  if (::stat(target.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) cannot(what, path, "it is a directory");
    if (!S_ISREG(st.st_mode)) return write_through(target, pieces, path, what);
    return replace_atomically(target, pieces, path, what, &st);
  }
  if (errno != ENOENT) cannot(what, path, std::strerror(errno));
  replace_atomically(target, pieces, path, what, nullptr);
}

}  // namespace hetrain
