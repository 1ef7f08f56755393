#include "backends/cpu/isa.h"

#include <atomic>
#include <cstdlib>
#include <string_view>
#include <utility>

#include "hetrain/base/cpu_features.h"
#include "hetrain/base/error.h"

namespace hetrain::cpu {

namespace {

constexpr std::pair<Isa, std::string_view> kNames[] = {
    {Isa::baseline, "baseline"}, {Isa::avx2, "avx2"}, {Isa::avx512, "avx512"}};

Isa from_environment() {
  const Isa widest = widest_isa();
  const char* v = std::getenv("HETRAIN_CPU_ISA");
  if (v == nullptr || *v == '\0') return widest;
  for (const auto& [isa, name] : kNames)
    if (name == v) return isa < widest ? isa : widest;
  fail("HETRAIN_CPU_ISA must be baseline, avx2 or avx512, got '", v, "'");
}

// -1 until first read, so that a bad HETRAIN_CPU_ISA is reported by the first kernel (and by
// `hetrain version`) rather than at load time, where an exception could not be caught.
std::atomic<int> g_isa{-1};

}  // namespace

const char* isa_name(Isa isa) {
  for (const auto& [i, name] : kNames)
    if (i == isa) return name.data();
  return "baseline";
}

Isa widest_isa() {
  const CpuFeatures& f = cpu_features();
  if (f.avx512f && f.avx512bw && f.avx512dq && f.avx512vl && f.avx2 && f.fma) return Isa::avx512;
  if (f.avx2 && f.fma) return Isa::avx2;
  return Isa::baseline;
}

Isa vector_isa() {
  int v = g_isa.load(std::memory_order_relaxed);
  if (v < 0) {
    v = static_cast<int>(from_environment());
    g_isa.store(v, std::memory_order_relaxed);
  }
  return static_cast<Isa>(v);
}

Isa set_vector_isa(Isa isa) {
  const Isa previous = vector_isa();
  const Isa widest = widest_isa();
  g_isa.store(static_cast<int>(isa < widest ? isa : widest), std::memory_order_relaxed);
  return previous;
}

}  // namespace hetrain::cpu
