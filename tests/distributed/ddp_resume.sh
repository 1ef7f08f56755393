#!/usr/bin/env bash
# DDP resume: a 2N-step run on NP ranks saving every N steps is cut off after its step-N
# checkpoint (HETRAIN_FAULT_INJECT: rank 1 exits 3 steps later); resumed on NP ranks from that
# directory, it must end as the uninterrupted NP-rank run and as one process with
# --grad-accum NP: model.safetensors and train_state.safetensors byte-identical, and the losses
# logged after the resume point the same numbers.
# Usage: ddp_resume.sh HETRAIN NP N ARGS...   (ARGS: the model, without --steps)
set -uo pipefail
. "$(dirname "$0")/lib.sh"
ht=$1 np=$2 n=$3
shift 3
common=(train "${quiet[@]}" --log-every 5 --steps $((2 * n)) "$@")
export HETRAIN_FAULT_INJECT=
ddp() {  # ddp NAME ARGS...: NP ranks, must succeed
  local name=$1
  shift
  logged "$name" mpi "$np" 300 -x HETRAIN_FAULT_INJECT -- "$ht" "${common[@]}" "$@" \
    --json-log "$dir/$name.jsonl"
}
ddp ref --save "$dir/ref"
logged accum timeout -k 5 300 "$ht" "${common[@]}" --grad-accum "$np" --save "$dir/accum" \
  --json-log "$dir/accum.jsonl"
# The interrupted run: checkpoint at step N, then rank 1 exits during step N + 3.
export HETRAIN_FAULT_INJECT="1:$((n + 2)):exit"
mpi "$np" 300 -x HETRAIN_FAULT_INJECT -- "$ht" "${common[@]}" \
  --save-every "$n" --save "$dir/cut" > "$dir/cut.out" 2>&1 && fail "the interrupted run succeeded"
grep -q "\[fault\] rank 1: injected exit at step $((n + 3))" "$dir/cut.out" \
  || { cat "$dir/cut.out"; fail "no fault injected"; }
[[ -d "$dir/cut/step-$n" ]] || fail "the interrupted run left no step-$n checkpoint"
export HETRAIN_FAULT_INJECT=
ddp resumed --resume "$dir/cut" --save "$dir/resumed"
grep -q "resumed from $dir/cut/step-$n at step $n" "$dir/resumed.out" \
  || { cat "$dir/resumed.out"; fail "did not resume from step-$n"; }
for ref in ref accum; do
  same_files "$dir/$ref" "$dir/resumed" "between $ref's run and the resumed one" \
    model.1.safetensors train_state.1.safetensors || fail "the resumed run differs from $ref's"
done
echo "model and train_state after resuming at step $n: identical to the uninterrupted -np $np run" \
  "and to --grad-accum $np ($(stat -c %s "$dir/resumed/model.1.safetensors") bytes of model)"
# The losses of the intervals after the resume point.
# (The log's keys are sorted: "loss" comes before "step".)
losses_after() { sed -n 's/.*"loss":\([^,]*\),.*"step":\([0-9]*\),.*/\2 \1/p' "$1" | awk -v n="$n" '$1 > n'; }
[[ -n "$(losses_after "$dir/resumed.jsonl")" ]] || { cat "$dir/resumed.jsonl"; fail "no losses logged"; }
for ref in ref accum; do
  [[ "$(losses_after "$dir/$ref.jsonl")" == "$(losses_after "$dir/resumed.jsonl")" ]] \
    || { paste <(losses_after "$dir/$ref.jsonl") <(losses_after "$dir/resumed.jsonl"); fail "losses differ from $ref's"; }
done
echo "losses after the resume: $(losses_after "$dir/resumed.jsonl" | tr '\n' ' ')"
grep -q '"ranks_identical":true' "$dir/resumed.jsonl" || fail "the resumed ranks' parameters differ"
echo "DDP -np $np resumed at step $n equals the uninterrupted run"
