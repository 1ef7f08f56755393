#!/usr/bin/env bash
# The planner against our own runs (docs/PLANNING.md, "Against our own runs"): measures this
# machine's device profile, trains the presets and variants for a few steps (each appends its
# measured step time to the measured-runs file), then prints predicted vs measured.
#   tools/measure_planner.sh [THREADS]        (default 1; build/hetrain must exist)
# On a shared machine, prefix with `chrt -r 1` (root) so other processes do not take the CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
threads=${1:-1}
export XDG_CACHE_HOME=${XDG_CACHE_HOME:-$(mktemp -d)}
rm -f "$XDG_CACHE_HOME/hetrain/measured_runs.json"
h=./build/hetrain
$h bench --threads "$threads"
run() { $h train --threads "$threads" --no-progress --log-every 1000 "$@" >/dev/null; }
run --preset fashion-mlp --steps 300
run --preset fashion-mlp --steps 150 --hidden 1024,1024 --batch-size 256
run --preset fashion-cnn --steps 40
run --preset fashion-cnn --steps 25 --widths 32,64,128
run --preset gpt-mini --steps 40 --eval-batches 1
run --preset gpt-mini --steps 20 --width 256 --heads 8 --context 128 --batch-size 16 --eval-batches 1
$h plan --measured "$XDG_CACHE_HOME/hetrain/measured_runs.json" --hardware local --preset gpt2-124m
