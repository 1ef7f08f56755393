#!/usr/bin/env bash
# ZeRO stages 1, 2 and 3 against stage 0: `mpirun -np NP hetrain train --zero S ARGS` must write
# sharded checkpoints that, consolidated (`hetrain checkpoint consolidate`), are model and
# training-state files byte-identical to --zero 0's, log the same losses, and every rank's model-state bytes, read from the allocator
# when the optimizer updates, must equal the formulas with P = parameters + stated padding:
#   stage 0: 4P + 4P + 8P,  stage 1: 4P + 4P + 8P/N,  stage 2: 4P + 4P/N + 8P/N,
#   stage 3: 4P/N + 4P/N + 8P/N (at the update no parameter bucket is gathered: the working
#   set, one or two whole buckets during forward and backward, is in the peak, not here)
# (with fp16's grad scaler the gradients gain the unscaled copy of what the rank updates: 4P
# under stage 0, 4P/N under stages 1-3). Stage 3 must also have gathered parameter buckets:
# its peak of parameter bytes exceeds 4P/N. "3p" is stage 3 with --param-persistence-threshold
# 64: the small parameters' buckets (W elements with their padding, the log's
# zero_persistent_elements) stay whole, so its parameters are 4((P - W)/N + W).
# Usage: zero_equal.sh HETRAIN NP ARGS...
set -euo pipefail
. "$(dirname "$0")/lib.sh"
ht=$1 np=$2
shift 2
common=(train "${quiet[@]}" --log-every 5 "$@")
run() {  # run NAME ARGS...
  local name=$1
  shift
  logged "$name" mpi "$np" 200 "$ht" "${common[@]}" "$@" --save "$dir/$name" \
    --json-log "$dir/$name.jsonl"
}
run z0 --zero 0
run z1 --zero 1
run z2 --zero 2 --save-every 10
run z3 --zero 3 --save-every 10
# Stage 3 with parameters of at most 64 elements (biases, norms) kept whole in their own buckets.
run z3p --zero 3 --param-persistence-threshold 64
# The stage-2 checkpoint of step 10 (one shard per rank, gathered on loading) resumed under
# stage 3 and stage 3's under stage 1: the shards are cut again, and the runs end where stage
# 0 does.
run resumed --zero 3 --resume "$dir/z2/step-10"
run resumed3 --zero 1 --resume "$dir/z3/step-10"
for name in z1 z2 z3 z3p resumed resumed3; do
  "$ht" checkpoint consolidate "$dir/$name" -o "$dir/$name.c" > /dev/null || exit 1
done
status=0
parts=(model.1.safetensors train_state.1.safetensors)
echo "resumed at step 10 (zero 2 -> 3):"
same_files "$dir/z0" "$dir/resumed.c" "after resuming zero 2's step-10 checkpoint under zero 3" \
  "${parts[@]}" || status=1
echo "resumed at step 10 (zero 3 -> 1):"
same_files "$dir/z0" "$dir/resumed3.c" "after resuming zero 3's step-10 checkpoint under zero 1" \
  "${parts[@]}" || status=1
for z in 1 2 3 3p; do
  echo "zero $z (consolidated) against zero 0:"
  same_files "$dir/z0" "$dir/z$z.c" "between --zero 0 and --zero $z at -np $np" "${parts[@]}" \
    checkpoint.json || status=1
  same_losses "$dir/z0.jsonl" "$dir/z$z.jsonl" "between --zero 0 and --zero $z" || status=1
done
# The formulas, per rank, from the final record's rank_memory (python3's standard library).
python3 - "$dir" "$np" <<'EOF' || status=1
import json, struct, sys
d, n = sys.argv[1], int(sys.argv[2])
with open(f"{d}/z0/model.1.safetensors", "rb") as f:
    head = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
psi = 0
for k, v in head.items():
    if k != "__metadata__":
        c = 1
        for s in v["shape"]:
            c *= s
        psi += c
ok = True
for z in (0, 1, 2, 3, "3p"):
    fin = [json.loads(l) for l in open(f"{d}/z{z}.jsonl") if '"final"' in l][0]
    p = psi + fin["zero_padding_elements"]
    pp = fin.get("zero_persistent_elements", 0)  # kept whole on every rank (3p)
    want = {0: (4 * p, 4 * p, 8 * p), 1: (4 * p, 4 * p, 8 * p // n),
            2: (4 * p, 4 * p // n, 8 * p // n), 3: (4 * p // n, 4 * p // n, 8 * p // n),
            "3p": (4 * ((p - pp) // n + pp), 4 * p // n, 8 * p // n)}[z]
    if z == "3p" and pp == 0:
        print("FAIL: --param-persistence-threshold 64 kept no parameter whole")
        ok = False
    if "loss_scale" in fin:  # the grad scaler's unscaled copy of the gradients this rank updates
        want = (want[0], want[1] + (4 * p if z == 0 else 4 * p // n), want[2])
    if z in (3, "3p") and fin["peak_memory_bytes"]["parameters"] <= want[0]:
        print(f"FAIL: zero 3 never gathered a parameter bucket (peak {fin['peak_memory_bytes']})")
        ok = False
    if len(fin["rank_memory"]) != n:
        print(f"FAIL: zero {z}: rank_memory has {len(fin['rank_memory'])} ranks, not {n}")
        ok = False
    for r in fin["rank_memory"]:
        a = r["at_update_bytes"]
        got = (a["parameters"], a["gradients"], a["optimizer_state"])
        line = (f"zero {z} rank {r['rank']}: params/grads/optimizer {got} bytes, formula {want} "
                f"(psi {psi}, padding {fin['zero_padding_elements']}, whole {pp})")
        print(("" if got == want else "FAIL: ") + line)
        ok = ok and got == want
sys.exit(0 if ok else 1)
EOF
skipped=$(grep '"final"' "$dir/z3.jsonl" | grep -o '"skipped_steps":[0-9]*' | cut -d: -f2)
[[ $status == 0 ]] && echo "ZeRO -np $np: stages 1, 2 and 3 equal stage 0 (skipped steps: $skipped)"
exit $status
