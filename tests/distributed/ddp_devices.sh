#!/usr/bin/env bash
# DDP with an accelerator in --devices against DDP on the CPU alone: `mpirun -np NP hetrain train
# ARGS --devices cpu,sim:0` must write model and training-state files byte-identical to
# `--devices cpu` (sim kernels are the CPU's), and log the same losses. Each launch starts from
# an empty cache (mpirun.sh), so the scheduler, without measured kernel times yet, places nodes
# on sim:0 that read the parameters (the casts of --precision bf16): after an update their copies
# there must not hold the last step's values (the flat parameter buffers are written in place).
# Usage: ddp_devices.sh HETRAIN NP ARGS...   (ARGS include --steps)
set -euo pipefail
. "$(dirname "$0")/lib.sh"
ht=$1 np=$2
shift 2
common=(train "${quiet[@]}" --log-every 1 "$@")
for devices in cpu cpu,sim:0; do
  logged "$devices" mpi "$np" 300 "$ht" "${common[@]}" --devices "$devices" \
    --save "$dir/$devices" --json-log "$dir/$devices.jsonl"
done
status=0
same_files "$dir/cpu" "$dir/cpu,sim:0" "between --devices cpu and cpu,sim:0" \
  model.1.safetensors train_state.1.safetensors || status=1
same_losses "$dir/cpu.jsonl" "$dir/cpu,sim:0.jsonl" "(cpu, cpu,sim:0)" || status=1
((status == 0)) && echo "DDP -np $np on cpu,sim:0 equals cpu"
exit $status
