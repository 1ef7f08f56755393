// One source per vector kernel, built for every x86 width: a kernel is a struct with a
// `template <Isa> static void run(...)` written in plain loops (or over vec_math.h's
// branch-free helpers), and isa_dispatch<K>(...) calls the copy the compiler vectorised for
// the widest ISA this CPU has: AVX-512 (16 lanes; F, BW, DQ and VL, as x86-64-v4: without BW,
// GCC keeps loops over 16-bit elements, bf16 and f16, at 256 bits), AVX2 + FMA (8) or baseline
// x86-64 (SSE2, 4).
// The Isa parameter only tells a kernel which width it runs at (for tile sizes); the loops are
// the same. Files with such kernels are compiled with -ffp-contract=off (CMakeLists.txt), so
// every width rounds each operation the same way and gives the same bits.
#pragma once

#include <utility>

namespace hetrain::cpu {

enum class Isa { baseline = 0, avx2 = 1, avx512 = 2 };

/// "baseline", "avx2" or "avx512".
const char* isa_name(Isa isa);
/// The widest ISA this CPU runs (avx512 needs AVX-512 F, BW, DQ and VL with AVX2 and FMA; avx2
/// needs FMA).
Isa widest_isa();
/// The ISA the vector kernels use: widest_isa(), lowered by the environment variable
/// HETRAIN_CPU_ISA=baseline|avx2|avx512 (read once; a wider value than the CPU has is clamped,
/// an unknown one is an error naming the variable) or by set_vector_isa().
Isa vector_isa();
/// Sets the ISA the vector kernels use (clamped to widest_isa()) and returns the previous one.
/// For tests and benchmarks that compare widths; not thread-safe against running kernels.
Isa set_vector_isa(Isa isa);

/// Lanes of f32 in one vector register at `isa`.
constexpr int f32_lanes(Isa isa) { return isa == Isa::avx512 ? 16 : isa == Isa::avx2 ? 8 : 4; }

template <class K, class... A>
__attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma"))) void run_avx512(A&&... a) {
  K::template run<Isa::avx512>(std::forward<A>(a)...);
}
template <class K, class... A>
__attribute__((target("avx2,fma"))) void run_avx2(A&&... a) {
  K::template run<Isa::avx2>(std::forward<A>(a)...);
}
template <class K, class... A>
void run_baseline(A&&... a) {
  K::template run<Isa::baseline>(std::forward<A>(a)...);
}

/// K::run<isa>(a...) for vector_isa(). K::run must be declared
/// `template <Isa> [[gnu::always_inline]] static inline`, so that it is compiled into each
/// target-specific caller rather than once for the baseline.
template <class K, class... A>
void isa_dispatch(A&&... a) {
  switch (vector_isa()) {
    case Isa::avx512:
      run_avx512<K>(std::forward<A>(a)...);
      return;
    case Isa::avx2:
      run_avx2<K>(std::forward<A>(a)...);
      return;
    case Isa::baseline:
      break;
  }
  run_baseline<K>(std::forward<A>(a)...);
}

}  // namespace hetrain::cpu
