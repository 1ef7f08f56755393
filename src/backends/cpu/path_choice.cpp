#include "backends/cpu/path_choice.h"

#include <cstdlib>
#include <cstring>

#include "hetrain/base/error.h"

namespace hetrain::cpu {

PathChoice::PathChoice(const char* env_var, std::array<const char*, 2> names, const char* accepted,
                       int (*rule)())
    : env_var_(env_var), names_(names), accepted_(accepted), rule_(rule) {}

int PathChoice::parse(const char* s) const {
  for (int p = 0; p < 2; ++p)
    if (std::strcmp(s, names_[p]) == 0) return p;
  return -1;
}

int PathChoice::env() const {
  // Read once: a run's path does not change under it. A bad value is not kept, so every call
  // fails and each caller reports it.
  if (const int e = env_.load(std::memory_order_relaxed); e != kUnread) return e;
  const char* v = std::getenv(env_var_);
  int p = -1;
  if (v != nullptr && *v != '\0') {
    p = parse(v);
    if (p < 0) fail(env_var_, " must be ", accepted_, ", got '", v, "'");
  }
  env_.store(p);
  return p;
}

int PathChoice::rule() const { return rule_(); }

int PathChoice::get() const {
  if (const int f = forced_.load(std::memory_order_relaxed); f >= 0) return f;
  if (const int e = env(); e >= 0) return e;
  const int m = measured_.load(std::memory_order_relaxed);
  return m >= 0 ? m : rule();
}

PathSource PathChoice::source() const {
  if (env() >= 0) return PathSource::env;
  return measured_.load() >= 0 ? PathSource::measured : PathSource::rule;
}

}  // namespace hetrain::cpu
