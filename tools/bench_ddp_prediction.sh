#!/usr/bin/env bash
# The DDP step time `hetrain simulate --ranks 2` predicts against `mpirun -np 2 hetrain train`
# (docs/PERFORMANCE.md, issue 21), on gpt-mini (batch 32) and a wide MLP (fashion-mlp --hidden
# 1024,1024, batch 128), 1 thread per rank, ROUNDS rounds (default 3).
#   1. `hetrain bench` and `mpirun -np 2 hetrain bench --comm`: the device profile with its
#      collective timings (in a fresh cache directory under OUT);
#   2. per round and model: one rank's half batch trained under `mpirun -np 1` (bound to a core
#      as a rank is; it records the performance models simulate uses), `simulate --ranks 2`,
#      then the measured `mpirun -np 2` run and `mpirun -np 1` with the whole batch.
# Prints one line per round: predicted and measured median step, the error, comm per step.
# Run it on a quiet machine: other load makes two ranks wait for each other's time slices.
#   tools/bench_ddp_prediction.sh BUILD/hetrain OUT [ROUNDS]
set -uo pipefail
ht=$(realpath "${1:?usage: tools/bench_ddp_prediction.sh HETRAIN OUT [ROUNDS]}")
out=${2:?usage: tools/bench_ddp_prediction.sh HETRAIN OUT [ROUNDS]}
rounds=${3:-3}
mkdir -p "$out" && cd "$out" || exit 1
export XDG_CACHE_HOME=$PWD/cache OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
rm -rf cache
uptime
"$ht" bench > bench.out 2>&1 || { cat bench.out; exit 1; }
mpirun -np 2 "$ht" bench --comm > comm.out 2>&1 || { cat comm.out; exit 1; }
grep -E "^(ddp_fixed_order|all_reduce) " comm.out
for r in $(seq "$rounds"); do
  for m in gpt mlp; do
    if [[ $m == gpt ]]; then args=(--preset gpt-mini); ev=(--eval-batches 2); B=32
    else args=(--preset fashion-mlp --hidden 1024,1024); ev=(); B=128; fi
    run=(train "${args[@]}" "${ev[@]}" --threads 1 --steps 30 --no-progress)
    echo "round $r $m: $(uptime)"
    mpirun -np 1 "$ht" "${run[@]}" --batch-size $((B / 2)) --json-log "$m.half.$r.jsonl" > /dev/null 2>&1
    "$ht" simulate "${args[@]}" --threads 1 --batch-size $B --ranks 2 --json > "$m.sim.$r.json"
    mpirun -np 2 "$ht" "${run[@]}" --batch-size $B --no-record --json-log "$m.np2.$r.jsonl" > /dev/null 2>&1
    mpirun -np 1 "$ht" "${run[@]}" --batch-size $B --no-record --json-log "$m.np1.$r.jsonl" > /dev/null 2>&1
    python3 - "$m" "$r" <<'PY'
import json, sys
m, r = sys.argv[1], sys.argv[2]
fin = lambda f: [json.loads(l) for l in open(f) if '"final"' in l][0]
sim = json.load(open(f"{m}.sim.{r}.json"))
np2, np1, half = fin(f"{m}.np2.{r}.jsonl"), fin(f"{m}.np1.{r}.jsonl"), fin(f"{m}.half.{r}.jsonl")
d, pred, meas = sim["data_parallel"], sim["step_time_s"], np2["step_time_s"]
print(f"  {m}: predicted {pred:.4f} s (rank {d['rank_step_time_s']:.4f} + comm {d['comm_s']:.4f}, "
      f"{len(d['bucket_bytes'])} buckets), measured {meas:.4f} s: {100 * (pred - meas) / meas:+.1f}%; "
      f"np2 comm_s {np2['comm_s'] / np2['steps']:.4f} exposed {np2['exposed_comm_s'] / np2['steps']:.4f} "
      f"per step; {np2['samples_per_s']:.1f} samples/s against np1 {np1['samples_per_s']:.1f}; "
      f"half batch on one rank {half['step_time_s']:.4f} s")
PY
  done
done
uptime
