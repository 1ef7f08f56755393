#!/usr/bin/env bash
# Formatting gate: every C++/CUDA source and header in the tree is as clang-format (the
# project's .clang-format) writes it. With --fix, rewrites the files instead of checking.
#   tools/check_format.sh [--fix]
set -euo pipefail
cd "$(dirname "$0")/.."
mapfile -t files < <(git ls-files 'src/*.cpp' 'src/*.h' 'src/*.cu' 'src/*.cuh' 'include/*.h' \
                                  'tests/*.cpp' 'tests/*.h' 'bench/*.cpp' 'bench/*.h')
if [ "${1:-}" = "--fix" ]; then
  clang-format -i "${files[@]}"
  exit 0
fi
if ! clang-format --dry-run -Werror "${files[@]}"; then
  echo "check_format: the files above differ from clang-format's output; run tools/check_format.sh --fix" >&2
  exit 1
fi
echo "check_format: ${#files[@]} files formatted"
