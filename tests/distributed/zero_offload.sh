#!/usr/bin/env bash
# ZeRO with a sim state device under `mpirun -np 2` (each rank has its own sim:0): the model
# states live where --state-device and --offload say, the bits are stage 0's, and a capacity
# between two measured device peaks fits only the offloaded run.
#   --zero 0|1|2 --offload optimizer: no optimizer state on sim:0, all of it on the host;
#   --zero 3 (no offload): parameter shards, gradient buffers and optimizer state on sim:0, no
#     parameters or optimizer state on the host;
#   --zero 3 --offload optimizer+params: the optimizer state and the parameter shards on the host,
#     only the gathered buckets' parameters on sim:0 (fewer bytes than shard + buckets, and than
#     the whole model);
#   sim:0:mem=<between the two stage-3 peaks>: without offload an out-of-memory error naming
#     sim:0, the request and the bytes by tag; with optimizer+params the run completes.
# Every run's consolidated checkpoint and logged losses equal --zero 0's on the host.
# Usage: zero_offload.sh HETRAIN
set -uo pipefail
. "$(dirname "$0")/lib.sh"
ht=$1
common=(train --preset gpt-mini --layers 2 --width 64 --heads 2 --context 16 --batch-size 8
        --steps 6 --eval-batches 1 --clip 0.5 --bucket-mb 0.05 "${quiet[@]}" --log-every 2)
sim=(--state-device sim:0)
run() {  # run NAME DEVICES ARGS...: true when the run completed
  local name=$1 devices=$2
  shift 2
  mpi 2 200 "$ht" "${common[@]}" --devices "$devices" "$@" \
    --save "$dir/$name" --json-log "$dir/$name.jsonl" > "$dir/$name.out" 2>&1
}
run z0 cpu --zero 0 || { cat "$dir/z0.out"; fail "zero 0 failed"; }
# Stage 0 over 2 ranks (the sharded optimizer's data-parallel layout): its parameters are views
# of flat buffers on sim:0, updated in place (before, offload copied them out of the buffers and
# the updates were lost).
run o0 cpu,sim:0 --zero 0 "${sim[@]}" --offload optimizer || { cat "$dir/o0.out"; fail "o0"; }
run o1 cpu,sim:0 --zero 1 "${sim[@]}" --offload optimizer || { cat "$dir/o1.out"; fail "o1"; }
run o2 cpu,sim:0 --zero 2 "${sim[@]}" --offload optimizer || { cat "$dir/o2.out"; fail "o2"; }
run s3 cpu,sim:0 --zero 3 "${sim[@]}" || { cat "$dir/s3.out"; fail "zero 3 on sim:0 failed"; }
run p3 cpu,sim:0 --zero 3 "${sim[@]}" --offload optimizer+params \
  || { cat "$dir/p3.out"; fail "zero 3 with optimizer+params failed"; }
cap=$(python3 - "$dir" <<'EOF'
import json, sys
d = sys.argv[1]
fin = {n: [json.loads(l) for l in open(f"{d}/{n}.jsonl") if '"final"' in l][0]
       for n in ("o0", "o1", "o2", "s3", "p3")}
sim = {n: f["device_memory_by_tag"]["sim:0"] for n, f in fin.items()}
host = {n: f["peak_memory_bytes"] for n, f in fin.items()}
for n in ("o0", "o1", "o2", "p3"):
    assert sim[n]["optimizer_state"] == 0 and host[n]["optimizer_state"] > 0, (n, sim[n], host[n])
    assert sim[n]["parameters"] > 0 and sim[n]["gradients"] > 0, (n, sim[n])
# (Backward's gradients are made wherever the scheduler runs backward's nodes, the host too.)
for t in ("optimizer_state", "parameters"):
    assert sim["s3"][t] > 0 and host["s3"][t] == 0, (t, sim["s3"], host["s3"])
assert sim["s3"]["gradients"] > 0, sim["s3"]
assert host["p3"]["parameters"] > 0, host["p3"]
assert sim["p3"]["parameters"] < sim["s3"]["parameters"], (sim["p3"], sim["s3"])
# The gathered working set on sim:0 is a few buckets, not the whole model (4P: twice a rank's
# shard at the update, 4P/2): the device runs its nodes in plan order, not every gather at once.
whole = 2 * fin["p3"]["rank_memory"][0]["at_update_bytes"]["parameters"]
assert sim["p3"]["parameters"] < whole, ("gathered working set", sim["p3"], whole)
assert fin["p3"]["offload"] == "optimizer+params" and fin["p3"]["zero"] == 3, fin["p3"]
a, b = fin["p3"]["device_peak_memory_bytes"]["sim:0"], fin["s3"]["device_peak_memory_bytes"]["sim:0"]
assert a < b, (a, b)
for n in ("s3", "p3"):
    print(f"zero 3 {n}: sim:0 by tag {sim[n]}, host by tag {host[n]}", file=sys.stderr)
print((a + b) // 2)
EOF
) || fail "memory by tag: $cap"
run small cpu,sim:0:mem=$cap --zero 3 "${sim[@]}" && fail "$cap bytes of sim:0 were enough without offload"
grep -Eq "out of memory on sim:0: .*while .* is live of its .* capacity .*; live by tag: .*parameters" \
  "$dir/small.out" || { cat "$dir/small.out"; fail "no out-of-memory error naming sim:0"; }
run fits cpu,sim:0:mem=$cap --zero 3 "${sim[@]}" --offload optimizer+params \
  || { cat "$dir/fits.out"; fail "optimizer+params did not fit $cap bytes of sim:0"; }
# Without clipping nothing needs every gradient before an update: under offload each bucket's
# update runs on the host as soon as backward has reduced it (the step records count those done
# before the step's end), and the bits are still zero 0's.
run z0n cpu --zero 0 --clip 0 || { cat "$dir/z0n.out"; fail "zero 0 without clipping failed"; }
for z in 1 2; do
  run "n$z" cpu,sim:0 --zero $z "${sim[@]}" --offload optimizer --clip 0 \
    || { cat "$dir/n$z.out"; fail "n$z"; }
  python3 - "$dir/n$z.jsonl" <<'EOF' || fail "n$z: no buckets_streamed in the step records"
import json, sys
steps = [json.loads(l) for l in open(sys.argv[1]) if '"final"' not in l]
assert steps and all(r["buckets_streamed"] >= 0 for r in steps), steps
print(f"streamed buckets: {sum(r['buckets_streamed'] for r in steps)}", file=sys.stderr)
EOF
done
status=0
matches() {  # matches REF NAME...: each run's consolidated checkpoint and losses equal REF's
  local ref=$1 name
  shift
  for name in "$@"; do
    "$ht" checkpoint consolidate "$dir/$name" -o "$dir/$name.c" > /dev/null || fail "consolidate $name"
    echo "$name (consolidated) against $ref:"
    same_files "$dir/$ref" "$dir/$name.c" "from $ref's" model.1.safetensors \
      train_state.1.safetensors || status=1
    same_losses "$dir/$ref.jsonl" "$dir/$name.jsonl" "($name, $ref)" || status=1
  done
}
matches z0 o0 o1 o2 s3 p3 fits
matches z0n n1 n2
[[ $status == 0 ]] && echo "zero offload -np 2: stages 0-2 with optimizer offload (1-2 also" \
  "streamed) and stage 3 with optimizer+params on sim:0 equal zero 0; $cap bytes of sim:0 fit" \
  "only the offloaded run"
exit $status
