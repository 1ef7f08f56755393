#!/usr/bin/env bash
# A checkpoint changes from one complete state to the next: a full disk or a kill while the
# second file is written leaves the previous checkpoint whole (and resumable to the same result),
# a weights file copied in from another checkpoint is refused, and a save leaves no stale files.
# Usage: checkpoint_atomic.sh HETRAIN
set -uo pipefail
bin=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export XDG_CACHE_HOME="$tmp/cache"
run=(train --preset fashion-mlp --hidden 32 --batch-size 16 --no-progress --no-record --threads 2)
die() { echo "FAIL: $*"; exit 1; }
loss() { sed -nE 's/.*"train_loss": ([^,}]*).*/\1/p' "$1"; }

"$bin" "${run[@]}" --steps 4 --save "$tmp/d" > /dev/null 2>&1 || die "setup run failed"
ls "$tmp/d"
[ "$(ls -A "$tmp/d" | wc -l)" = 3 ] || die "expected checkpoint.json and two parts"
# The reference: step 4 -> 8 from the intact checkpoint.
"$bin" "${run[@]}" --steps 8 --resume "$tmp/d" --json > "$tmp/ref.json" 2>/dev/null ||
  die "reference resume failed"
ref=$(loss "$tmp/ref.json")
[ -n "$ref" ] || die "no train_loss in the reference"

# The weights (~100 KB) fit under a 150 KB file-size limit, the training state (~200 KB) does
# not: the save fails between the two files, once as a full disk (EFBIG, the signal ignored),
# once as a crash (SIGXFSZ kills the process).
for mode in full-disk killed; do
  cp -a "$tmp/d" "$tmp/$mode"
  (
    [ "$mode" = full-disk ] && trap '' XFSZ
    ulimit -f 150
    exec "$bin" "${run[@]}" --steps 8 --resume "$tmp/$mode" --save "$tmp/$mode"
  ) > "$tmp/$mode.out" 2>&1
  rc=$?
  cat "$tmp/$mode.out"
  [ $rc -ne 0 ] || die "$mode: the save under a 150 KB limit succeeded"
  [ "$mode" = killed ] && { [ $rc -gt 128 ] || die "$mode: not killed by a signal (rc $rc)"; }
  "$bin" "${run[@]}" --steps 8 --resume "$tmp/$mode" --json > "$tmp/$mode.json" 2> "$tmp/$mode.err" ||
    { cat "$tmp/$mode.err"; die "$mode: the previous checkpoint no longer resumes"; }
  [ "$(loss "$tmp/$mode.json")" = "$ref" ] || die "$mode: resumed to $(loss "$tmp/$mode.json"), not $ref"
  echo "$mode: the step-4 checkpoint survived and resumed to $ref"
done

# A complete save to the same directory replaces the checkpoint and removes the old generation.
"$bin" "${run[@]}" --steps 8 --resume "$tmp/d" --save "$tmp/d" > /dev/null 2>&1 || die "resave failed"
ls "$tmp/d"
[ "$(ls -A "$tmp/d" | wc -l)" = 3 ] || die "stale files after the second save"
grep -q '"step": 8' "$tmp/d/checkpoint.json" || die "the index is not at step 8"

# Equal steps, other weights: a weights file copied in from another checkpoint is refused.
"$bin" "${run[@]}" --steps 8 --seed 7 --save "$tmp/other" > /dev/null 2>&1 || die "other run failed"
cp "$tmp"/other/model.*.safetensors "$(echo "$tmp"/d/model.*.safetensors)"
out=$("$bin" "${run[@]}" --steps 12 --resume "$tmp/d" 2>&1) && die "a mismatched pair was resumed"
echo "$out"
grep -q "does not match .*checkpoint.json.*not the file this checkpoint was written with" <<<"$out" ||
  die "the mismatch is not explained"
echo "checkpoints are atomic and checked"
