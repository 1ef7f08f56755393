// Helpers the CPU backend's tests share: a process-wide setting (the vector width, a path) held
// for a scope, and whether the CPU runs the AVX2 + FMA kernels (the own convolutions need both).
#pragma once

#include "backends/cpu/isa.h"
#include "hetrain/base/cpu_features.h"

namespace hetrain::testing {

/// One of the CPU backend's process-wide settings set for a scope through its setter (which
/// returns the previous value), the previous value restored at scope exit.
template <class V, V (*Set)(V)>
struct SettingScope {
  V saved;
  explicit SettingScope(V v) : saved(Set(v)) {}
  ~SettingScope() { Set(saved); }
  SettingScope(const SettingScope&) = delete;
  SettingScope& operator=(const SettingScope&) = delete;
};

/// The vector ISA (cpu::set_vector_isa, clamped to the CPU's widest) for a scope.
using IsaScope = SettingScope<cpu::Isa, &cpu::set_vector_isa>;

/// Whether the CPU has AVX2 and FMA.
inline bool has_avx2_fma() { return cpu_features().avx2 && cpu_features().fma; }

}  // namespace hetrain::testing
