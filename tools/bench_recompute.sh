#!/usr/bin/env bash
# Activation checkpointing on a deep, narrow GPT (docs/PERFORMANCE.md): for each depth and
# --recompute mode, the step's activation peak predicted by --dry-run and measured by the
# allocator (peak_memory_bytes of the JSON result), and the median step time.
# Usage: tools/bench_recompute.sh [HETRAIN] [STEPS] [THREADS] > table.md
set -euo pipefail
bin=${1:-build/hetrain}
steps=${2:-8}
threads=${3:-1}
shape=(--preset gpt-mini --width 64 --heads 4 --context 64 --batch-size 16 --dropout 0.1
       --eval-batches 1 --no-progress --no-record --threads "$threads")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export XDG_CACHE_HOME="$tmp/cache"
mib() { python3 -c "print(f'{$1 / 1048576:.1f}')"; }
echo "| layers | recompute | predicted activations (MiB) | measured activations (MiB) | measured total (MiB) | step (s) | auto's plan |"
echo "|---|---|---|---|---|---|---|"
for layers in 8 16 32 64; do
  for mode in none full auto; do
    pred=$("$bin" train "${shape[@]}" --layers "$layers" --recompute "$mode" --dry-run \
           | awk '/^activations/ {print $0}')
    "$bin" train "${shape[@]}" --layers "$layers" --recompute "$mode" --steps "$steps" \
      --json-log "$tmp/log.jsonl" --json > "$tmp/r.json" 2> "$tmp/r.err"
    plan=$(sed -nE 's/^recompute auto \([^)]*\): (.*)$/\1/p' "$tmp/r.err")
    read -r act total < <(python3 -c "
import json; r = json.load(open('$tmp/r.json'))['peak_memory_bytes']
print(r['activations'], r['total'])")
    step=$(python3 -c "
import json
for l in open('$tmp/log.jsonl'):
    r = json.loads(l)
    if r.get('final'): print(f\"{r['step_time_s']:.3f}\")")
    echo "| $layers | $mode | $(awk '{print $(NF-1)}' <<<"$pred") | $(mib "$act") | $(mib "$total") | $step | ${plan:--} |"
  done
done
