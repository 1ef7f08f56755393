// A choice between a backend's two implementations of one job (the f32 GEMM library, the f32
// convolution kernels). What decides it, first to last: an override while one lives ('hetrain
// bench' timing both), an environment variable, the faster in this machine's device profile
// (set_measured, which the CLI passes on), and a built-in rule where nothing was measured.
#pragma once

#include <array>
#include <atomic>

namespace hetrain::cpu {

/// What decided a PathChoice: its environment variable, a measurement or the built-in rule.
enum class PathSource { env, measured, rule };

class PathChoice {
 public:
  /// `names` spell paths 0 and 1 in the variable `env_var` and in the device profile; a value
  /// naming neither is an error that quotes `accepted` ("openblas or onednn"). `rule` is
  /// called where neither an override, the variable nor a measurement decides.
  PathChoice(const char* env_var, std::array<const char*, 2> names, const char* accepted,
             int (*rule)());
  int get() const;
  PathSource source() const;
  int rule() const;
  void set_measured(int path) { measured_.store(path); }
  void force(int path) { forced_.store(path); }
  void unforce() { forced_.store(-1); }
  const char* name(int path) const { return names_[path == 1]; }
  /// The path `s` names, or -1.
  int parse(const char* s) const;

 private:
  static constexpr int kUnread = -2;
  int env() const;  // the variable's path, read and checked once; -1 where unset

  const char* env_var_;
  std::array<const char*, 2> names_;
  const char* accepted_;
  int (*rule_)();
  std::atomic<int> measured_{-1}, forced_{-1};
  mutable std::atomic<int> env_{kUnread};
};

/// While it lives, `choice` answers `path` whatever its variable or measurement say. Process-wide;
/// not nested.
class PathOverride {
 public:
  PathOverride(PathChoice& choice, int path) : choice_(choice) { choice_.force(path); }
  ~PathOverride() { choice_.unforce(); }
  PathOverride(const PathOverride&) = delete;
  PathOverride& operator=(const PathOverride&) = delete;

 private:
  PathChoice& choice_;
};

}  // namespace hetrain::cpu
