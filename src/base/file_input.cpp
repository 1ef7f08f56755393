// Input files read whole (file_input.h): regular files only, every error naming the file.
#include "hetrain/base/file_input.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "hetrain/base/error.h"

namespace hetrain {

std::string read_input_file(const std::string& path, const std::string& what) {
  auto cannot = [&](const std::string& why) { fail(what, " '", path, "': ", why); };
  // O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused below).
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) cannot(std::string("cannot open: ") + std::strerror(errno));
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    const bool dir = S_ISDIR(st.st_mode);
    ::close(fd);
    cannot(dir ? "is a directory, not a file" : "not a regular file");
  }
  std::string text;
  text.reserve(static_cast<size_t>(st.st_size));
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      cannot(std::string("read error: ") + std::strerror(err));
    }
    text.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return text;
}

nlohmann::json read_json_file(const std::string& path, const std::string& what) {
  const std::string text = read_input_file(path, what);
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail(what, " '", path, "' is not valid JSON: ", e.what());
  }
}

std::string json_string(const nlohmann::json& o, const char* key, const std::string& dflt,
                        const std::string& where) {
  if (!o.is_object()) return dflt;
  const auto it = o.find(key);
  if (it == o.end()) return dflt;
  if (!it->is_string()) fail(where, ": '", key, "' must be a string, got ", it->dump());
  return it->get<std::string>();
}

bool json_version_is(const nlohmann::json& o, int v) {
  if (!o.is_object()) return false;
  const auto it = o.find("version");
  return it != o.end() && it->is_number() && *it == v;
}

}  // namespace hetrain
