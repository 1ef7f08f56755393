#!/usr/bin/env bash
# Resuming from a checkpoint of a different model fails, lists each mismatched tensor with
# both shapes, and leaves the checkpoint untouched. Usage: wrong_checkpoint.sh HETRAIN
set -uo pipefail
bin=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export XDG_CACHE_HOME="$tmp/cache"  # keep the user's measured-runs file out of it
"$bin" train --preset fashion-mlp --hidden 32 --steps 3 --batch-size 16 --no-progress \
  --save "$tmp/ckpt" > /dev/null 2>&1 || { echo "setup run failed"; exit 1; }
weights=$(echo "$tmp"/ckpt/model.*.safetensors)  # the weights file the index names
[ -f "$weights" ] || { echo "no weights file: $weights"; exit 1; }
before=$(sha256sum "$weights")
out=$("$bin" train --preset fashion-mlp --hidden 16 --steps 6 --batch-size 16 --no-progress \
  --resume "$tmp/ckpt" 2>&1)
rc=$?
echo "$out"
[ $rc -ne 0 ] || { echo "expected a failure"; exit 1; }
grep -q "shape mismatch: 1.weight checkpoint (32, 784) vs model (16, 784)" <<<"$out" || exit 1
grep -q "shape mismatch: 3.weight checkpoint (10, 32) vs model (10, 16)" <<<"$out" || exit 1
[ "$before" = "$(sha256sum "$weights")" ] || { echo "checkpoint changed"; exit 1; }
# A checkpoint trained in another precision is refused, naming both.
out=$("$bin" train --preset fashion-mlp --hidden 32 --steps 6 --batch-size 16 --no-progress \
  --precision bf16 --resume "$tmp/ckpt" 2>&1)
echo "$out"
grep -q "was trained with --precision fp32 but this run uses --precision bf16" <<<"$out" || exit 1
# So is one whose loss-scaler state does not match this run's scaler.
out=$("$bin" train --preset fashion-mlp --hidden 32 --steps 6 --batch-size 16 --no-progress \
  --grad-scaler on --resume "$tmp/ckpt" 2>&1)
echo "$out"
grep -q "holds no loss-scaler state but this run trains with a grad scaler" <<<"$out" || exit 1
# A truncated weights file is refused with the file named.
truncate -s 100 "$weights"
out=$("$bin" train --preset fashion-mlp --hidden 32 --steps 6 --batch-size 16 --no-progress \
  --resume "$tmp/ckpt" 2>&1)
echo "$out"
grep -q "$(basename "$weights")" <<<"$out" || exit 1
echo "wrong and corrupt checkpoints refused"
