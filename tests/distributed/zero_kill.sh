#!/usr/bin/env bash
# A rank killed (SIGKILL, HETRAIN_FAULT_INJECT=RANK:STEP:kill@POINT) while a sharded checkpoint
# is written leaves the previous checkpoint loadable and the new one complete or rejected:
#   1. rank 1 killed once its shard of step 20 is written, saving over a step-10 checkpoint:
#      the directory still holds step 10 (info, consolidate, resume all work);
#   2. rank 0 killed once the index of step 20 is committed, before the old files are removed:
#      the directory holds the complete step-20 checkpoint;
#   3. rank 1 killed writing step-10 of --save-every 5: step-10 has no index and is rejected,
#      --resume takes step-5.
# Every resumed run ends byte-identical (consolidated) to the uninterrupted run (a constant
# learning rate, so that a run of 10 steps continues as the first half of a run of 20).
# Usage: zero_kill.sh HETRAIN
set -uo pipefail
. "$(dirname "$0")/lib.sh"
ht=$1
args=(train --preset fashion-mlp --hidden 16 --batch-size 16 "${quiet[@]}" --zero 2
      --schedule constant)
train() {  # train NAME NP ARGS...: must succeed
  local name=$1 np=$2
  shift 2
  logged "$name" mpi "$np" 200 -x HETRAIN_FAULT_INJECT -- "$ht" "${args[@]}" "$@"
}
killed() {  # killed NAME FAULT ARGS...: must fail with the fault injected
  local name=$1
  export HETRAIN_FAULT_INJECT=$2
  shift 2
  mpi 2 200 -x HETRAIN_FAULT_INJECT -- "$ht" "${args[@]}" "$@" \
    > "$dir/$name.out" 2>&1 && fail "$name: the run with $HETRAIN_FAULT_INJECT succeeded"
  grep -q "\[fault\] rank .*: injected kill" "$dir/$name.out" || { cat "$dir/$name.out"; fail "$name: no fault"; }
  export HETRAIN_FAULT_INJECT=
}
step_of() { "$ht" checkpoint info "$1" | sed -n 's/^checkpoint .*: step \([0-9]*\),.*/\1/p'; }
export HETRAIN_FAULT_INJECT=
train ref 2 --steps 20 --save "$dir/ref"
"$ht" checkpoint consolidate "$dir/ref" -o "$dir/ref.c" > /dev/null || fail "consolidate ref"
ends_as_ref() {  # ends_as_ref NAME RESUME_DIR: resumed on 1 process, the reference's files
  train "$1" 1 --steps 20 --grad-accum 2 --zero 0 --resume "$2" --save "$dir/$1.d"
  same_files "$dir/ref.c" "$dir/$1.d" "from the uninterrupted run" model.1.safetensors \
    train_state.1.safetensors || fail "$1"
  echo "$1: $(grep -o 'resumed from [^ ]* at step [0-9]*' "$dir/$1.out"), ended identical"
}
# 1. The previous checkpoint survives a kill before the commit.
train a 2 --steps 10 --save "$dir/a"
killed a-kill 1:20:kill@shard --steps 20 --resume "$dir/a" --save "$dir/a"
grep -q "shard-1.2.safetensors" <<<"$(ls "$dir/a")" || fail "1: the killed save wrote no shard"
[[ $(step_of "$dir/a") == 10 ]] || fail "1: the directory is not at step 10 after the kill"
echo "1: rank 1 killed after writing its shard of step 20: the checkpoint is still step 10"
ends_as_ref one "$dir/a"
# 2. A kill after the commit: the new checkpoint is complete.
train b 2 --steps 10 --save "$dir/b"
killed b-kill 0:20:kill@commit --steps 20 --resume "$dir/b" --save "$dir/b"
[[ $(step_of "$dir/b") == 20 ]] || fail "2: the directory is not at step 20 after the commit"
"$ht" checkpoint consolidate "$dir/b" -o "$dir/b.c" > /dev/null || fail "2: consolidate"
same_files "$dir/ref.c" "$dir/b.c" "from the uninterrupted run" model.1.safetensors \
  train_state.1.safetensors || fail "2: the checkpoint of step 20"
echo "2: rank 0 killed after committing step 20: the checkpoint is step 20, identical to the run's"
# 3. --save-every: the killed step-10 directory is rejected, --resume takes step-5.
killed c-kill 1:10:kill@shard --steps 20 --save-every 5 --save "$dir/c"
"$ht" checkpoint info "$dir/c/step-10" > "$dir/c10.out" 2>&1 && fail "3: step-10 accepted"
grep -q "holds no checkpoint" "$dir/c10.out" || { cat "$dir/c10.out"; fail "3: step-10 message"; }
[[ $(step_of "$dir/c/step-5") == 5 ]] || fail "3: step-5 is not loadable"
echo "3: rank 1 killed writing step 10: step-10 rejected ($(cat "$dir/c10.out")), step-5 loadable"
ends_as_ref three "$dir/c"
grep -q "resumed from $dir/c/step-5 at step 5" "$dir/three.out" || fail "3: did not resume from step-5"
echo "killed while writing a sharded checkpoint: previous checkpoint kept, new one complete or rejected"
