// Strided copies with dtype conversion: the kernel under casts, contiguous copies and the
// compute-dtype buffers of other kernels. Graph-free.
#include "backends/cpu/copy.h"

#include <cstring>

#include "backends/cpu/isa.h"
#include "backends/cpu/strided.h"
#include "backends/cpu/vec.h"
#include "backends/cpu/vec_math.h"
#include "hetrain/base/dispatch.h"

namespace hetrain {

using cpu::for_each_run;
using cpu::kElementwiseGrain;

namespace {
// A contiguous run of a cast with a fast path (same type: memcpy; f16 <-> f32, the casts of fp16
// autocast: F16C where available); false when there is none. A function template rather than
// `if constexpr` inside copy_strided's nested generic lambdas: clang 14 checks the discarded
// branches there.
template <class S, class D>
bool cast_run_fast(const S* a, D* o, int64_t len) {
  if constexpr (std::is_same_v<S, D>) {
    std::memcpy(o, a, static_cast<size_t>(len) * sizeof(S));
    return true;
  } else if constexpr (std::is_same_v<S, Half> && std::is_same_v<D, float>) {
    cpu::f16_to_f32(&a->bits, o, len);
    return true;
  } else if constexpr (std::is_same_v<S, float> && std::is_same_v<D, Half>) {
    cpu::f32_to_f16(a, &o->bits, len);
    return true;
  } else {
    return false;
  }
}
/// A contiguous run of a cast, one source for every vector width (the f16/bf16 conversions are
/// branch-free, so they vectorise).
template <class S, class D>
struct CastRun {
  template <cpu::Isa>
  [[gnu::always_inline]] static inline void run(const S* a, D* o, int64_t n) {
    for (int64_t i = 0; i < n; ++i) cpu::store_compute(o + i, cpu::load_compute(a + i));
  }
};
}  // namespace

void copy_strided(const Array& x, Array& y) {
  dispatch_all(x.dtype, "cast", [&]<class S>() {
    dispatch_all(y.dtype, "cast", [&]<class D>() {
      const S* sp = x.data<S>();
      D* dp = y.data<D>();
      for_each_run<2>(
          x.shape, {&y.strides, &x.strides}, kElementwiseGrain,
          [&](const std::array<int64_t, 2>& pos, const std::array<int64_t, 2>& step, int64_t len) {
            D* o = dp + pos[0];
            const S* a = sp + pos[1];
            if (step[0] == 1 && step[1] == 1) {
              if (!cast_run_fast(a, o, len)) cpu::isa_dispatch<CastRun<S, D>>(a, o, len);
              return;
            }
            // To bool: from_compute's static_cast<bool> is `!= 0` (NaN -> true, as before).
            for (int64_t i = 0; i < len; ++i)
              cpu::store_compute(o + i * step[0], cpu::load_compute(a + i * step[1]));
          });
    });
  });
}

Array contiguous_array(const Array& x) {
  if (x.contiguous()) return x;
  Array c;
  c.shape = x.shape;
  c.dtype = x.dtype;
  c.tag = MemoryTag::workspace;
  c.allocate();
  copy_strided(x, c);
  return c;
}

}  // namespace hetrain
