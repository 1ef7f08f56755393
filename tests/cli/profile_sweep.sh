#!/usr/bin/env bash
# hetrain profile --sweep-layers: per depth and recompute mode the activations peak predicted by
# the memory model and measured by the allocator (one thread: they agree within 5%), full below
# none at every depth and the gap growing with depth; the chart as a standalone SVG (--report
# FILE.svg) with a point per run. Bad lists name the flag, before any point runs.
# Usage: profile_sweep.sh HETRAIN
set -uo pipefail
bin=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export XDG_CACHE_HOME="$tmp/cache"
die() { echo "FAIL: $*"; exit 1; }
printf 'preset = "gpt-mini"\nwidth = 32\nheads = 2\ncontext = 16\nbatch-size = 4\ndropout = 0.1\n' \
  > "$tmp/deep.toml"
prof=(profile --config "$tmp/deep.toml" --steps 1 --warmup-steps 1 --threads 1 --no-progress)

out=$("$bin" "${prof[@]}" --sweep-layers 2,x --report "$tmp/d.svg" 2>&1) && die "2,x accepted"
grep -q "flag --sweep-layers: expected layer counts >= 1 separated by commas, such as 8,16,32, got '2,x'" \
  <<<"$out" || die "bad list message: $out"
out=$("$bin" "${prof[@]}" --sweep-layers 2 --sweep-recompute none,often --report "$tmp/d.svg" 2>&1) \
  && die "mode 'often' accepted"
grep -q "flag --sweep-recompute: .*often" <<<"$out" || die "bad mode message: $out"
# Checked before any point trains: 'none' comes first and must not have run.
grep -q "predicted (MiB)" <<<"$out" && die "the sweep ran points before rejecting 'often': $out"
out=$("$bin" profile --preset fashion-mlp --sweep-layers 2 --report "$tmp/d.svg" 2>&1) \
  && die "a sweep of an MLP accepted"
grep -q "\-\-sweep-layers applies to a GPT" <<<"$out" || die "MLP message: $out"

"$bin" "${prof[@]}" --sweep-layers 2,4,8 --sweep-recompute none,full --report "$tmp/d.svg" \
  > "$tmp/out.txt" 2> "$tmp/err.txt" || die "sweep failed: $(tail -3 "$tmp/err.txt")"
python3 - "$tmp/out.txt" "$tmp/d.svg" <<'PY' || exit 1
import re, sys
rows = {}
for line in open(sys.argv[1]):
    m = re.match(r"\s*(\d+)\s+(none|full)\s+([0-9.]+)\s+([0-9.]+)\s*$", line)
    if m:
        rows[(int(m[1]), m[2])] = (float(m[3]), float(m[4]))
assert len(rows) == 6, f"expected 6 rows, got {rows}"
for (layers, mode), (pred, meas) in rows.items():
    assert abs(pred - meas) <= 0.05 * meas + 0.01, f"{layers} {mode}: predicted {pred}, measured {meas}"
gaps = [rows[(l, "none")][1] - rows[(l, "full")][1] for l in (2, 4, 8)]
assert all(g > 0 for g in gaps) and gaps[0] < gaps[1] < gaps[2], f"none - full by depth: {gaps}"
svg = open(sys.argv[2]).read()
assert svg.startswith("<svg id=\"activation-depth\""), svg[:80]
assert svg.count("<circle") == 6, svg.count("<circle")
assert "--recompute none" in svg and "--recompute full" in svg
print("sweep rows", rows)
PY
