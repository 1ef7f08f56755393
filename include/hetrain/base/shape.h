// Shapes and strides, in elements.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace hetrain {

using Shape = std::vector<int64_t>;
using Strides = std::vector<int64_t>;

int64_t numel(const Shape& s);
/// Elements of the dimensions s[b..e).
int64_t numel(const Shape& s, size_t b, size_t e);
/// Sizes of a shape viewed as (outer, axis, inner) around one axis.
struct ORI {
  int64_t O = 1, R = 1, I = 1;
};
ORI split_at(const Shape& s, int axis);
Strides contiguous_strides(const Shape& s);
/// "(2, 3)"; "()" for a scalar.
std::string shape_str(const Shape& s);
/// NumPy broadcasting; throws "[op] shapes (..) and (..) do not broadcast".
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);
/// Maps a possibly negative axis into [0, ndim); throws naming op on out of range.
int normalize_axis(int64_t axis, size_t ndim, const char* op);
std::vector<int> normalize_axes(const std::vector<int64_t>& axes, size_t ndim, const char* op);
bool is_contiguous(const Shape& s, const Strides& st);

}  // namespace hetrain
