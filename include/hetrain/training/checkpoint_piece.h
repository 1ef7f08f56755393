// The pieces of a sharded checkpoint (checkpoint.h), apart from the file format so that the
// sharded optimizer (distributed) can say what its rank holds without seeing safetensors.
#pragma once

#include <cstdint>
#include <string>

#include "hetrain/graph/tensor.h"

namespace hetrain::training::checkpoint {

/// One run of a tensor's flat elements [begin, begin + numel(values)) in a shard file.
struct Piece {
  std::string part, tensor;  // "model", "w"; "train_state", "exp_avg.w"
  int64_t begin = 0;
  Tensor values;  // any shape; written flat
};

/// A whole tensor of a sharded checkpoint: what its pieces make up.
struct TensorLayout {
  Dtype dtype = Dtype::f32;
  Shape shape;
};

}  // namespace hetrain::training::checkpoint
