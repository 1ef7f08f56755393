#!/usr/bin/env bash
# 40 steps straight vs resuming the same run from its step-20 checkpoint: the final train_loss strings
# (9 significant digits) must be identical. Usage: resume_identical.sh HETRAIN PRESET ARGS...
set -euo pipefail
bin=$1; preset=$2; shift 2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# Runs record their step time in $XDG_CACHE_HOME/hetrain/measured_runs.json: keep the user's
# cache clean, and check the records.
export XDG_CACHE_HOME="$tmp/cache"
common=(--preset "$preset" --no-progress --log-every 10 "$@")
# One run of 40 steps that checkpoints at step 20 (as a run that was interrupted would have).
"$bin" train "${common[@]}" --steps 40 --save "$tmp/ckpt" --save-every 20 \
  --json-log "$tmp/full.jsonl" > "$tmp/full.out"
"$bin" train "${common[@]}" --steps 40 --resume "$tmp/ckpt/step-20" \
  --json-log "$tmp/resumed.jsonl" > "$tmp/resumed.out"
full=$(grep '"final"' "$tmp/full.jsonl" | sed -E 's/.*"train_loss":([^,}]*).*/\1/')
resumed=$(grep '"final"' "$tmp/resumed.jsonl" | sed -E 's/.*"train_loss":([^,}]*).*/\1/')
echo "straight: $full  resumed: $resumed"
[ -n "$full" ] && [ "$full" = "$resumed" ]
# Under fp16 the loss scaler's state is part of the checkpoint: scale and skipped steps agree.
scaler() { grep '"final"' "$1" | grep -o '"\(loss_scale\|skipped_steps\)":[^,}]*' | tr '\n' ' '; }
echo "straight: $(scaler "$tmp/full.jsonl")  resumed: $(scaler "$tmp/resumed.jsonl")"
[ "$(scaler "$tmp/full.jsonl")" = "$(scaler "$tmp/resumed.jsonl")" ]
# The same seed gives the same result, bit for bit.
"$bin" train "${common[@]}" --steps 40 --json-log "$tmp/again.jsonl" > /dev/null
again=$(grep '"final"' "$tmp/again.jsonl" | sed -E 's/.*"train_loss":([^,}]*).*/\1/')
[ "$full" = "$again" ]
echo "resume and rerun identical"
if [ "$preset" = gpt-mini ]; then
  n=$(grep -c '"step_time_s"' "$tmp/cache/hetrain/measured_runs.json")
  [ "$n" = 3 ] || { echo "expected 3 measured-run records, found $n"; exit 1; }
  echo "3 measured runs recorded"
fi
