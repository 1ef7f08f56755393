#include "hetrain/memory/array.h"

namespace hetrain {

void Array::allocate() {
  strides = contiguous_strides(shape);
  offset = 0;
  buffer = host_allocator().allocate(std::max<size_t>(nbytes(), 1), tag);
}

}  // namespace hetrain
