// Strided copies with dtype conversion (round to nearest even into f16/bf16). Graph-free.
#pragma once

#include "hetrain/memory/array.h"

namespace hetrain {

/// Copies x's (possibly strided) elements into out (whose shape is x's, any strides),
/// converting dtype. Used by casts and by kernels that need contiguous inputs.
void copy_strided(const Array& x, Array& out);
/// A contiguous array with x's values (x itself, shared, when already contiguous).
Array contiguous_array(const Array& x);

}  // namespace hetrain
