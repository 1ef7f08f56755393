#!/usr/bin/env bash
# --offload optimizer from the command line: a CPU-only run is refused saying why, and so are
# optimizer+params below --zero 3, ZeRO on a GPU state device and ZeRO offload without a named
# state device (tests/distributed/zero_offload.sh runs ZeRO offload under mpirun); on sim:0 with
# a capacity between the two runs' measured device peaks the run without offload is out of
# memory on sim:0 and the run with it trains, with the unlimited run's losses, no optimizer
# state on sim:0 and the optimizer state on the host (the JSON log's memory by tag).
# Usage: offload.sh HETRAIN
set -uo pipefail
bin=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export XDG_CACHE_HOME="$tmp/cache"
die() { echo "FAIL: $*"; exit 1; }
gpt=(train --preset gpt-mini --layers 1 --width 64 --heads 2 --context 16 --batch-size 4
     --steps 3 --eval-batches 1 --threads 1 --no-progress --no-record --state-device sim:0)

out=$("$bin" train --preset gpt-mini --steps 1 --offload optimizer 2>&1) && die "CPU-only offload ran"
grep -q "already live on the host" <<<"$out" || die "CPU-only message: $out"
out=$("$bin" "${gpt[@]}" --devices cpu,sim:0 --offload optimizer+params 2>&1) \
  && die "optimizer+params ran under --zero 0"
grep -q "offload optimizer+params keeps ZeRO stage 3's parameter shards on the host, but this run has --zero 0" <<<"$out" \
  || die "optimizer+params message: $out"
out=$("$bin" "${gpt[@]}" --devices cuda:0,cpu --zero 3 --state-device cuda:0 2>&1) && die "zero on cuda ran"
grep -Eq "state-device cuda:0 under --zero 3: .*NCCL|cuda:0.*(no CUDA|not found|no device)" <<<"$out" \
  || die "zero on a GPU message: $out"
out=$("$bin" "${gpt[@]}" --devices cpu,sim:0 --zero 3 --state-device auto --offload optimizer+params 2>&1) \
  && die "zero 3 offload without a state device ran"
grep -q "already live on the host (state-device auto, which under --zero is the host unless named" <<<"$out" \
  || die "zero offload without a state device message: $out"

for o in none optimizer; do
  "$bin" "${gpt[@]}" --devices cpu,sim:0 --offload $o --json-log "$tmp/$o.jsonl" > /dev/null 2>&1 \
    || die "the unlimited run with --offload $o failed"
done
cap=$(python3 - "$tmp/none.jsonl" "$tmp/optimizer.jsonl" <<'PY'
import json, sys
ref, off = (json.loads(open(p).readlines()[-1]) for p in sys.argv[1:])
assert ref["train_loss"] == off["train_loss"], (ref["train_loss"], off["train_loss"])
rt, ot = ref["device_memory_by_tag"]["sim:0"], off["device_memory_by_tag"]["sim:0"]
assert rt["optimizer_state"] > 0 and ot["optimizer_state"] == 0, (rt, ot)
assert off["peak_memory_bytes"]["optimizer_state"] > 0 and off["offload"] == "optimizer", off
a, b = off["device_peak_memory_bytes"]["sim:0"], ref["device_peak_memory_bytes"]["sim:0"]
assert a < b, (a, b)
print((a + b) // 2)
PY
) || die "memory by tag: $cap"

out=$("$bin" "${gpt[@]}" --devices "cpu,sim:0:mem=$cap" 2>&1) && die "$cap bytes were enough"
grep -Eq "out of memory on sim:0: .*while .* is live of its .* capacity .*; live by tag: parameters .*optimizer_state" <<<"$out" \
  || die "out-of-memory message: $out"
"$bin" "${gpt[@]}" --devices "cpu,sim:0:mem=$cap" --offload optimizer \
  --json-log "$tmp/fits.jsonl" > /dev/null 2>&1 || die "offload did not fit $cap bytes"
python3 - "$tmp/none.jsonl" "$tmp/fits.jsonl" <<'PY' || die "the offloaded run differs"
import json, sys
ref, fits = ([json.loads(l) for l in open(p)] for p in sys.argv[1:])
assert [r.get("train_loss") for r in ref] == [r.get("train_loss") for r in fits], (ref, fits)
PY
echo "offload: OK (capacity $cap bytes)"
