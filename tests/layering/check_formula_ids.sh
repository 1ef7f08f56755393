#!/usr/bin/env bash
# An elementwise op whose formula is not in backends/scalar_ops.h's lists has no id, so naming
# it where the CUDA glue does (formulas::unary_id / binary_id) does not compile; an op that is
# listed does. Compiled as host C++ (the id lookup is the same code nvcc sees). Usage:
#   check_formula_ids.sh CXX SOURCE_DIR
set -uo pipefail
cxx=$1 src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
probe() {  # $1: the op's base formula, $2: unary_id or binary_id
  cat > "$tmp/probe.cpp" <<CPP
#include "backends/scalar_ops.h"
struct NewOp : $1 {};
constexpr auto id = hetrain::formulas::$2<NewOp>();
CPP
  "$cxx" -std=c++20 -fsyntax-only -I"$src/src" -I"$src/include" "$tmp/probe.cpp" > "$tmp/log" 2>&1
}
fail=0
probe hetrain::formulas::Exp unary_id || { echo "FAIL: a listed unary formula does not compile"; cat "$tmp/log"; fail=1; }
probe hetrain::formulas::GeluTanhGrad binary_id || { echo "FAIL: a listed binary formula does not compile"; cat "$tmp/log"; fail=1; }
for kind in unary_id binary_id; do
  # A formula of its own, in no list.
  cat > "$tmp/probe.cpp" <<CPP
#include "backends/scalar_ops.h"
struct Unlisted {
  static constexpr bool float_only = true, is_compare = false;
  template <class C> static C f(C x) { return x; }
};
struct NewOp : Unlisted {};
constexpr auto id = hetrain::formulas::$kind<NewOp>();
CPP
  if "$cxx" -std=c++20 -fsyntax-only -I"$src/src" -I"$src/include" "$tmp/probe.cpp" > "$tmp/log" 2>&1; then
    echo "FAIL: $kind of an unlisted formula compiled"
    fail=1
  elif ! grep -q "whose formula is not in HETRAIN_" "$tmp/log"; then
    echo "FAIL: $kind of an unlisted formula failed for another reason:"
    cat "$tmp/log"
    fail=1
  fi
done
((fail == 0)) && echo "formula ids hold"
exit $fail
