#!/usr/bin/env bash
# --memory-budget: a bad size is refused naming the flag; a budget too small for the run stops
# it with the out-of-memory error (device, request, live bytes by tag, largest tensors); the
# JSON log reports live and reserved bytes (fragmentation) and respects a budget that fits.
# Usage: memory_budget.sh HETRAIN
set -uo pipefail
bin=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export XDG_CACHE_HOME="$tmp/cache"
die() { echo "FAIL: $*"; exit 1; }
gpt=(train --preset gpt-mini --layers 1 --width 32 --heads 2 --context 16 --batch-size 8
     --eval-batches 2 --threads 1 --no-progress --no-record)

out=$("$bin" "${gpt[@]}" --steps 1 --memory-budget 12XB 2>&1) && die "a bad size was accepted"
grep -q "flag --memory-budget: expected a size in bytes such as 2GiB, 512MiB or 1048576" <<<"$out" \
  || die "bad size message: $out"

out=$("$bin" "${gpt[@]}" --steps 2 --memory-budget 256KiB 2>&1) && die "256 KiB was enough?"
grep -Eq "out of memory on cpu: .*for [a-z_]+ while .* is live of its 256.0 KiB capacity \(--memory-budget 256.0 KiB\); live by tag: parameters .*largest tensors alive: [0-9.]+ [KM]iB" <<<"$out" \
  || die "out-of-memory message: $out"

"$bin" "${gpt[@]}" --steps 4 --log-every 2 --json-log "$tmp/log.jsonl" > /dev/null 2>&1 \
  || die "the unlimited run failed"
python3 - "$tmp/log.jsonl" <<'PY' || die "memory records"
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
assert len(recs) == 3, recs
for r in recs:
    m = r["memory"]
    assert m["reserved_bytes"] >= m["live_bytes"] > 0, m
    assert m["peak_reserved_bytes"] >= m["peak_live_bytes"] > 0, m
    assert abs(m["fragmentation"] - (1 - m["live_bytes"] / m["reserved_bytes"])) < 1e-12, m
fin = recs[-1]
assert fin["memory"]["peak_live_bytes"] == fin["peak_memory_bytes"]["total"], fin
print(fin["memory"]["peak_live_bytes"])
PY
peak=$(python3 -c "import json,sys; print(json.loads(open(sys.argv[1]).readlines()[-1])['memory']['peak_live_bytes'])" "$tmp/log.jsonl")
# A budget 10% above the measured peak runs the same steps (one thread: the same order of
# nodes, so the same peak; with more the order, hence the peak, varies from run to run).
budget=$((peak + peak / 10))
out=$("$bin" "${gpt[@]}" --steps 4 --memory-budget "$budget" 2>&1) \
  || die "a budget of $budget bytes (peak $peak) failed: $out"
echo "memory budget checks passed (peak $peak bytes)"
