#!/usr/bin/env bash
# Activation checkpointing changes memory, not results: every --recompute mode trains to the same
# per-step losses (the log's 17-digit values and the final 9-digit train_loss string) and writes
# byte-identical checkpoint files (weights, optimizer state, BatchNorm running statistics) as
# --recompute none. Usage: recompute_bitwise.sh HETRAIN PRESET STEPS ARGS...
set -uo pipefail
bin=$1; preset=$2; steps=$3; shift 3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export XDG_CACHE_HOME="$tmp/cache"
die() { echo "FAIL: $*"; exit 1; }
run() {  # mode
  "$bin" train --preset "$preset" --steps "$steps" --log-every 1 --no-progress --no-record \
    --recompute "$1" --save "$tmp/$1" --json-log "$tmp/$1.jsonl" "${extra[@]}" \
    > "$tmp/$1.out" 2> "$tmp/$1.err" || die "--recompute $1: $(tail -3 "$tmp/$1.err")"
}
extra=("$@")
losses() { grep -o '"loss":[^,}]*\|"train_loss":[^,}]*' "$1"; }
run none
[ "$(losses "$tmp/none.jsonl" | grep -c '"loss"')" = "$steps" ] || die "expected $steps loss records"
for mode in selective full auto; do
  run "$mode"
  diff <(losses "$tmp/none.jsonl") <(losses "$tmp/$mode.jsonl") > "$tmp/diff" \
    || die "--recompute $mode: losses differ from none: $(head -4 "$tmp/diff")"
  for f in $(cd "$tmp/none" && ls); do
    cmp -s "$tmp/none/$f" "$tmp/$mode/$f" || die "--recompute $mode: checkpoint file $f differs"
  done
  echo "--recompute $mode: $steps losses and $(ls "$tmp/none" | wc -l) checkpoint files identical"
done
