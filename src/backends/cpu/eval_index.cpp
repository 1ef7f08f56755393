// CPU kernels for take (index_select, embedding), gather, and their scatter-add adjoints.
// Indices are bounds-checked before the parallel loops so errors reach the caller. The
// scatter-adds split work so that no two threads write one element (no atomics, and the
// sums come out the same for any thread count).
#include <algorithm>
#include <array>
#include <cstring>
#include <vector>

#include "backends/cpu/vec_math.h"
#include "graph/prims/elementwise.h"
#include "graph/prims/nn.h"
#include "hetrain/base/dispatch.h"
#include "hetrain/base/thread_pool.h"

namespace hetrain {

namespace {

/// Accumulates into T's compute type: a workspace for f16/bf16, out itself otherwise.
template <class T>
struct Accumulator {
  using C = compute_t<T>;
  Array& out;
  std::vector<C> ws;
  explicit Accumulator(Array& o) : out(o) {
    if constexpr (std::is_same_v<T, C>)
      std::memset(out.raw(), 0, out.nbytes());
    else
      ws.assign(static_cast<size_t>(out.numel()), C(0));
  }
  C* data() {
    if constexpr (std::is_same_v<T, C>)
      return out.data<T>();
    else
      return ws.data();
  }
  void finish() {
    if constexpr (!std::is_same_v<T, C>) {
      T* o = out.data<T>();
      const C* w = ws.data();
      parallel_for(out.numel(), 1 << 15, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) o[i] = from_compute<T>(w[i]);
      });
    }
  }
};

}  // namespace

// ---- Take / IndexAdd ---------------------------------------------------------------------------

void Take::eval_cpu(const std::vector<const Array*>& in, const std::vector<Array*>& out) const {
  Array x = contiguous_array(*in[0]);
  Array idx = contiguous_array(*in[1]);
  const size_t a = static_cast<size_t>(axis_);
  const int64_t O = numel(x.shape, 0, a), V = x.shape[a], I = numel(x.shape, a + 1, x.shape.size());
  const int64_t K = idx.numel();
  if (auto bad = find_bad_index(idx, V)) fail_bad_index(op_, *bad, V, axis_);
  Array& y = *out[0];
  y.allocate();
  if (y.numel() == 0) return;
  dispatch_all(x.dtype, op_, [&]<class T>() {
    const T* xp = x.data<T>();
    T* yp = y.data<T>();
    dispatch_index(idx.dtype, name(), [&]<class Ix>() {
      const Ix* ip = idx.data<Ix>();
      // One task per output slice (o, k): a contiguous copy of I elements.
      parallel_for(O * K, cpu::row_grain(I), [&](int64_t b, int64_t e) {
        for (int64_t t = b; t < e; ++t) {
          const int64_t o = t / K, k = t % K;
          const T* src = xp + (o * V + static_cast<int64_t>(ip[k])) * I;
          T* dst = yp + t * I;
          for (int64_t i = 0; i < I; ++i) dst[i] = src[i];
        }
      });
    });
  });
}

void IndexAdd::eval_cpu(const std::vector<const Array*>& in, const std::vector<Array*>& out) const {
  Array g = contiguous_array(*in[0]);
  Array idx = contiguous_array(*in[1]);
  const size_t a = static_cast<size_t>(axis_);
  const int64_t O = numel(full_, 0, a), V = full_[a], I = numel(full_, a + 1, full_.size());
  const int64_t K = idx.numel();
  if (auto bad = find_bad_index(idx, V)) fail_bad_index("index_add", *bad, V, axis_);
  Array& y = *out[0];
  y.allocate();
  dispatch_float(g.dtype, "index_add", [&]<class T>() {
    using C = compute_t<T>;
    Accumulator<T> acc(y);
    C* yp = acc.data();
    const T* gp = g.data<T>();
    dispatch_index(idx.dtype, name(), [&]<class Ix>() {
      const Ix* ip = idx.data<Ix>();
      // Tasks own (o, column block) pairs: every k adds into rows of its own columns, so
      // repeated ids never race and each element sums its terms in k order.
      const int64_t want = 4 * static_cast<int64_t>(num_threads());
      const int64_t per_o = std::max<int64_t>(1, want / std::max<int64_t>(O, 1));
      const int64_t block = std::clamp<int64_t>((I + per_o - 1) / per_o, 16, 4096);
      const int64_t nblk = (I + block - 1) / block;
      parallel_for(O * nblk, 1, [&](int64_t b, int64_t e) {
        for (int64_t t = b; t < e; ++t) {
          const int64_t o = t / nblk, i0 = (t % nblk) * block, len = std::min(block, I - i0);
          for (int64_t k = 0; k < K; ++k) {
            C* dst = yp + (o * V + static_cast<int64_t>(ip[k])) * I + i0;
            const T* src = gp + (o * K + k) * I + i0;
            for (int64_t i = 0; i < len; ++i) dst[i] += to_compute(src[i]);
          }
        }
      });
    });
    acc.finish();
  });
}

// ---- Gather / ScatterAdd -----------------------------------------------------------------------

namespace {

/// Rows of an index tensor: every position except along axis. row(m) gives the element
/// offsets of row m in up to three arrays (index, data, output) of matching rank.
struct Rows {
  Shape shape;                             // index shape without axis
  std::vector<std::array<int64_t, 3>> st;  // strides without axis
  int64_t count = 1;
  Rows(const Shape& idx_shape, int axis, const std::array<const Strides*, 3>& strides) {
    for (size_t d = 0; d < idx_shape.size(); ++d) {
      if (static_cast<int>(d) == axis) continue;
      shape.push_back(idx_shape[d]);
      st.push_back({(*strides[0])[d], (*strides[1])[d], (*strides[2])[d]});
      count *= idx_shape[d];
    }
  }
  std::array<int64_t, 3> row(int64_t m) const {
    std::array<int64_t, 3> off{0, 0, 0};
    for (size_t d = shape.size(); d-- > 0;) {
      const int64_t c = m % shape[d];
      m /= shape[d];
      for (size_t k = 0; k < 3; ++k) off[k] += c * st[d][k];
    }
    return off;
  }
};

}  // namespace

void Gather::eval_cpu(const std::vector<const Array*>& in, const std::vector<Array*>& out) const {
  const Array& x = *in[0];
  const Array& idx = *in[1];
  const size_t a = static_cast<size_t>(axis_);
  const int64_t V = x.shape[a], J = idx.shape[a];
  if (auto bad = find_bad_index(idx, V)) fail_bad_index("gather", *bad, V, axis_);
  Array& y = *out[0];
  y.allocate();
  if (y.numel() == 0) return;
  const Rows rows(idx.shape, axis_, {&idx.strides, &x.strides, &y.strides});
  const int64_t is = idx.strides[a], xs = x.strides[a], ys = y.strides[a];
  dispatch_all(x.dtype, "gather", [&]<class T>() {
    const T* xp = x.data<T>();
    T* yp = y.data<T>();
    dispatch_index(idx.dtype, name(), [&]<class Ix>() {
      const Ix* ip = idx.data<Ix>();
      parallel_for(rows.count, cpu::row_grain(J), [&](int64_t b, int64_t e) {
        for (int64_t m = b; m < e; ++m) {
          const auto off = rows.row(m);
          const Ix* ir = ip + off[0];
          const T* xr = xp + off[1];
          T* yr = yp + off[2];
          for (int64_t j = 0; j < J; ++j) yr[j * ys] = xr[static_cast<int64_t>(ir[j * is]) * xs];
        }
      });
    });
  });
}

void ScatterAdd::eval_cpu(const std::vector<const Array*>& in,
                          const std::vector<Array*>& out) const {
  const Array& g = *in[0];
  const Array& idx = *in[1];
  const size_t a = static_cast<size_t>(axis_);
  const int64_t V = full_[a], J = idx.shape[a];
  if (auto bad = find_bad_index(idx, V)) fail_bad_index("scatter_add", *bad, V, axis_);
  Array& y = *out[0];
  y.allocate();
  const Rows rows(idx.shape, axis_, {&idx.strides, &g.strides, &y.strides});
  const int64_t is = idx.strides[a], gs = g.strides[a], ys = y.strides[a];
  dispatch_float(g.dtype, "scatter_add", [&]<class T>() {
    using C = compute_t<T>;
    Accumulator<T> acc(y);
    C* yp = acc.data();  // contiguous like y, so y's strides apply
    const T* gp = g.data<T>();
    dispatch_index(idx.dtype, name(), [&]<class Ix>() {
      const Ix* ip = idx.data<Ix>();
      // Distinct rows write distinct elements (they differ off the axis): no races.
      parallel_for(rows.count, cpu::row_grain(J), [&](int64_t b, int64_t e) {
        for (int64_t m = b; m < e; ++m) {
          const auto off = rows.row(m);
          const Ix* ir = ip + off[0];
          const T* gr = gp + off[1];
          C* yr = yp + off[2];
          for (int64_t j = 0; j < J; ++j)
            yr[static_cast<int64_t>(ir[j * is]) * ys] += to_compute(gr[j * gs]);
        }
      });
    });
    acc.finish();
  });
}

}  // namespace hetrain
