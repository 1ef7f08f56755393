#!/usr/bin/env bash
# Resharding checkpoints: a sharded checkpoint saved at step 10 on 4 ranks under --zero S
# (S = 1, 2, 3; each rank writes its shard) must
#   - consolidate into files byte-identical to the plain checkpoint --zero 0 writes at step 10;
#   - load on 2 ranks under the next stage (1 -> 2 -> 3 -> 1) with other bucket sizes, and on 1 process (tensors
#     bitwise equal once saved again and consolidated);
#   - resume on 1 process with --grad-accum 4 (the same global data order and RNG) and end
#     byte-identical to the uninterrupted 4-rank run.
# Usage: zero_reshard.sh HETRAIN ARGS...   (ARGS: the model, --steps 20)
set -euo pipefail
. "$(dirname "$0")/lib.sh"
ht=$1
shift
common=(train "${quiet[@]}" --log-every 5 "$@")
run() {  # run NP NAME ARGS...
  local np=$1 name=$2
  shift 2
  logged "$name" mpi "$np" 200 "$ht" "${common[@]}" "$@" --save "$dir/$name"
}
same() {  # same A B LABEL: the tensors of model and train_state, bit for bit
  for part in model train_state; do
    python3 "$here/tensors_equal.py" "$1/$part.1.safetensors" "$2/$part.1.safetensors" "$3 $part" \
      || exit 1
  done
}
consolidate() {
  "$ht" checkpoint consolidate "$1" -o "$2" > /dev/null || fail "consolidate $1"
}
run 4 z0 --zero 0 --save-every 10
# Each stage's checkpoint loads under the next stage (1 -> 2 -> 3 -> 1): to and from stage 3.
for s in 1 2 3; do
  other=$((s % 3 + 1))
  run 4 "z$s" --zero "$s" --save-every 10
  info=$("$ht" checkpoint info "$dir/z$s/step-10")
  grep -q "sharded: 4 shard(s) written by 4 rank(s) under ZeRO stage $s" <<< "$info" \
    || fail "checkpoint info: $info"
  consolidate "$dir/z$s/step-10" "$dir/z$s.c10"
  same_files "$dir/z0/step-10" "$dir/z$s.c10" "from zero 0's" model.1.safetensors \
    train_state.1.safetensors checkpoint.json || fail "zero $s step 10 consolidated"
  echo "zero $s, 4 ranks, step 10: consolidated files identical to zero 0's plain checkpoint"
  # Loaded on 2 ranks under the other stage and other buckets (--bucket-mb 0.05: the shards cut
  # elsewhere), and on one process; saved again at step 10.
  run 2 "z$s.np2" --zero "$other" --resume "$dir/z$s/step-10" --steps 10 --bucket-mb 0.05
  consolidate "$dir/z$s.np2" "$dir/z$s.np2c"
  same "$dir/z0/step-10" "$dir/z$s.np2c" "saved on 4 ranks zero $s, loaded on 2 ranks zero $other:"
  run 1 "z$s.np1" --resume "$dir/z$s/step-10" --steps 10
  same "$dir/z0/step-10" "$dir/z$s.np1" "saved on 4 ranks zero $s, loaded on 1 process:"
  # Resumed to the end on one process with 4 micro-batches: the 4-rank run's result exactly.
  run 1 "z$s.end" --resume "$dir/z$s/step-10" --grad-accum 4
  same_files "$dir/z0" "$dir/z$s.end" "from the 4-rank run's" model.1.safetensors \
    train_state.1.safetensors || fail "zero $s resumed on 1 process"
  echo "zero $s: resumed on 1 process from step 10, step 20 identical to the 4-rank run"
done
echo "resharding checkpoints: saved on 4 ranks, loaded on 2 and 1, bitwise"
