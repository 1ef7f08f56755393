#!/usr/bin/env bash
# A corrupt performance-model file is set aside with a warning and recalibrated by the next
# training run; `perfmodel show` then lists the measured primitives.
set -euo pipefail
HT=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export XDG_CACHE_HOME="$tmp/cache"
mkdir -p "$XDG_CACHE_HOME/hetrain"
f="$XDG_CACHE_HOME/hetrain/perfmodel.json"
echo '{"format": "hetrain-perfmodel", "models": [' > "$f"
out=$("$HT" perfmodel show 2>&1)
grep -q "set aside as $f.bad and recalibrated: it is not valid JSON" <<<"$out" || {
  echo "no set-aside warning: $out"; exit 1; }
[ -f "$f.bad" ] || { echo "corrupt file not kept as $f.bad"; exit 1; }
# A short run on synthetic-size data calibrates again.
data="$tmp/corpus.txt"
for i in $(seq 1 400); do echo "the quick brown fox jumps over the lazy dog $i"; done > "$data"
"$HT" train --preset gpt-mini --data "$data" --layers 1 --width 32 --heads 2 --context 16 \
  --batch-size 4 --steps 8 --threads 2 --eval-batches 1 --no-progress > /dev/null 2>&1
out=$("$HT" perfmodel show)
grep -Eq "^matmul +cpu:2t +f32" <<<"$out" || { echo "matmul not calibrated: $out"; exit 1; }
# --sort time: the kernel-time column never grows down the table, and the footer's device
# totals add up to the column's sum.
out=$("$HT" perfmodel show --sort time)
python3 - "$out" <<'PY' || { echo "bad --sort time table: $out"; exit 1; }
import re, sys
lines = sys.argv[1].splitlines()
head = next(i for i, l in enumerate(lines) if l.startswith("primitive"))
secs = [float(l.split()[6]) for l in lines[head + 1:] if not l.startswith("kernel time")]
assert len(secs) > 3 and secs == sorted(secs, reverse=True), secs
foot = next(l for l in lines if l.startswith("kernel time recorded, by device:"))
total = sum(float(x) for x in re.findall(r" ([0-9.]+) s;", foot))
assert abs(total - sum(secs)) < 1e-3 * len(secs), (total, sum(secs))
PY
out=$("$HT" perfmodel show --sort fastest 2>&1 || true)
grep -q "sort must be name or time, got 'fastest'" <<<"$out" || {
  echo "bad --sort value accepted: $out"; exit 1; }
js=$("$HT" perfmodel show --json)
grep -q '"format": "hetrain-perfmodel"' <<<"$js" || { echo "bad --json output"; exit 1; }
echo "perfmodel corrupt file: set aside and recalibrated"
