#!/usr/bin/env bash
# Training throughput of the three presets: Hetrain against PyTorch CPU (same model, batch,
# thread count, AdamW), one after the other in the same run. Usage: tools/bench_train.sh [STEPS]
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-30}
threads=$(nproc)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
printf "%-12s %14s %14s %8s %16s %16s\n" preset "hetrain s/s" "pytorch s/s" ratio "hetrain peak MiB" "torch RSS+ MiB"
for preset in fashion-mlp fashion-cnn gpt-mini; do
  ./build/hetrain train --preset "$preset" --steps "$steps" --threads "$threads" --no-progress \
    --log-every 1000000 --eval-batches 1 --no-record --json-log "$tmp/$preset.jsonl" > /dev/null 2>&1
  h=$(grep '"final"' "$tmp/$preset.jsonl")
  t=$(/usr/bin/python3 tools/bench_train_torch.py "$preset" --steps "$steps" --threads "$threads")
  python3 - "$preset" "$h" "$t" <<'PY'
import json, sys
p, h, t = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
hs, ts = h["samples_per_s"], t["samples_per_s"]
print(f"{p:<12} {hs:14.1f} {ts:14.1f} {hs/ts:8.2f} {h['peak_memory_bytes']['total']/2**20:16.1f} "
      f"{t['peak_rss_growth_bytes']/2**20:16.1f}")
PY
done
