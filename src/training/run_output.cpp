#include "training/run_output.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iomanip>
#include <sstream>

#include "hetrain/base/error.h"
#include "hetrain/base/file_output.h"

namespace hetrain::training {

std::string fmt_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "--";
  int64_t t = static_cast<int64_t>(s + 0.5);
  std::ostringstream os;
  if (t >= 3600)
    os << t / 3600 << "h" << std::setw(2) << std::setfill('0') << (t / 60) % 60 << "m";
  else if (t >= 60)
    os << t / 60 << "m" << std::setw(2) << std::setfill('0') << t % 60 << "s";
  else
    os << t << "s";
  return os.str();
}

Progress::Progress(int64_t total, bool enabled)
    : total_(total), tty_(enabled && isatty(STDERR_FILENO)) {}

void Progress::update(int64_t step, double loss, double sps, double eta, bool log_line,
                      int64_t epoch, double lr, const std::string& extra) {
  if (tty_) {
    const int width = 24;
    int filled = static_cast<int>(width * static_cast<double>(step) / static_cast<double>(total_));
    std::string bar(static_cast<size_t>(filled), '=');
    if (filled < width) bar += '>';
    bar.resize(width, ' ');
    std::fprintf(stderr, "\r\033[K step %lld/%lld [%s] loss %.4f%s | %.0f samples/s | ETA %s",
                 static_cast<long long>(step), static_cast<long long>(total_), bar.c_str(), loss,
                 extra.c_str(), sps, fmt_duration(eta).c_str());
    std::fflush(stderr);
  } else if (log_line) {
    std::fprintf(stderr, "step %lld/%lld epoch %lld loss %.4f lr %.3g%s %.0f samples/s ETA %s\n",
                 static_cast<long long>(step), static_cast<long long>(total_),
                 static_cast<long long>(epoch), loss, lr, extra.c_str(), sps,
                 fmt_duration(eta).c_str());
  }
}

void Progress::note(const std::string& line) {
  std::fprintf(stderr, "%s%s\n", tty_ ? "\r\033[K" : "", line.c_str());
  std::fflush(stderr);
}

void Progress::finish() {
  if (tty_) std::fprintf(stderr, "\n");
}

JsonLog::JsonLog(std::string path) : path_(std::move(path)) {
  if (path_.empty()) return;
  try {
    check_output_file(path_, "--json-log file");
  } catch (const Error& e) {
    fail("[train] ", e.what());
  }
}

JsonLog::~JsonLog() {
  if (fd_ >= 0) ::close(fd_);
}

void JsonLog::open() {
  if (path_.empty()) return;
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOCTTY, 0666);
  if (fd_ < 0) fail_write(errno);
}

void JsonLog::write(const nlohmann::json& record) {
  if (fd_ < 0) return;
  const std::string line = record.dump() + "\n";
  size_t done = 0;
  while (done < line.size()) {
    const ssize_t w = ::write(fd_, line.data() + done, line.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      const int e = w < 0 ? errno : ENOSPC;
      if (done > 0) (void)::ftruncate(fd_, static_cast<off_t>(written_));  // no half record
      fail_write(e);
    }
    done += static_cast<size_t>(w);
  }
  written_ += line.size();
}

void JsonLog::fail_write(int e) const {
  fail("[train] cannot write --json-log file '", path_, "': ", std::strerror(e));
}

}  // namespace hetrain::training
