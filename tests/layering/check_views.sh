#!/usr/bin/env bash
# The layer views hold (cmake/layers.cmake): for every layer, a header of each layer at or below
# it (or allowed by an exception) preprocesses against the layer's view, and a header of each
# layer above it does not: the include is not found. Usage:
#   check_views.sh CXX BUILD_DIR SOURCE_DIR "LAYERS..." "EXCEPTIONS..."
set -uo pipefail
cxx=$1 build=$2 src=$3
read -ra layers <<<"$4"
read -ra exceptions <<<"$5"
# One header per layer that has headers (a public one where the layer has any).
probe_header() {
  case $1 in
    kernels) echo "backends/cpu/vec.h" ;;
    glue|cli) echo "" ;;
    *) local h; h=$(cd "$src/include" && ls hetrain/"$1"/*.h 2>/dev/null | head -1); echo "$h" ;;
  esac
}
fail=0 checked=0
for ((i = 0; i < ${#layers[@]}; ++i)); do
  layer=${layers[i]} view=$build/layers/${layers[i]}
  [ -d "$view" ] || { echo "FAIL: no view $view"; fail=1; continue; }
  for ((j = 0; j < ${#layers[@]}; ++j)); do
    other=${layers[j]}
    h=$(probe_header "$other")
    [ -n "$h" ] || continue
    want=ok
    if ((j > i)); then
      want=missing
      for e in "${exceptions[@]}"; do [ "$e" = "$layer:$other" ] && want=ok; done
    fi
    out=$(echo "#include \"$h\"" | "$cxx" -std=c++20 -E -x c++ -I"$view/include" -I"$view/src" -o /dev/null - 2>&1)
    rc=$?
    got=ok
    if ((rc != 0)); then
      # GCC says "No such file or directory", clang "file not found".
      if grep -qE "No such file|file not found" <<<"$out"; then got=missing; else got="error: $out"; fi
    fi
    checked=$((checked + 1))
    if [ "$got" != "$want" ]; then
      echo "FAIL: layer $layer including $h: expected $want, got $got"
      fail=1
    fi
  done
done
echo "check_views.sh: $checked includes checked"
((fail == 0)) && echo "layer views hold"
exit $fail
