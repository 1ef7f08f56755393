#!/usr/bin/env bash
# Runs each libFuzzer target of build-asan/fuzz (tools/run_sanitizers.sh builds them) for a
# while, starting from its seed corpus in fuzz/corpus/<name>/. New inputs go to a scratch
# directory, never into the repository; a finding (crash, sanitizer report, leak, uncaught
# exception, timeout, out-of-memory) fails the script and leaves its input in
# build-asan/fuzz-findings/. docs/FUZZING.md says how to run them longer.
# Usage: tools/run_fuzzers.sh [SECONDS_EACH (default 20)] [TARGET...]
# FUZZ_SEED=N fixes libFuzzer's random seed; unset (as in CI), each run draws a new seed and
# explores further. A finding prints the seed it ran with and the input it failed on, so
# `FUZZ_SEED=N tools/run_fuzzers.sh 10 TARGET` explores the same way again.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-20}
shift || true
bin=build-asan/fuzz
[ -d "$bin" ] || { echo "no $bin: run tools/run_sanitizers.sh first (it builds the fuzz targets)"; exit 1; }
targets=("$@")
if ((${#targets[@]} == 0)); then
  for f in "$bin"/fuzz_*; do targets+=("$(basename "$f" | sed 's/^fuzz_//')"); done
fi
findings=build-asan/fuzz-findings
mkdir -p "$findings"
export ASAN_OPTIONS=detect_leaks=1:strict_string_checks=1:check_initialization_order=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
failed=()
for t in "${targets[@]}"; do
  scratch=$(mktemp -d)
  start=$(date +%s)
  # -timeout: one input may take 10 s; -rss_limit_mb / -malloc_limit_mb: an input that makes a
  # parser allocate past 2 GiB is a finding (a size taken from the file unchecked).
  if "$bin/fuzz_$t" "$scratch" "fuzz/corpus/$t" -max_total_time="$secs" -timeout=10 \
       -rss_limit_mb=2048 -malloc_limit_mb=2048 -artifact_prefix="$findings/$t-" \
       -print_final_stats=1 ${FUZZ_SEED:+-seed="$FUZZ_SEED"} > "$findings/$t.log" 2>&1; then
    runs=$(sed -nE 's/^stat::number_of_executed_units: *([0-9]+)/\1/p' "$findings/$t.log")
    cov=$(grep -oE 'cov: [0-9]+' "$findings/$t.log" | tail -1)
    echo "fuzz_$t: $((($(date +%s) - start))) s, ${runs:-?} inputs, ${cov:-cov: ?}, no finding"
  else
    echo "fuzz_$t: FINDING (log: $findings/$t.log)"
    grep -E "INFO: Seed:|ERROR|SUMMARY|uncaught|terminate|==[0-9]+==" "$findings/$t.log" | head -20
    # The failing input, as text where it is printable (most targets read text formats).
    for a in "$findings/$t"-*; do
      [ -f "$a" ] && { echo "input $a:"; head -c 600 "$a" | cat -v; echo; }
    done
    failed+=("$t")
  fi
  rm -rf "$scratch"
done
((${#failed[@]} == 0)) || { echo "fuzz findings in: ${failed[*]}"; exit 1; }
echo "all ${#targets[@]} fuzz targets ran ${secs} s each without a finding"
