#!/usr/bin/env bash
# Who progresses DDP's non-blocking bucket exchanges (issue 21): HETRAIN_DDP_PROGRESS=executor
# (each executor node polls), thread (a communication thread polls while backward runs) or none
# (nothing until reduce(), the baseline), measured under `mpirun -np N hetrain train` for
# gpt-mini and fashion-mlp at 1, 2 and 4 ranks, one thread a rank. Rounds are interleaved (each
# round runs every model x ranks x mode once, the mode order rotated) so drifting load hits
# every mode alike. Prints a markdown table: the median over rounds of each run's step_time_s
# and exposed_comm_s (the final --json-log record; step_time_s is the median step after the
# warm-up). Run it on a quiet machine.
# Usage: tools/bench_ddp_progress.sh [STEPS] [ROUNDS]   (defaults 30 5)
# Env: MODES ("executor thread none"), RANKS ("1 2 4"), PRESETS ("gpt-mini fashion-mlp"),
#      HETRAIN (./build/hetrain)
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-30} rounds=${2:-5}
read -r -a modes <<< "${MODES:-executor thread none}"
read -r -a ranks <<< "${RANKS:-1 2 4}"
read -r -a presets <<< "${PRESETS:-gpt-mini fashion-mlp}"
ht=${HETRAIN:-./build/hetrain}
[ -x "$ht" ] || { echo "no $ht: build first" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 XDG_CACHE_HOME=$tmp/cache
echo "load before: $(cat /proc/loadavg)" >&2
for ((round = 0; round < rounds; ++round)); do
  for preset in "${presets[@]}"; do
    for np in "${ranks[@]}"; do
      for ((i = 0; i < ${#modes[@]}; ++i)); do
        mode=${modes[$(((i + round) % ${#modes[@]}))]}
        log=$tmp/$preset.$np.$mode.$round.jsonl
        HETRAIN_DDP_PROGRESS=$mode timeout -k 5 900 mpirun --oversubscribe -np "$np" \
          "$ht" train --preset "$preset" --steps "$steps" --threads 1 --no-progress \
          --no-record --log-every 1000000 --eval-batches 1 --json-log "$log" > "$tmp/out" 2>&1 ||
          { cat "$tmp/out" >&2; echo "FAIL: $preset -np $np $mode" >&2; exit 1; }
      done
    done
  done
  echo "round $((round + 1))/$rounds done, load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
done
echo "load after: $(cat /proc/loadavg)" >&2
python3 - "$tmp" "$rounds" "${presets[*]}" "${ranks[*]}" "${modes[*]}" <<'PY'
import json, statistics, sys
tmp, rounds = sys.argv[1], int(sys.argv[2])
presets, ranks, modes = (a.split() for a in sys.argv[3:6])
print(f"| preset | ranks | progress | step_time_s (median of {rounds}) | exposed_comm_s |")
print("|---|---|---|---|---|")
for p in presets:
    for n in ranks:
        for m in modes:
            fin = []
            for r in range(rounds):
                with open(f"{tmp}/{p}.{n}.{m}.{r}.jsonl") as f:
                    fin.append([json.loads(l) for l in f if '"final"' in l][-1])
            step = statistics.median(x["step_time_s"] for x in fin)
            exposed = statistics.median(x["exposed_comm_s"] for x in fin)
            print(f"| {p} | {n} | {m} | {step:.4f} | {exposed:.4f} |")
PY
