#!/usr/bin/env bash
# Collective timings in the device profile, and the DDP step predicted from them:
#   1. `mpirun -np 2 hetrain bench --comm --quick` stores a "comm" table for 2 ranks (every
#      collective, 1 KiB to 4 MiB) in the device profile; `hetrain bench --quick` rewrites the
#      profile and keeps the table.
#   2. A hand-made profile with known timings: `simulate --ranks 2` charges each of the
#      trainer's gradient buckets the ddp_fixed_order time interpolated from the table, and the
#      step is one rank's simulated step (half the batch: the same as simulating that batch,
#      but for the host time the simulator measures) plus their sum. fashion-mlp --hidden
#      64,32 is one bucket of 52,650 f32 parameters; gpt-mini's buckets add up to its 834,304.
#   3. plan --hardware local --gpus 2 charges the same timings (gpt-mini's 3.3 MB of gradients in
#      the default buckets); errors: no timings for 4 ranks, a batch that 2 ranks do not divide.
# Usage: comm_profile.sh HETRAIN
set -uo pipefail
. "$(dirname "$0")/lib.sh"
ht=$1
prof=$XDG_CACHE_HOME/hetrain/device_profile.json
logged comm mpi 2 200 -x XDG_CACHE_HOME="$XDG_CACHE_HOME" -- "$ht" bench --comm --quick
table() {  # the stored table's world size and row count per op
  python3 -c '
import json, sys
j = json.load(open(sys.argv[1]))
for t in j["comm"]:
    ops = {}
    for r in t["rows"]:
        ops[r["op"]] = ops.get(r["op"], 0) + 1
    print(t["world_size"], t["backend"], sorted(ops.items()))' "$prof"
}
want="2 mpi [('all_gather', 7), ('all_reduce', 7), ('ddp_fixed_order', 7), ('reduce_scatter', 7)]"
[[ "$(table)" == "$want" ]] || fail "stored table: $(table), expected $want"
echo "bench --comm stored: $(table)"
logged bench "$ht" bench --quick
[[ "$(table)" == "$want" ]] || fail "hetrain bench dropped the table: $(table)"
grep -q '"gemm_tflops"' "$prof" || fail "hetrain bench wrote no rates"
echo "hetrain bench kept the collective timings"

# 2. Known timings: ddp_fixed_order 1 ms at 1 KiB, 3 ms at 1 MiB, 9 ms at 4 MiB.
cat > "$prof" <<'JSON'
{"version": 1, "gemm_tflops": {"f32": 0.05}, "mem_bw_gbs": 10, "mem_bytes": 16e9,
 "comm": [{"world_size": 2, "backend": "mpi", "date": "test", "rows": [
   {"op": "ddp_fixed_order", "bytes": 1024, "seconds": 1e-3},
   {"op": "ddp_fixed_order", "bytes": 1048576, "seconds": 3e-3},
   {"op": "ddp_fixed_order", "bytes": 4194304, "seconds": 9e-3}]}]}
JSON
sim() {  # sim NAME ARGS...
  local name=$1
  shift
  "$ht" simulate --threads 1 --json "$@" > "$dir/$name.json" 2> "$dir/$name.err" \
    || { cat "$dir/$name.err"; fail "simulate $*"; }
}
check() {  # check NAME ONE PARAMS: the formula against simulate's answer; names what differs
  python3 - "$dir/$1.json" "$dir/$2.json" "$3" <<'PY'
import json, sys
j, one, params = json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), int(sys.argv[3])
d = j["data_parallel"]
pts = [(1024, 1e-3), (1048576, 3e-3), (4194304, 9e-3)]
def t(b):
    if b <= pts[0][0]:
        return pts[0][1]
    i = next((k for k in range(1, len(pts)) if pts[k][0] >= b), len(pts) - 1)
    (x0, y0), (x1, y1) = pts[i - 1], pts[i]
    return y0 + (y1 - y0) * (b - x0) / (x1 - x0)
buckets = d["bucket_bytes"]
comm = 0.0
for b in buckets:
    comm += t(b)
# One rank's step is the simulation of its share of the batch: the same simulated work (the
# step less the host time each process measured) and the same graph.
work, work_one = d["rank_step_time_s"] - j["host_time_s"], one["step_time_s"] - one["host_time_s"]
conds = {
    "bucket bytes sum to 4 x the parameters": sum(buckets) == 4 * params,
    "the first bucket is at most 1 MiB": buckets[0] <= 1048576,
    f"comm {d['comm_s']!r} is the formula's {comm!r}": d["comm_s"] == comm,
    "ranks is 2": d["ranks"] == 2,
    f"simulated work {work!r} s is the one-rank run's {work_one!r} s": abs(work - work_one) < 1e-9,
    f"nodes per step {j['nodes_per_step']} are the one-rank run's {one['nodes_per_step']}":
        j["nodes_per_step"] == one["nodes_per_step"],
    "step is one rank's step plus comm": j["step_time_s"] == d["rank_step_time_s"] + d["comm_s"],
}
print(f"{j['preset']}: {len(buckets)} bucket(s) {buckets}: comm {d['comm_s']:.9f} s "
      f"(formula {comm:.9f}), step {j['step_time_s']:.6f} s = one rank's "
      f"{d['rank_step_time_s']:.6f} s (batch 16: {one['step_time_s']:.6f}) + comm")
bad = [c for c, ok in conds.items() if not ok]
for c in bad:
    print("not so:", c)
sys.exit(1 if bad else 0)
PY
}
# predict NAME PARAMS ARGS...: simulates ARGS at batch 32 on 2 ranks and at batch 16 alone,
# and checks the first against the second. A mismatch is simulated once more before it fails:
# one clean-clone CI run (2026-12-06) saw gpt-mini's simulated work differ between the two
# processes, which no run here has reproduced; the second try and its report say whether it
# recurs.
predict() {
  local name=$1 params=$2
  shift 2
  local try
  for try in 1 2; do
    sim "${name}2" "$@" --batch-size 32 --ranks 2
    sim "${name}1" "$@" --batch-size 16
    check "${name}2" "${name}1" "$params" && return 0
    echo "$name: try $try differs (above)"
  done
  return 1
}
mlp=(--preset fashion-mlp --hidden 64,32)
predict mlp 52650 "${mlp[@]}" || fail "fashion-mlp prediction"
predict gpt 834304 --preset gpt-mini --bucket-mb 0.25 || fail "gpt-mini prediction"

# 3. Errors.
"$ht" simulate "${mlp[@]}" --batch-size 32 --ranks 4 > "$dir/e1" 2>&1 && fail "--ranks 4 accepted"
grep -q "has collective timings for 2 rank(s), not 4; run 'hetrain bench' and 'mpirun -np 4 hetrain bench --comm'" "$dir/e1" \
  || { cat "$dir/e1"; fail "--ranks 4 message"; }
"$ht" simulate "${mlp[@]}" --batch-size 33 --ranks 2 > "$dir/e2" 2>&1 && fail "batch 33 accepted"
grep -q "batch-size 33 must divide by --ranks 2" "$dir/e2" || { cat "$dir/e2"; fail "batch message"; }
plan=(plan --preset gpt-mini --hardware local --tp 1 --pp 1 --zero 0 --offload none --recompute none
      --precision fp32 --global-batch 32)
"$ht" "${plan[@]}" --gpus 4 --micro-batch 8 > "$dir/e3" 2>&1 && fail "plan --gpus 4 accepted"
grep -q "'local' with 4 data-parallel ranks needs collective timings for 4 ranks in its device profile (it has them for: 2); run 'mpirun -np 4 hetrain bench --comm'" "$dir/e3" \
  || { cat "$dir/e3"; fail "plan --gpus 4 message"; }
"$ht" "${plan[@]}" --gpus 2 --micro-batch 16 > "$dir/plan2" 2>&1 || { cat "$dir/plan2"; fail "plan --gpus 2"; }
# 3,337,216 bytes of gradients: 1 MiB (3 ms) and 2,288,640 bytes (3 + 6 x 1,240,064 / 3,145,728 ms).
grep -qE "data-parallel/ZeRO comm \(total\) +0.008365" "$dir/plan2" || { cat "$dir/plan2"; fail "plan --gpus 2 comm"; }
echo "DDP step predicted from the device profile's collective timings"
