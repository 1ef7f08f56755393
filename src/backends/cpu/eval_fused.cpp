// CPU kernel of the fused elementwise chain: the output is cut into blocks of whole trailing
// dimensions; for each block every step runs its own kernel on the block's slices, its
// intermediate in a per-thread scratch buffer that stays in cache, the last step writing the
// block of the output in place.
#include <algorithm>

#include "backends/cpu/strided.h"
#include "graph/prims/fused.h"
#include "hetrain/base/thread_pool.h"

namespace hetrain {

namespace {

/// Elements per block: below kElementwiseGrain, so each step's kernel runs its block inline.
constexpr int64_t kBlock = cpu::kElementwiseGrain;

/// The output cut into blocks: dimensions [0, split) are walked one index at a time,
/// dimension `split` in pieces of `piece`, the dimensions after it whole.
struct Blocking {
  size_t split = 0;
  int64_t piece = 1, pieces = 1, count = 1;
  int64_t max_elements = 1;  // of one block
};

Blocking blocking(const Shape& shape) {
  Blocking b;
  if (shape.empty()) return b;
  int64_t inner = numel(shape);
  size_t s = 0;
  // The first dimension s whose trailing dimensions (s, end) fit a block: dimension s is cut
  // into pieces of as many indices as fit. (Walking on while [s, end) is larger than a block
  // cut (B, T, C) activations into blocks of one C-row each, and the per-block views cost more
  // than the kernels on them.)
  while (s + 1 < shape.size() && inner / std::max<int64_t>(shape[s], 1) > kBlock)
    inner /= std::max<int64_t>(shape[s++], 1);
  // Now inner = elements of dimensions [s, end); one index of dimension s holds inner / shape[s].
  const int64_t row = shape[s] > 0 ? inner / shape[s] : 0;
  b.split = s;
  b.piece = std::max<int64_t>(1, row > 0 ? kBlock / row : 1);
  b.piece = std::min(b.piece, std::max<int64_t>(shape[s], 1));
  b.pieces = (shape[s] + b.piece - 1) / b.piece;
  b.count = b.pieces;
  for (size_t d = 0; d < s; ++d) b.count *= shape[d];
  b.max_elements = std::max<int64_t>(1, b.piece * row);
  return b;
}

/// Block i of a (an array of the output's shape) as a view: same buffer, fewer dimensions.
Array block_of(const Array& a, const Blocking& b, int64_t i, const Shape& block_shape) {
  int64_t off = a.offset;
  const int64_t piece_index = i % b.pieces;
  int64_t outer = i / b.pieces;
  for (size_t d = b.split; d-- > 0;) {
    off += (outer % a.shape[d]) * a.strides[d];
    outer /= a.shape[d];
  }
  off += piece_index * b.piece * (a.shape.empty() ? 0 : a.strides[b.split]);
  Array v;
  v.shape = block_shape;
  v.dtype = a.dtype;
  v.tag = a.tag;
  v.view_of(a, Strides(a.strides.begin() + static_cast<std::ptrdiff_t>(b.split), a.strides.end()),
            off);
  return v;
}

}  // namespace

void ElementwiseChain::eval_cpu(const std::vector<const Array*>& in,
                                const std::vector<Array*>& out) const {
  Array& y = *out[0];
  if (!y.has_data()) y.allocate();
  const Shape& shape = y.shape;
  if (numel(shape) == 0) return;
  const Blocking b = blocking(shape);
  const size_t nsteps = steps_.size();
  parallel_for(b.count, 1, [&](int64_t lo, int64_t hi) {
    // Scratch for the intermediates, once per range of blocks.
    std::vector<Array> scratch(nsteps - 1);
    for (size_t k = 0; k + 1 < nsteps; ++k) {
      scratch[k].shape = {b.max_elements};
      scratch[k].dtype = steps_[k].out.dtype;
      scratch[k].tag = MemoryTag::workspace;
      scratch[k].allocate();
    }
    std::vector<Array> views(in.size() + nsteps);
    std::vector<const Array*> slot(in.size() + nsteps);
    std::vector<const Array*> args;
    for (int64_t i = lo; i < hi; ++i) {
      const int64_t piece_index = i % b.pieces;
      Shape block_shape(shape.begin() + static_cast<std::ptrdiff_t>(b.split), shape.end());
      if (!block_shape.empty())
        block_shape[0] = std::min(b.piece, shape[b.split] - piece_index * b.piece);
      for (size_t j = 0; j < in.size(); ++j) {
        views[j] = shape.empty() ? *in[j] : block_of(*in[j], b, i, block_shape);
        slot[j] = &views[j];
      }
      for (size_t k = 0; k < nsteps; ++k) {
        const Step& s = steps_[k];
        Array& o = views[in.size() + k];
        if (k + 1 < nsteps) {
          o = scratch[k];
          o.shape = block_shape;
          o.strides = contiguous_strides(block_shape);
        } else {
          o = shape.empty() ? y : block_of(y, b, i, block_shape);
        }
        args.clear();
        for (int a : s.args) args.push_back(slot[static_cast<size_t>(a)]);
        s.prim->eval_cpu(args, {&o});
        slot[in.size() + k] = &o;
      }
    }
  });
}

void WithEpilogue::eval_cpu(const std::vector<const Array*>& in,
                            const std::vector<Array*>& out) const {
  Array& y = *out[0];
  const std::vector<const Array*> main_in(in.begin(), in.begin() + num_main_);
  std::vector<TensorMeta> metas;
  for (const Array* a : main_in) metas.push_back({a->shape, a->dtype});
  const TensorMeta produced = main_->infer(metas).at(0);
  const Shape& seen = as_shape_ ? *as_shape_ : produced.shape;
  // Where the chain keeps the producer's shape and dtype (and the output has no buffer yet),
  // the producer's result becomes the output buffer and the chain runs over it in place: every
  // step reads an element before the last step writes that element.
  const bool in_place = !y.has_data() && seen == y.shape && produced.dtype == y.dtype;
  Array t;
  t.shape = produced.shape;
  t.dtype = produced.dtype;
  t.tag = in_place ? y.tag : MemoryTag::workspace;
  main_->eval_cpu(main_in, {&t});
  if (as_shape_) {  // the kernel's result is contiguous: the same elements in the seen shape
    t.shape = seen;
    t.strides = contiguous_strides(seen);
  }
  if (!in_place) {
    epilogue_->eval_cpu(chain_inputs<const Array*>(&t, in), out);
    return;
  }
  epilogue_->eval_cpu(chain_inputs<const Array*>(&t, in), {&t});
  y.view_of(t, t.strides, t.offset);
}

}  // namespace hetrain
