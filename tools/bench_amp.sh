#!/usr/bin/env bash
# Mixed-precision benchmark (docs/PERFORMANCE.md, issue 5): step time and peak activation
# memory of fashion-cnn and gpt-mini in fp32, bf16 and fp16 through `hetrain train`, then the
# same models in PyTorch CPU fp32 and under PyTorch CPU autocast (bf16), one after the other in
# the same run. Usage: tools/bench_amp.sh [STEPS]   (prints a markdown table)
#
# Hetrain: median step time after 5 warm-up steps (the final record's step_time_s) and the
# allocator's peak of the 'activations' tag (all live activations and temporaries of a step).
# PyTorch 2.x (tools/install_peer.sh; PEER_PYTHON overrides), eager and torch.compile, the
# faster quoted with its mode: median step time after the warm-up steps and the bytes of the
# tensors autograd saves for backward (parameters excluded), timed without hooks.
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-20}
threads=${THREADS:-$(nproc)}
presets=${PRESETS:-fashion-mlp fashion-cnn gpt-mini}
peer=${PEER_PYTHON:-.venv-peer/bin/python}
[ -x "$peer" ] || { echo "no peer at $peer: run tools/install_peer.sh first" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "load before: $(cat /proc/loadavg)" >&2
echo "| preset | run | step time (s) | vs own fp32 | peak activations (MiB) | vs own fp32 |"
echo "|---|---|---|---|---|---|"
for preset in $presets; do
  rows=()
  for p in fp32 bf16 fp16; do
    ./build/hetrain train --preset "$preset" --precision "$p" --steps "$steps" --threads "$threads" \
      --no-progress --log-every 1000000 --eval-batches 1 --no-record \
      --json-log "$tmp/$preset-$p.jsonl" > /dev/null 2>&1
    rows+=("hetrain $p|$(grep '"final"' "$tmp/$preset-$p.jsonl")")
  done
  for p in fp32 bf16; do
    e=$("$peer" tools/bench_train_torch.py "$preset" --steps "$steps" --threads "$threads" \
      --precision "$p" --mode eager)
    c=$("$peer" tools/bench_train_torch.py "$preset" --steps "$steps" --threads "$threads" \
      --precision "$p" --mode compile --warmup 10 2>/dev/null) || c=$e
    best=$(python3 -c 'import json, sys
e, c = (json.loads(a) for a in sys.argv[1:])
print(json.dumps(c if c["step_time_s"] < e["step_time_s"] else e))' "$e" "$c")
    rows+=("pytorch $p $(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["mode"])' "$best")|$best")
  done
  python3 - "$preset" "${rows[@]}" <<'PY'
import json, sys
preset, rows = sys.argv[1], sys.argv[2:]
base = {}
for row in rows:
    name, rec = row.split("|", 1)
    r = json.loads(rec)
    framework = name.split()[0]
    t = r["step_time_s"]
    act = r["peak_memory_bytes"]["activations"] if framework == "hetrain" else r["saved_activation_bytes"]
    base.setdefault(framework, (t, act))
    bt, ba = base[framework]
    print(f"| {preset} | {name} | {t:.4f} | x{bt / t:.2f} | {act / 2**20:.1f} | {100 * (act / ba - 1):+.0f}% |")
PY
done
echo "load after: $(cat /proc/loadavg)" >&2
