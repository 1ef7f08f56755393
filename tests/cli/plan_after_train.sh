#!/usr/bin/env bash
# A newcomer's first try (issue 27): `hetrain train` records a measured run on `local` in the
# cache directory ($XDG_CACHE_HOME/hetrain); with no device profile there (no `hetrain bench`
# yet), every `hetrain plan` on catalog hardware must still work, and say what is missing only
# when it is needed (--hardware local, --calibrate).
set -euo pipefail
HT=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export XDG_CACHE_HOME="$tmp/cache"
data="$tmp/corpus.txt"
for i in $(seq 1 400); do echo "the quick brown fox jumps over the lazy dog $i"; done > "$data"
"$HT" train --preset gpt-mini --data "$data" --layers 1 --width 32 --heads 2 --context 16 \
  --batch-size 4 --steps 8 --threads 2 --eval-batches 1 --no-progress > /dev/null 2>&1
runs="$XDG_CACHE_HOME/hetrain/measured_runs.json"
grep -q '"hardware": "local"' "$runs" || { echo "train recorded no run in $runs"; exit 1; }
[ ! -e "$XDG_CACHE_HOME/hetrain/device_profile.json" ] || { echo "unexpected device profile"; exit 1; }

# A fixed plan on catalog hardware (every strategy dimension given).
out=$("$HT" plan --preset llama-7b --hardware a100-80gb-sxm --gpus 64 --tp 1 --pp 1 --zero 3 \
  --offload none --recompute selective --micro-batch 2 --tokens 1T 2>&1) ||
  { echo "fixed plan failed after train: $out"; exit 1; }
grep -q "^plan: llama-7b on 64 x a100-80gb-sxm" <<<"$out" || { echo "no plan: $out"; exit 1; }
if grep -q "unknown hardware" <<<"$out"; then echo "mentions unknown hardware: $out"; exit 1; fi
# The same with the strategy open: a search on that hardware and count.
out=$("$HT" plan --preset llama-7b --hardware a100-80gb-sxm --gpus 64 --tokens 1T 2>&1) ||
  { echo "open plan failed after train: $out"; exit 1; }
grep -q "^search: llama-7b" <<<"$out" || { echo "no search: $out"; exit 1; }
# The README's search example.
out=$("$HT" plan --preset gpt3-175b --tokens 300B --budget 4M --deadline 60 --explain 2>&1) ||
  { echo "README search failed after train: $out"; exit 1; }
grep -q "choice: " <<<"$out" || { echo "no choice: $out"; exit 1; }
# Where `local` is needed, the message names the missing profile and the command that makes it.
if out=$("$HT" plan --preset gpt2-124m --hardware local --gpus 1 2>&1); then
  echo "--hardware local without a profile succeeded: $out"; exit 1; fi
grep -q "run 'hetrain bench'\|once 'hetrain bench'" <<<"$out" || { echo "no hint: $out"; exit 1; }
if out=$("$HT" plan --preset gpt2-124m --hardware a100-80gb-sxm --gpus 8 --calibrate 2>&1); then
  echo "--calibrate with only local runs and no profile succeeded: $out"; exit 1; fi
grep -q "no device profile for this machine" <<<"$out" || { echo "no reason: $out"; exit 1; }
echo "plan after train: catalog plans and the search work without a device profile"
