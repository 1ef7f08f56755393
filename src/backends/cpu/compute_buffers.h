// Buffers for kernels that compute in f32/f64 whatever the storage dtype: contiguous inputs
// in the compute dtype, workspace arrays, and outputs rounded from a compute temporary.
#pragma once

#include <type_traits>

#include "backends/cpu/copy.h"
#include "backends/cpu/gemm.h"
#include "hetrain/memory/array.h"

namespace hetrain::cpu {

/// f64 computes in f64; f32, f16 and bf16 in f32.
inline Dtype compute_dtype(Dtype dt) { return dt == Dtype::f64 ? Dtype::f64 : Dtype::f32; }

/// A fresh contiguous array tagged as workspace.
inline Array workspace(Shape shape, Dtype dt) {
  Array a;
  a.shape = std::move(shape);
  a.dtype = dt;
  a.tag = MemoryTag::workspace;
  a.allocate();
  return a;
}

/// x as a contiguous array of dtype dt (x itself when it already is one).
inline Array as_contiguous(const Array& x, Dtype dt) {
  if (x.dtype == dt) return contiguous_array(x);
  Array c = workspace(x.shape, dt);
  copy_strided(x, c);
  return c;
}

/// The output y itself when it has the compute dtype, else a temporary that finish_output
/// rounds into y.
inline Array start_output(Array& y, Dtype compute) {
  if (y.dtype == compute) {
    y.allocate();
    return y;
  }
  return workspace(y.shape, compute);
}
inline void finish_output(const Array& tmp, Array& y) {
  if (tmp.buffer == y.buffer) return;
  y.allocate();
  copy_strided(tmp, y);
}

/// sgemm or dgemm by element type.
template <class T>
void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, T alpha, const T* A, int64_t lda,
          const T* B, int64_t ldb, T beta, T* C, int64_t ldc) {
  if constexpr (std::is_same_v<T, float>) {
    sgemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  } else {
    dgemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  }
}

/// Calls f.template operator()<T>() with T = float or double for a compute dtype.
template <class F>
void dispatch_compute(Dtype compute, F&& f) {
  if (compute == Dtype::f64)
    f.template operator()<double>();
  else
    f.template operator()<float>();
}

}  // namespace hetrain::cpu
