// Iteration over N strided operands of one shape, collapsed to as few dimensions as the
// strides allow and split across the thread pool. The innermost callback sees a run of
// elements with a fixed stride per operand, so contiguous cases become plain loops.
#pragma once

#include <array>
#include <vector>

#include "hetrain/base/shape.h"
#include "hetrain/base/thread_pool.h"

namespace hetrain::cpu {

template <size_t N>
struct Collapsed {
  Shape shape;
  std::array<Strides, N> strides;
};

template <size_t N>
Collapsed<N> collapse(const Shape& shape, const std::array<const Strides*, N>& st) {
  Collapsed<N> c;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    if (!c.shape.empty()) {
      bool merge = true;
      for (size_t k = 0; k < N; ++k) merge = merge && c.strides[k].back() == (*st[k])[d] * shape[d];
      if (merge) {
        c.shape.back() *= shape[d];
        for (size_t k = 0; k < N; ++k) c.strides[k].back() = (*st[k])[d];
        continue;
      }
    }
    c.shape.push_back(shape[d]);
    for (size_t k = 0; k < N; ++k) c.strides[k].push_back((*st[k])[d]);
  }
  if (c.shape.empty()) {
    c.shape.push_back(1);
    for (size_t k = 0; k < N; ++k) c.strides[k].push_back(0);
  }
  return c;
}

/// Calls run(pos, step, len) for consecutive runs of the flat index space, where pos[k] is
/// the element offset of operand k and step[k] its inner stride.
template <size_t N, class Run>
void for_each_run(const Shape& shape, const std::array<const Strides*, N>& st, int64_t grain,
                  Run&& run) {
  const int64_t total = numel(shape);
  if (total == 0) return;
  // Fast path: every operand contiguous, so the index space is one run (no collapsing, no
  // coordinates, and no allocation for small tensors).
  bool flat = true;
  for (size_t k = 0; k < N; ++k) flat = flat && is_contiguous(shape, *st[k]);
  if (flat) {
    std::array<int64_t, N> step;
    step.fill(1);
    if (total <= grain) {
      std::array<int64_t, N> pos{};
      run(pos, step, total);
      return;
    }
    parallel_for(total, grain, [&](int64_t b, int64_t e) {
      std::array<int64_t, N> pos;
      pos.fill(b);
      run(pos, step, e - b);
    });
    return;
  }
  const Collapsed<N> c = collapse<N>(shape, st);
  const size_t nd = c.shape.size();
  const int64_t inner = c.shape.back();
  std::array<int64_t, N> step;
  for (size_t k = 0; k < N; ++k) step[k] = c.strides[k].back();
  auto body = [&](int64_t b, int64_t e) {
    int64_t coord_small[8];
    std::vector<int64_t> coord_large;
    int64_t* coord = coord_small;
    if (nd > 8) {
      coord_large.resize(nd);
      coord = coord_large.data();
    }
    std::array<int64_t, N> pos{};
    int64_t rem = b;
    for (size_t d = nd; d-- > 0;) {
      coord[d] = rem % c.shape[d];
      rem /= c.shape[d];
      for (size_t k = 0; k < N; ++k) pos[k] += coord[d] * c.strides[k][d];
    }
    int64_t i = b;
    while (i < e) {
      int64_t len = std::min(inner - coord[nd - 1], e - i);
      run(pos, step, len);
      i += len;
      coord[nd - 1] += len;
      for (size_t k = 0; k < N; ++k) pos[k] += len * step[k];
      // Carry into outer dimensions.
      for (size_t d = nd - 1; d > 0 && coord[d] == c.shape[d]; --d) {
        for (size_t k = 0; k < N; ++k) pos[k] -= c.shape[d] * c.strides[k][d];
        coord[d] = 0;
        ++coord[d - 1];
        for (size_t k = 0; k < N; ++k) pos[k] += c.strides[k][d - 1];
      }
    }
  };
  if (total <= grain) {
    body(0, total);
  } else {
    parallel_for(total, grain, body);
  }
}

inline constexpr int64_t kElementwiseGrain = 1 << 14;

}  // namespace hetrain::cpu
