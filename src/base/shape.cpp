#include "hetrain/base/shape.h"

#include <algorithm>

#include "hetrain/base/error.h"

namespace hetrain {

int64_t numel(const Shape& s) { return numel(s, 0, s.size()); }

int64_t numel(const Shape& s, size_t b, size_t e) {
  int64_t n = 1;
  for (size_t i = b; i < e; ++i) {
    // A shape read from a file or built from one (an ONNX Reshape target, a Tile count) can ask
    // for more elements than 64 bits count: an error, not a wrapped product.
    if (__builtin_mul_overflow(n, s[i], &n))
      fail("[shape] ", shape_str(s), " has more elements than a 64-bit count holds");
  }
  return n;
}

ORI split_at(const Shape& s, int axis) {
  const auto a = static_cast<size_t>(axis);
  return {numel(s, 0, a), s[a], numel(s, a + 1, s.size())};
}

Strides contiguous_strides(const Shape& s) {
  Strides st(s.size());
  int64_t acc = 1;
  for (size_t i = s.size(); i-- > 0;) {
    st[i] = acc;
    if (__builtin_mul_overflow(acc, std::max<int64_t>(s[i], 1), &acc))
      fail("[shape] ", shape_str(s), " has more elements than a 64-bit count holds");
  }
  return st;
}

std::string shape_str(const Shape& s) {
  std::string out = "(";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(s[i]);
  }
  return out + ")";
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    if (da != db && da != 1 && db != 1)
      fail("[", op, "] shapes ", shape_str(a), " and ", shape_str(b), " do not broadcast");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

int normalize_axis(int64_t axis, size_t ndim, const char* op) {
  int64_t n = static_cast<int64_t>(ndim);
  if (axis < -n || axis >= n)
    fail("[", op, "] axis ", axis, " is out of range for a tensor with ", ndim, " dimensions");
  return static_cast<int>(axis < 0 ? axis + n : axis);
}

std::vector<int> normalize_axes(const std::vector<int64_t>& axes, size_t ndim, const char* op) {
  std::vector<int> out;
  for (auto a : axes) {
    int ax = normalize_axis(a, ndim, op);
    if (std::find(out.begin(), out.end(), ax) != out.end())
      fail("[", op, "] axis ", a, " appears more than once");
    out.push_back(ax);
  }
  std::sort(out.begin(), out.end());
  return out;
}

bool is_contiguous(const Shape& s, const Strides& st) {
  int64_t acc = 1;
  for (size_t i = s.size(); i-- > 0;) {
    if (s[i] != 1 && st[i] != acc) return false;
    acc *= s[i];
  }
  return true;
}

}  // namespace hetrain
