#!/usr/bin/env bash
# The planner against our own runs (docs/PLANNING.md, "Against our own runs"): measures this
# machine's device profile, trains the presets and variants for a few steps (each appends its
# measured step time to the measured-runs file), then prints predicted vs measured.
#   [ROUNDS=R] tools/measure_planner.sh [THREADS]        (default 1; build/hetrain must exist)
# ROUNDS > 1 repeats the whole measurement (a fresh profile, then the six runs) R times, each
# in its own cache directory, and ends with the median error of each run over the rounds: on a
# VM whose speed drifts by tens of percent within minutes, one round can catch the bench in a
# slow minute and the runs in a fast one (or the reverse); the median of rounds, each bench
# taken right before its runs, is the figure to quote.
# On a shared machine, prefix with `chrt -r 1` (root) so other processes do not take the CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
threads=${1:-1}
rounds=${ROUNDS:-1}
base=${XDG_CACHE_HOME:-$(mktemp -d)}
h=./build/hetrain
run() { $h train --threads "$threads" --no-progress --log-every 1000 "$@" >/dev/null; }
for round in $(seq "$rounds"); do
  export XDG_CACHE_HOME="$base"
  [ "$rounds" -gt 1 ] && export XDG_CACHE_HOME="$base/round$round"
  mkdir -p "$XDG_CACHE_HOME"
  rm -f "$XDG_CACHE_HOME/hetrain/measured_runs.json"
  if [ "$rounds" -gt 1 ]; then
    $h bench --threads "$threads" >/dev/null
  else
    $h bench --threads "$threads"
  fi
  run --preset fashion-mlp --steps 300
  run --preset fashion-mlp --steps 150 --hidden 1024,1024 --batch-size 256
  run --preset fashion-cnn --steps 40
  run --preset fashion-cnn --steps 25 --widths 32,64,128
  run --preset gpt-mini --steps 40 --eval-batches 1
  run --preset gpt-mini --steps 20 --width 256 --heads 8 --context 128 --batch-size 16 --eval-batches 1
  if [ "$rounds" -gt 1 ]; then
    $h plan --measured "$XDG_CACHE_HOME/hetrain/measured_runs.json" --hardware local \
      --preset gpt2-124m --json > "$XDG_CACHE_HOME/plan.json"
    echo "round $round of $rounds done ($(date -u +%H:%M) UTC)"
  else
    $h plan --measured "$XDG_CACHE_HOME/hetrain/measured_runs.json" --hardware local \
      --preset gpt2-124m
  fi
done
if [ "$rounds" -gt 1 ]; then
  python3 - "$base" "$rounds" <<'PY'
import json, statistics, sys
base, rounds = sys.argv[1], int(sys.argv[2])
runs = {}
for r in range(1, rounds + 1):
    for run in json.load(open(f"{base}/round{r}/plan.json"))["calibration"]["runs"]:
        runs.setdefault(run["label"], []).append(run)
print(f"{'run (the round with the median error)':<80} {'measured ms':>12} {'predicted ms':>13} "
      f"{'error':>8} {'range over rounds':>18}")
medians = []
for label, rs in runs.items():
    rs = sorted(rs, key=lambda x: x["step_error"])
    mid = rs[(len(rs) - 1) // 2]
    medians.append(abs(mid["step_error"]))
    print(f"{label:<80} {1e3 * mid['measured_step_time_s']:12.2f} "
          f"{1e3 * mid['predicted_step_time_s']:13.2f} {100 * mid['step_error']:+7.1f}% "
          f"{100 * rs[0]['step_error']:+8.1f}..{100 * rs[-1]['step_error']:+.1f}%")
print(f"mean |median error| over {len(medians)} runs: {100 * statistics.mean(medians):.1f}%, "
      f"worst {100 * max(medians):.1f}%")
PY
fi
