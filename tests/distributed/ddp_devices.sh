#!/usr/bin/env bash
# DDP with an accelerator in --devices against DDP on the CPU alone: `mpirun -np NP hetrain train
# ARGS --devices cpu,sim:0` must write model and training-state files byte-identical to
# `--devices cpu` (sim kernels are the CPU's), and log the same losses. Each launch starts from
# an empty cache (mpirun.sh), so the scheduler, without measured kernel times yet, places nodes
# on sim:0 that read the parameters (the casts of --precision bf16): after an update their copies
# there must not hold the last step's values (the flat parameter buffers are written in place).
# Usage: ddp_devices.sh HETRAIN NP ARGS...   (ARGS include --steps)
set -euo pipefail
ht=$1 np=$2
shift 2
here=$(cd "$(dirname "$0")" && pwd)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
common=(train --no-progress --no-record --threads 1 --log-every 1 "$@")
for devices in cpu cpu,sim:0; do
  bash "$here/mpirun.sh" "$np" 300 "$ht" "${common[@]}" --devices "$devices" \
    --save "$dir/$devices" --json-log "$dir/$devices.jsonl" > "$dir/$devices.out" 2>&1 \
    || { cat "$dir/$devices.out"; exit 1; }
done
status=0
for f in model.1.safetensors train_state.1.safetensors; do
  if cmp -s "$dir/cpu/$f" "$dir/cpu,sim:0/$f"; then
    echo "$f: identical ($(stat -c %s "$dir/cpu/$f") bytes)"
  else
    echo "FAIL: $f differs between --devices cpu and cpu,sim:0"
    status=1
  fi
done
losses() { grep -o '"loss":[^,]*' "$1"; }
if [[ "$(losses "$dir/cpu.jsonl")" != "$(losses "$dir/cpu,sim:0.jsonl")" ]]; then
  echo "FAIL: logged losses differ (cpu, cpu,sim:0)"
  paste <(losses "$dir/cpu.jsonl") <(losses "$dir/cpu,sim:0.jsonl")
  status=1
fi
((status == 0)) && echo "DDP -np $np on cpu,sim:0 equals cpu"
exit $status
