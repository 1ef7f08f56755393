// Helpers the CPU backend's tests share: the vector width held for a scope, and whether the CPU
// runs the AVX2 + FMA kernels (the own convolutions need both).
#pragma once

#include "backends/cpu/isa.h"
#include "hetrain/base/cpu_features.h"

namespace hetrain::testing {

/// Sets the vector ISA (cpu::set_vector_isa, clamped to the CPU's widest) and restores the
/// previous one at scope exit.
struct IsaScope {
  cpu::Isa saved;
  explicit IsaScope(cpu::Isa isa) : saved(cpu::set_vector_isa(isa)) {}
  ~IsaScope() { cpu::set_vector_isa(saved); }
  IsaScope(const IsaScope&) = delete;
  IsaScope& operator=(const IsaScope&) = delete;
};

/// Whether the CPU has AVX2 and FMA.
inline bool has_avx2_fma() { return cpu_features().avx2 && cpu_features().fma; }

}  // namespace hetrain::testing
