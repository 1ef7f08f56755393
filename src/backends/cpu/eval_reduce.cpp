// CPU reductions. The input is viewed as (O, R, I): O kept outer elements, R reduced,
// I kept inner; rows (I == 1) and columns (I > 1) each get a vectorisable loop.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <type_traits>

#include "backends/cpu/isa.h"
#include "graph/prims/elementwise.h"
#include "graph/prims/reduce.h"
#include "hetrain/base/dispatch.h"
#include "hetrain/base/thread_pool.h"

namespace hetrain {

namespace {

/// Returns x contiguous with the reduced axes forming one block, and its (O, R, I).
Array prepare(const Array& x, const std::vector<int>& axes, ORI& ori) {
  const int nd = static_cast<int>(x.shape.size());
  bool block = true;
  for (size_t i = 1; i < axes.size(); ++i) block = block && axes[i] == axes[i - 1] + 1;
  if (block) {
    for (int d = 0; d < nd; ++d) {
      if (d < axes.front())
        ori.O *= x.shape[static_cast<size_t>(d)];
      else if (d <= axes.back())
        ori.R *= x.shape[static_cast<size_t>(d)];
      else
        ori.I *= x.shape[static_cast<size_t>(d)];
    }
    return contiguous_array(x);
  }
  // Move reduced axes last (a strided view), then copy.
  std::vector<int> perm;
  for (int d = 0; d < nd; ++d)
    if (!std::binary_search(axes.begin(), axes.end(), d)) perm.push_back(d);
  for (int a : axes) perm.push_back(a);
  Array v;
  v.dtype = x.dtype;
  for (int p : perm) {
    v.shape.push_back(x.shape[static_cast<size_t>(p)]);
    v.strides.push_back(x.strides[static_cast<size_t>(p)]);
  }
  v.buffer = x.buffer;
  v.offset = x.offset;
  for (size_t i = 0; i < perm.size(); ++i) {
    if (i < perm.size() - axes.size())
      ori.O *= v.shape[i];
    else
      ori.R *= v.shape[i];
  }
  return contiguous_array(v);
}

template <class T, ReduceKind K>
struct ReduceOps {
  using Acc = std::conditional_t<std::is_same_v<compute_t<T>, float>, float, compute_t<T>>;
  [[gnu::always_inline]] static Acc init() {
    if constexpr (K == ReduceKind::sum)
      return Acc(0);
    else if constexpr (K == ReduceKind::max)
      return std::numeric_limits<Acc>::lowest();
    else
      return std::numeric_limits<Acc>::max();
  }
  [[gnu::always_inline]] static Acc combine(Acc a, Acc v) {
    if constexpr (K == ReduceKind::sum) {
      return a + v;
    } else if constexpr (K == ReduceKind::max) {
      return (v > a || std::isnan(v)) ? v : a;  // NaN propagates
    } else {
      return (v < a || std::isnan(v)) ? v : a;
    }
  }
};

/// Rows [b, e) of x (each R long) reduced into y, eight partial accumulators per row
/// (vectorisable, more accurate than one chain, and the same order at every vector width).
template <class T, ReduceKind K>
struct ReduceRows {
  template <cpu::Isa>
  [[gnu::always_inline]] static inline void run(const T* x, T* y, int64_t R, int64_t b, int64_t e) {
    using Op = ReduceOps<T, K>;
    using Acc = typename Op::Acc;
    for (int64_t o = b; o < e; ++o) {
      const T* row = x + o * R;
      Acc acc[8];
      for (auto& a : acc) a = Op::init();
      int64_t r = 0;
      for (; r + 8 <= R; r += 8)
        for (int j = 0; j < 8; ++j)
          acc[j] = Op::combine(acc[j], static_cast<Acc>(to_compute(row[r + j])));
      for (; r < R; ++r) acc[0] = Op::combine(acc[0], static_cast<Acc>(to_compute(row[r])));
      Acc t = acc[0];
      for (int j = 1; j < 8; ++j) t = Op::combine(t, acc[j]);
      y[o] = from_compute<T>(t);
    }
  }
};

constexpr int64_t kColumnBlock = 256;

/// Column blocks [b, e) of (O, R, I) x: block t is columns [i0, i0 + 256) of outer o.
template <class T, ReduceKind K>
struct ReduceColumns {
  template <cpu::Isa>
  [[gnu::always_inline]] static inline void run(const T* x, T* y, const ORI& s, int64_t b,
                                                int64_t e) {
    using Op = ReduceOps<T, K>;
    typename Op::Acc acc[kColumnBlock];
    const int64_t nblk = (s.I + kColumnBlock - 1) / kColumnBlock;
    for (int64_t t = b; t < e; ++t) {
      const int64_t o = t / nblk, i0 = (t % nblk) * kColumnBlock;
      const int64_t n = std::min(kColumnBlock, s.I - i0);
      for (int64_t i = 0; i < n; ++i) acc[i] = Op::init();
      for (int64_t r = 0; r < s.R; ++r) {
        const T* row = x + (o * s.R + r) * s.I + i0;
        for (int64_t i = 0; i < n; ++i)
          acc[i] = Op::combine(acc[i], static_cast<typename Op::Acc>(to_compute(row[i])));
      }
      for (int64_t i = 0; i < n; ++i) y[o * s.I + i0 + i] = from_compute<T>(acc[i]);
    }
  }
};

template <class T, ReduceKind K>
void reduce_ori(const T* x, T* y, const ORI& s) {
  if (s.I == 1) {
    parallel_for(
        s.O, std::max<int64_t>(1, 32768 / std::max<int64_t>(s.R, 1)),
        [&](int64_t b, int64_t e) { cpu::isa_dispatch<ReduceRows<T, K>>(x, y, s.R, b, e); });
    return;
  }
  const int64_t nblk = (s.I + kColumnBlock - 1) / kColumnBlock;
  parallel_for(
      s.O * nblk, std::max<int64_t>(1, 32768 / std::max<int64_t>(s.R * kColumnBlock, 1)),
      [&](int64_t b, int64_t e) { cpu::isa_dispatch<ReduceColumns<T, K>>(x, y, s, b, e); });
}

}  // namespace

namespace {
void reduce_block(ReduceKind kind, const char* name, const Array& in, const std::vector<int>& axes,
                  Array& y) {
  ORI s;
  Array x = prepare(in, axes, s);
  y.allocate();
  dispatch_numeric(x.dtype, name, [&]<class T>() {
    switch (kind) {
      case ReduceKind::sum:
        reduce_ori<T, ReduceKind::sum>(x.data<T>(), y.data<T>(), s);
        break;
      case ReduceKind::max:
        reduce_ori<T, ReduceKind::max>(x.data<T>(), y.data<T>(), s);
        break;
      case ReduceKind::min:
        reduce_ori<T, ReduceKind::min>(x.data<T>(), y.data<T>(), s);
        break;
    }
  });
}
}  // namespace

void Reduce::eval_cpu(const std::vector<const Array*>& in, const std::vector<Array*>& out) const {
  // Split the axes into runs of adjacent axes. Several runs (e.g. (0, 2, 3) of NCHW) are
  // reduced one run at a time, innermost first, each a strided-free (O, R, I) pass, instead
  // of transposing a copy of the whole input.
  std::vector<std::vector<int>> runs;
  for (int a : axes_) {
    if (runs.empty() || runs.back().back() != a - 1) runs.emplace_back();
    runs.back().push_back(a);
  }
  Array& y = *out[0];
  if (runs.size() == 1) {
    reduce_block(kind_, name(), *in[0], axes_, y);
    return;
  }
  Array cur = *in[0];
  for (size_t r = runs.size(); r-- > 0;) {
    Array next;
    next.shape = reduced_shape(cur.shape, runs[r], true);
    next.dtype = cur.dtype;
    next.tag = r == 0 ? y.tag : MemoryTag::workspace;
    reduce_block(kind_, name(), cur, runs[r], next);
    cur = std::move(next);
  }
  // cur is contiguous with kept dims of size 1: the result is a view of it.
  y.view_of(cur, contiguous_strides(y.shape), cur.offset);
}

void ArgMax::eval_cpu(const std::vector<const Array*>& in, const std::vector<Array*>& out) const {
  ORI s;
  Array x = prepare(*in[0], {axis_}, s);
  Array& y = *out[0];
  y.allocate();
  int64_t* yp = y.data<int64_t>();
  dispatch_numeric(x.dtype, "argmax", [&]<class T>() {
    const T* xp = x.data<T>();
    parallel_for(s.O * s.I, 256, [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) {
        int64_t o = t / s.I, i = t % s.I;
        const T* base = xp + o * s.R * s.I + i;
        auto best = to_compute(base[0]);
        int64_t bi = 0;
        for (int64_t r = 1; r < s.R; ++r) {
          auto v = to_compute(base[r * s.I]);
          if (std::isnan(best)) break;  // NaN is the maximum, first one wins
          if (v > best || std::isnan(v)) {
            best = v;
            bi = r;
          }
        }
        yp[t] = bi;
      }
    });
  });
}

}  // namespace hetrain
