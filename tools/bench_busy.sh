#!/usr/bin/env bash
# Training on a busy machine (docs/PERFORMANCE.md, "On a busy machine"): step times while other
# processes keep CPUs busy, as a compile in another terminal does. HOGS busy loops (default 1),
# each in a session of its own (so that the kernel's autogroups share the cores between them and
# the benchmark, as between terminals), run through the whole measurement. Then, per preset and
# precision, in the same run:
#   hetrain auto     no --threads: the team follows the free CPUs (base/cpu_load.h)
#   hetrain fixed    --threads $(nproc), the team the run starts with everywhere else
#   pytorch N        PyTorch 2.x eager (tools/install_peer.sh; PEER_PYTHON overrides) on N threads:
#                    every CPU, and the CPUs the hogs leave; the faster is the peer's figure
# Step times are medians after the warm-up (hetrain: the final record's step_time_s, which skips
# 5 steps; the team settles within about a second). Prints a markdown table.
# Usage: tools/bench_busy.sh [STEPS]   (PRESETS, PRECISIONS, HOGS override)
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-40}
hogs=${HOGS:-1}
cpus=$(nproc)
presets=${PRESETS:-fashion-cnn gpt-mini}
precisions=${PRECISIONS:-fp32 bf16}
peer=${PEER_PYTHON:-.venv-peer/bin/python}
[ -x "$peer" ] || { echo "no peer at $peer: run tools/install_peer.sh first" >&2; exit 1; }
free=$((cpus > hogs ? cpus - hogs : 1))
tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2> /dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT
for ((i = 0; i < hogs; ++i)); do
  setsid sh -c 'while :; do :; done' &
  pids+=($!)
done
echo "$hogs busy loop(s) on $cpus CPUs; load: $(cat /proc/loadavg)" >&2

hetrain_step() {  # preset precision [flags...]: the median step time
  local preset=$1 p=$2
  shift 2
  ./build/hetrain train --preset "$preset" --precision "$p" --steps "$steps" --no-progress \
    --log-every 1000000 --eval-batches 1 --no-record --json-log "$tmp/log.jsonl" "$@" \
    > /dev/null 2>&1
  python3 -c 'import json, sys
r = [json.loads(l) for l in open(sys.argv[1]) if "\"final\"" in l][-1]
print("%.4f %d" % (r["step_time_s"], r["threads"]))' "$tmp/log.jsonl"
}
peer_step() {  # preset precision threads
  "$peer" tools/bench_train_torch.py "$1" --steps "$steps" --threads "$3" --precision "$2" \
    --mode eager | python3 -c 'import json, sys; print("%.4f" % json.load(sys.stdin)["step_time_s"])'
}

echo "| preset | precision | hetrain auto (s, final team) | hetrain --threads $cpus (s) | pytorch $cpus threads (s) | pytorch $free threads (s) | peer's best / hetrain auto |"
echo "|---|---|---|---|---|---|---|"
for preset in $presets; do
  for p in $precisions; do
    read -r auto team < <(hetrain_step "$preset" "$p")
    read -r fixed _ < <(hetrain_step "$preset" "$p" --threads "$cpus")
    pa=$(peer_step "$preset" "$p" "$cpus")
    pf=$(peer_step "$preset" "$p" "$free")
    ratio=$(python3 -c "print('%.2fx' % (min($pa, $pf) / $auto))")
    echo "| $preset | $p | $auto ($team) | $fixed | $pa | $pf | $ratio |"
  done
done
