#!/usr/bin/env bash
# --recompute auto under --memory-budget: gpt-mini (the preset's shapes) trains within a budget of
# half its --recompute none peak (predicted by --dry-run), its allocator capacity enforcing it; a
# budget below every plan's peak is refused before training, naming the smallest feasible one.
# One thread: the executor's order, hence the peak, is the model's. Usage: recompute_budget.sh HETRAIN
set -uo pipefail
bin=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export XDG_CACHE_HOME="$tmp/cache"
die() { echo "FAIL: $*"; exit 1; }
gpt=(train --preset gpt-mini --threads 1 --no-progress --no-record)

out=$("$bin" "${gpt[@]}" --recompute sometimes 2>&1) && die "a bad mode was accepted"
grep -q "flag --recompute: recompute must be none, selective, full or auto, got 'sometimes'" <<<"$out" \
  || die "bad mode message: $out"

"$bin" "${gpt[@]}" --dry-run --recompute none > "$tmp/none.txt" || die "dry run failed"
grep -Eq "^activations +[0-9.]+ [KMG]?i?B +[0-9.]+ MiB" "$tmp/none.txt" || die "no activations row: $(cat "$tmp/none.txt")"
none=$(sed -nE 's/.*peak total ([0-9]+) bytes.*/\1/p' "$tmp/none.txt")
[ -n "$none" ] || die "no predicted peak: $(cat "$tmp/none.txt")"
budget=$((none / 2))

"$bin" "${gpt[@]}" --steps 3 --eval-batches 1 --recompute auto --memory-budget "$budget" --json \
  > "$tmp/auto.json" 2> "$tmp/auto.err" || die "auto in $budget bytes failed: $(tail -3 "$tmp/auto.err")"
grep -q "recompute auto (budget .*): .* replayed in .* segment(s)" "$tmp/auto.err" \
  || die "the choice was not printed: $(cat "$tmp/auto.err")"
peak=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['peak_memory_bytes']['total'])" "$tmp/auto.json")
[ "$peak" -le "$budget" ] || die "peak $peak above the budget $budget"

out=$("$bin" "${gpt[@]}" --steps 3 --recompute auto --memory-budget 20MiB 2>&1) && die "20 MiB accepted"
grep -Eq "\[recompute\] --memory-budget 20.0 MiB \(20971520 bytes\) is below the peak of every plan: the smallest feasible budget is [0-9.]+ MiB \([0-9]+ bytes\)" <<<"$out" \
  || die "impossible budget message: $out"
grep -q "^step" <<<"$out" && die "training started before the refusal"
echo "none peak $none bytes; auto within $budget bytes peaked at $peak"
