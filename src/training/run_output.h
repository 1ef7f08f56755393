// What a training run shows and writes as it goes: the progress display on stderr and the
// --json-log file. Internal to the training layer.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

namespace hetrain::training {

/// "42s", "3m05s", "1h02m"; "--" for a negative or non-finite time.
std::string fmt_duration(double s);

/// A live bar on a terminal, plain lines otherwise.
class Progress {
 public:
  Progress(int64_t total, bool enabled);
  /// extra: appended to the line (the loss scale and skipped steps under fp16).
  void update(int64_t step, double loss, double sps, double eta, bool log_line, int64_t epoch,
              double lr, const std::string& extra);
  /// A line of its own (on a terminal, above the bar, which the next update redraws).
  void note(const std::string& line);
  void finish();

 private:
  int64_t total_;
  bool tty_;
};

/// The --json-log file: checked before any work but emptied only when training starts (a run
/// that fails on its inputs leaves an old log as it was); a record that cannot be written whole
/// fails the run, and the part of it that was written is cut off again.
class JsonLog {
 public:
  explicit JsonLog(std::string path);
  JsonLog(const JsonLog&) = delete;
  JsonLog& operator=(const JsonLog&) = delete;
  ~JsonLog();
  explicit operator bool() const { return !path_.empty(); }
  void open();
  void write(const nlohmann::json& record);

 private:
  [[noreturn]] void fail_write(int e) const;
  std::string path_;
  int fd_ = -1;
  uint64_t written_ = 0;
};

}  // namespace hetrain::training
