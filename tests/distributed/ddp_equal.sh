#!/usr/bin/env bash
# DDP against gradient accumulation: `mpirun -np NP hetrain train ARGS` must write model and
# training-state files byte-identical to one process with --grad-accum NP, every rank must end
# with rank 0's parameters, and the logged losses must be the same numbers.
# --bn-per-rank (models with BatchNorm): the running statistics are per rank (PyTorch DDP's
# default), so model.safetensors is compared without them (parameters bit for bit) and
# bn_per_rank.py checks that rank 0's statistics are its own micro-batches' (the training
# loss uses each micro-batch's own statistics, so losses, gradients and optimizer state stay
# equal).
# Usage: ddp_equal.sh HETRAIN NP [--bn-per-rank] ARGS...   (ARGS include --steps)
set -euo pipefail
. "$(dirname "$0")/lib.sh"
ht=$1 np=$2
shift 2
bn=0
if [[ ${1:-} == --bn-per-rank ]]; then bn=1; shift; fi
common=(train "${quiet[@]}" --log-every 5 "$@")
logged accum timeout -k 5 300 "$ht" "${common[@]}" --grad-accum "$np" --save "$dir/accum" \
  --json-log "$dir/accum.jsonl"
logged ddp mpi "$np" 300 "$ht" "${common[@]}" --save "$dir/ddp" --json-log "$dir/ddp.jsonl"
status=0
# A fresh --save directory holds generation 1 of each part and the index (checkpoint.h).
files=(model.1.safetensors train_state.1.safetensors checkpoint.json)
if [[ $bn == 1 ]]; then
  bn_stats=running_mean,running_var,num_batches_tracked
  python3 "$here/tensors_equal.py" --except "$bn_stats" "$dir/accum/model.1.safetensors" \
    "$dir/ddp/model.1.safetensors" "model parameters" || status=1
  steps=$(sed -n 's/.*--steps \([0-9]*\).*/\1/p' <<< " $* ")
  python3 "$here/bn_per_rank.py" "$dir/accum/model.1.safetensors" "$dir/ddp/model.1.safetensors" \
    "$np" "$steps" || status=1
  files=(train_state.1.safetensors)  # checkpoint.json holds the model file's crc32
fi
same_files "$dir/accum" "$dir/ddp" "between -np $np and --grad-accum $np" "${files[@]}" || status=1
grep -q '"ranks_identical":true' "$dir/ddp.jsonl" && grep -q "\"world_size\":$np" "$dir/ddp.jsonl" \
  || { echo "FAIL: ranks' parameters differ or world_size is not $np"; cat "$dir/ddp.jsonl"; status=1; }
# The losses logged at each interval: the same numbers.
same_losses "$dir/accum.jsonl" "$dir/ddp.jsonl" "between -np $np and --grad-accum $np" || status=1
# With several buckets, reductions start while backward runs (the executor's hook): every
# interval logs at least 2 buckets started before backward ended.
if [[ " $* " == *" --bucket-mb "* ]]; then
  if grep -qE '"buckets_overlapped":[01][,}]' <<<"$(grep '"step"' "$dir/ddp.jsonl")"; then
    echo "FAIL: fewer than 2 buckets overlapped with backward in an interval"; cat "$dir/ddp.jsonl"
    status=1
  else
    echo "overlap: $(grep -o '"buckets_overlapped":[0-9]*' "$dir/ddp.jsonl" | tr '\n' ' ')"
  fi
fi
# Only rank 0 prints the result.
[[ $(grep -c '^result:' "$dir/ddp.out") == 1 ]] || { echo "FAIL: result printed $(grep -c '^result:' "$dir/ddp.out") times"; status=1; }
[[ $status == 0 ]] && echo "DDP -np $np equals --grad-accum $np"
exit $status
