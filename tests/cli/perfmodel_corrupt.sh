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
js=$("$HT" perfmodel show --json)
grep -q '"format": "hetrain-perfmodel"' <<<"$js" || { echo "bad --json output"; exit 1; }
echo "perfmodel corrupt file: set aside and recalibrated"
