#!/usr/bin/env bash
# The planner's model states and peak against the allocator's: for gpt-mini under `mpirun -np NP
# hetrain train --zero S`, every rank's parameters + gradients + optimizer state live at the
# update (rank_memory in the log) must be within 3% of `hetrain plan --preset gpt-mini --hardware
# local --gpus NP --zero S --precision fp32` (weights + gradients + optimizer per device), and the
# rank's peak of live bytes over the run within 10% of the plan's total per device.
# Usage: zero_plan.sh HETRAIN NP
set -euo pipefail
. "$(dirname "$0")/lib.sh"
ht=$1 np=$2
# (Two steps: the optimizer state exists from the first update on.)
# Hardware 'local' is this machine's device profile (the memory figures do not depend on it).
logged bench "$ht" bench --quick --threads 1
status=0
for z in 0 1 2 3; do
  logged "z$z" mpi "$np" 200 "$ht" train --preset gpt-mini --steps 2 --batch-size 8 \
    --eval-batches 1 "${quiet[@]}" --zero "$z" --json-log "$dir/z$z.jsonl"
  # The preset: Hetrain's own engine profile (its layout, activations and step peak).
  "$ht" plan --preset gpt-mini \
    --hardware local --gpus "$np" --zero "$z" --precision fp32 --global-batch 8 \
    --micro-batch $((8 / np)) --json > "$dir/plan$z.json" 2> "$dir/plan$z.err" \
    || { cat "$dir/plan$z.err"; exit 1; }
  python3 - "$dir/z$z.jsonl" "$dir/plan$z.json" "$z" "$np" <<'EOF' || status=1
import json, sys
log, plan, z, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
fin = [json.loads(l) for l in open(log) if '"final"' in l][0]
p = json.load(open(plan))["plans"][0]
m = p["memory_per_gpu_bytes"]
want = m["weights"] + m["gradients"] + m["optimizer"]
ok = len(fin["rank_memory"]) == n
for r in fin["rank_memory"]:
    got = r["at_update_bytes"]["model_states"]
    err = got / want - 1
    good = abs(err) <= 0.03
    ok = ok and good
    print(f"{'' if good else 'FAIL: '}zero {z} rank {r['rank']}: model states measured {got} B, "
          f"planned {want:.0f} B ({p['params']} parameters), error {100 * err:+.2f}%")
    peak, planned = r["peak_bytes"]["total"], m["total"]
    err = planned / peak - 1
    good = abs(err) <= 0.10
    ok = ok and good
    print(f"{'' if good else 'FAIL: '}zero {z} rank {r['rank']}: peak measured {peak} B "
          f"(at the peak: {r['at_peak_bytes']}), planned {planned:.0f} B, error {100 * err:+.2f}%")
sys.exit(0 if ok else 1)
EOF
done
[[ $status == 0 ]] && echo "ZeRO -np $np: model states within 3% of the plan, peaks within 10%"
exit $status
