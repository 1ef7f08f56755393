#include "backends/cuda/common.h"

#include "backends/cuda/check.h"
#include "backends/cuda/context.h"
#include "hetrain/base/error.h"

namespace hetrain::cuda {

cudaStream_t stream() { return current_context().stream; }

Iter make_iter(const Shape& shape, std::initializer_list<const Array*> operands) {
  Iter it;
  const int nops = static_cast<int>(operands.size());
  HT_ASSERT(nops >= 1 && nops <= kMaxOperands);
  it.numel = numel(shape);
  // Dimensions kept (size > 1), outermost first, then merged where every operand allows.
  std::vector<int64_t> sh;
  std::vector<std::vector<int64_t>> st(static_cast<size_t>(nops));
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    const bool merge = !sh.empty() && [&] {
      int k = 0;
      for (const Array* a : operands) {
        if (st[static_cast<size_t>(k)].back() != a->strides[d] * shape[d]) return false;
        ++k;
      }
      return true;
    }();
    if (merge) {
      sh.back() *= shape[d];
      int k = 0;
      for (const Array* a : operands) st[static_cast<size_t>(k++)].back() = a->strides[d];
    } else {
      sh.push_back(shape[d]);
      int k = 0;
      for (const Array* a : operands) st[static_cast<size_t>(k++)].push_back(a->strides[d]);
    }
  }
  if (sh.size() > static_cast<size_t>(kMaxDims))
    fail("[cuda] an elementwise iteration over ", shape_str(shape), " needs ", sh.size(),
         " dimensions after merging; the CUDA kernels handle ", kMaxDims);
  it.ndim = static_cast<int>(sh.size());
  it.contiguous = true;
  for (int d = 0; d < it.ndim; ++d) {
    it.shape[d] = sh[static_cast<size_t>(d)];
    for (int k = 0; k < nops; ++k) {
      it.strides[k][d] = st[static_cast<size_t>(k)][static_cast<size_t>(d)];
      // Contiguous overall: one dimension left, unit stride in every operand.
      if (it.ndim > 1 || it.strides[k][d] != 1) it.contiguous = false;
    }
  }
  return it;
}

Array device_array(const Shape& shape, Dtype dt, MemoryTag tag) {
  Array a;
  a.shape = shape;
  a.dtype = dt;
  a.tag = tag;
  a.allocate();
  HT_ASSERT(a.device().kind == DeviceKind::cuda);
  return a;
}

void copy_strided(const Array& x, Array& y) {
  HT_ASSERT(x.shape == y.shape);
  launch_cast(x.dtype, y.dtype, make_iter(x.shape, {&y, &x}), y.raw(), x.raw(), stream());
}

Array contiguous(const Array& x) {
  if (x.contiguous()) return x;
  Array c = device_array(x.shape, x.dtype);
  copy_strided(x, c);
  return c;
}

void zero(Array& a) { HT_CUDA_CHECK(cudaMemsetAsync(a.raw(), 0, a.nbytes(), stream())); }

}  // namespace hetrain::cuda
