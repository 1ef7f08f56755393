#!/usr/bin/env bash
# clang-tidy with the agreed checks (.clang-tidy) on the C++ sources a change touches: the files
# that differ from BASE (default: the previous commit; CI runs on a clone of main, so that is
# the newest landing). Needs a configured build folder with compile_commands.json.
#   tools/check_tidy.sh BUILD_DIR [BASE]
set -euo pipefail
build=${1:?usage: tools/check_tidy.sh BUILD_DIR [BASE]}
base=${2:-HEAD~1}
cd "$(dirname "$0")/.."
[ -f "$build/compile_commands.json" ] || { echo "check_tidy: no $build/compile_commands.json" >&2; exit 2; }
if ! git rev-parse -q --verify "$base^{commit}" >/dev/null; then
  echo "check_tidy: no commit '$base' (a shallow clone?); checking nothing"
  exit 0
fi
mapfile -t files < <(git diff --name-only --diff-filter=d "$base" -- 'src/*.cpp' 'tests/*.cpp' 'bench/*.cpp')
# Only files the build compiles (CUDA sources are not in a CPU-only database).
checked=()
for f in "${files[@]}"; do
  grep -q "\"file\": \".*/$f\"" "$build/compile_commands.json" && checked+=("$f")
done
echo "check_tidy: ${#checked[@]} changed source file(s) since $base"
((${#checked[@]})) || exit 0
# GCC-only warning flags in the database are not clang's: ignore those, not the checks.
clang-tidy -p "$build" --quiet --extra-arg=-Wno-unknown-warning-option "${checked[@]}"
