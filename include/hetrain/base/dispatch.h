// Run-time dtype to compile-time type: dispatch_float(dt, "op", [&]<class T>() { ... }).
#pragma once

#include "hetrain/base/dtype.h"
#include "hetrain/base/error.h"

namespace hetrain {

template <class F>
void dispatch_float(Dtype dt, const char* op, F&& f) {
  switch (dt) {
    case Dtype::f64:
      f.template operator()<double>();
      return;
    case Dtype::f32:
      f.template operator()<float>();
      return;
    case Dtype::f16:
      f.template operator()<Half>();
      return;
    case Dtype::bf16:
      f.template operator()<BFloat16>();
      return;
    default:
      fail("[", op, "] does not support dtype ", dtype_name(dt), " (floating point only)");
  }
}

template <class F>
void dispatch_numeric(Dtype dt, const char* op, F&& f) {
  switch (dt) {
    case Dtype::i32:
      f.template operator()<int32_t>();
      return;
    case Dtype::i64:
      f.template operator()<int64_t>();
      return;
    case Dtype::boolean:
      fail("[", op, "] does not support dtype bool");
    default:
      dispatch_float(dt, op, std::forward<F>(f));
  }
}

template <class F>
void dispatch_all(Dtype dt, const char* op, F&& f) {
  if (dt == Dtype::boolean) {
    f.template operator()<bool>();
    return;
  }
  dispatch_numeric(dt, op, std::forward<F>(f));
}

/// Integer index dtypes (i32, i64): dispatch_index(dt, "op", [&]<class I>() { ... }).
template <class F>
void dispatch_index(Dtype dt, const char* op, F&& f) {
  switch (dt) {
    case Dtype::i32:
      f.template operator()<int32_t>();
      return;
    case Dtype::i64:
      f.template operator()<int64_t>();
      return;
    default:
      fail("[", op, "] indices must be i32 or i64, got ", dtype_name(dt));
  }
}

}  // namespace hetrain
