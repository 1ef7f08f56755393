#!/usr/bin/env bash
# Broken shard sets are refused by name: a sharded checkpoint (2 ranks, --zero 2) with a shard
# missing, an extra shard, a truncated shard or a shard from another checkpoint must make
# `hetrain checkpoint info`, `consolidate` and `train --resume` fail with an error naming the
# file, and load nothing.
# Usage: zero_broken.sh HETRAIN
set -uo pipefail
. "$(dirname "$0")/lib.sh"
ht=$1
args=(--preset fashion-mlp --hidden 16 --batch-size 16 "${quiet[@]}")
logged good mpi 2 200 "$ht" train "${args[@]}" --steps 4 --save-every 2 --zero 2 --save "$dir/good"
"$ht" checkpoint info "$dir/good" > /dev/null || fail "the good checkpoint"
status=0
# check NAME FILE PATTERN: every reader fails naming FILE with PATTERN.
check() {
  local name=$1 file=$2 pattern=$3 d=$dir/$1
  for cmd in "checkpoint info $d" "checkpoint consolidate $d -o $dir/$name.out.d" \
             "train ${args[*]} --steps 6 --resume $d"; do
    # shellcheck disable=SC2086
    out=$("$ht" $cmd 2>&1) && { echo "FAIL: $name: '$cmd' succeeded"; status=1; continue; }
    if grep -qF "$file" <<< "$out" && grep -qE "$pattern" <<< "$out"; then
      echo "$name: '${cmd%% *} ${cmd#* }' refused: $(grep -m1 error <<< "$out")"
    else
      echo "FAIL: $name: '$cmd' did not name $file ($pattern): $out"
      status=1
    fi
  done
  [[ ! -e $dir/$name.out.d/checkpoint.json ]] || { echo "FAIL: $name: consolidate wrote"; status=1; }
}
cp -r "$dir/good" "$dir/missing" && rm "$dir/missing/shard-1.1.safetensors"
check missing "$dir/missing/shard-1.1.safetensors" "is missing"
cp -r "$dir/good" "$dir/extra" && cp "$dir/extra/shard-1.1.safetensors" "$dir/extra/shard-2.1.safetensors"
check extra "$dir/extra/shard-2.1.safetensors" "is an extra shard"
cp -r "$dir/good" "$dir/truncated" && truncate -s -64 "$dir/truncated/shard-0.1.safetensors"
check truncated "$dir/truncated/shard-0.1.safetensors" "safetensors|does not match"
cp -r "$dir/good" "$dir/foreign" && cp "$dir/good/step-2/shard-1.1.safetensors" "$dir/foreign/"
check foreign "$dir/foreign/shard-1.1.safetensors" "does not match"
[[ $status == 0 ]] && echo "broken shard sets refused by name"
exit $status
