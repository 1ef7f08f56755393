#!/usr/bin/env bash
# Interleaved A/B of two hetrain binaries on the presets: each round trains every preset and
# precision for a few steps with A, then with B, so both see the same drift of a shared
# machine; prints each run and then the median step time of each and the ratio A/B (above 1: B
# is faster), with the range of the rounds' own ratios and how many rounds B won. A ratio holds
# on a shared machine where an absolute time does not.
# Usage: tools/bench_ab.sh A_BINARY B_BINARY [ROUNDS (4)] [STEPS (30)]
#   PRESETS="gpt-mini fashion-cnn" PRECISIONS="bf16 fp32" THREADS=2 BUSY=1 (keep one core busy
#   with a shell loop while measuring: the machine shared with other work)
set -euo pipefail
[ $# -ge 2 ] || { sed -n '2,8p' "$0"; exit 2; }
a=$1 b=$2 rounds=${3:-4} steps=${4:-30}
for bin in "$a" "$b"; do [ -x "$bin" ] || { echo "not an executable: $bin"; exit 2; }; done
presets=${PRESETS:-gpt-mini fashion-cnn} precisions=${PRECISIONS:-bf16 fp32}
threads=${THREADS:-2}
tmp=$(mktemp -d)
busy_pid=
cleanup() { [ -n "$busy_pid" ] && kill "$busy_pid" 2> /dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
if [ -n "${BUSY:-}" ]; then (while :; do :; done) & busy_pid=$!; fi
echo "load before: $(cat /proc/loadavg)" >&2
for r in $(seq "$rounds"); do
  for preset in $presets; do
    for p in $precisions; do
      for side in A B; do
        bin=$a
        [ "$side" = B ] && bin=$b
        XDG_CACHE_HOME=$tmp/cache "$bin" train --preset "$preset" --precision "$p" --steps "$steps" \
          --threads "$threads" --eval-batches 1 --no-record --no-progress --log-every 1000000 \
          --json-log "$tmp/run.jsonl" > /dev/null 2>&1 || { echo "run failed: $bin $preset $p"; exit 1; }
        t=$(python3 -c 'import json,sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    if "step_time_s" in r: t = r["step_time_s"]
print(t)' "$tmp/run.jsonl")
        echo "$r $preset $p $side $t" | tee -a "$tmp/all.txt"
      done
    done
  done
done
python3 - "$tmp/all.txt" << 'PY'
import collections, statistics, sys
d = collections.defaultdict(dict)
for line in open(sys.argv[1]):
    r, preset, p, side, t = line.split()
    d[(preset, p, side)][r] = float(t)
# Each round runs A and B back to back, so a round's ratio A/B holds when the machine's speed
# drifts between rounds; their spread and how many rounds B won show whether the medians' ratio
# stands out of the noise.
print("| preset | precision | A median (s) | B median (s) | A / B | per-round A / B | B faster |")
print("|---|---|---|---|---|---|---|")
for preset, p in dict.fromkeys((k[0], k[1]) for k in d):
    a, b = d[(preset, p, "A")], d[(preset, p, "B")]
    ma, mb = statistics.median(a.values()), statistics.median(b.values())
    ratios = [a[r] / b[r] for r in a if r in b]
    won = sum(x > 1 for x in ratios)
    print(f"| {preset} | {p} | {ma:.4f} | {mb:.4f} | {ma / mb:.2f}x | "
          f"{min(ratios):.2f}-{max(ratios):.2f}x | {won} of {len(ratios)} rounds |")
PY
