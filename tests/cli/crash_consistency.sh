#!/usr/bin/env bash
# Crash consistency: a run that saves every step is killed (SIGKILL) at pseudo-random moments,
# KILLS times in a row, each time resumed from the save directory by `--resume DIR` (which picks
# the latest complete checkpoint). After every kill the directory's latest checkpoint must
# resume, and every step a resumed run logs must equal the uninterrupted run's step, bit for bit
# (the JSON log prints each step's loss to round-trip exactly); at the end the weights must be the
# same bytes. The kill points come from bash's RANDOM seeded with SEED: the same on every run.
# Usage: crash_consistency.sh HETRAIN [KILLS] [SEED]
set -uo pipefail
bin=$1; kills=${2:-24}; seed=${3:-28}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export XDG_CACHE_HOME="$tmp/cache"
die() { echo "FAIL: $*"; exit 1; }
steps=36
run=(train --preset gpt-mini --layers 1 --width 16 --heads 2 --context 8 --batch-size 4
     --eval-batches 1 --no-progress --no-record --threads 1 --steps $steps --log-every 1
     --save-every 1)
# "step loss" for each step a JSON log records (the loss printed to round-trip exactly).
losses() { sed -nE 's/.*"loss":([^,}]*).*"step":([0-9]+).*/\2 \1/p' "$@"; }
# Every logged step of a run lies on the uninterrupted trajectory.
on_reference() {
  losses "$1" | while read -r s l; do
    [ "$(sed -n "${s}p" "$tmp/ref.losses")" = "$s $l" ] || { echo "step $s: loss $l"; exit 1; }
  done
}
last_step() { tail -n 1 "$1" 2> /dev/null | sed -nE 's/.*"step":([0-9]+).*/\1/p'; }
ms() { echo $(($(date +%s%N) / 1000000)); }

# The uninterrupted trajectory, and a one-step run: the difference times a step with its save.
t0=$(ms)
"$bin" "${run[@]}" --save "$tmp/ref" --json-log "$tmp/ref.jsonl" > /dev/null 2>&1 || die "reference run failed"
t1=$(ms)
"$bin" "${run[@]}" --steps 1 > /dev/null 2>&1 || die "one-step run failed"
t2=$(ms)
step_ms=$(((t1 - t0 - (t2 - t1)) / (steps - 1)))
((step_ms >= 1)) || step_ms=1
losses "$tmp/ref.jsonl" > "$tmp/ref.losses"
[ "$(wc -l < "$tmp/ref.losses")" = $steps ] || die "expected $steps logged steps in the reference"
echo "reference: $steps steps, a save after each, ~$step_ms ms per step"

# Each run is killed at a point drawn from RANDOM (seeded): one in five while it starts (a
# pseudo-random delay of up to 300 ms), the others once the log shows a target step 1-2 steps
# past where it resumed, plus a pseudo-random part of a step: inside the step or its save. Waiting on the log rather than the clock keeps the kills spread over the whole
# trajectory however loaded the machine is.
RANDOM=$seed
d="$tmp/run"
mkdir -p "$d"
resumed_at=()
points=()
from=0
for ((k = 1; k <= kills; k++)); do
  # --resume once a checkpoint exists (an index is a checkpoint's commit point).
  resume=()
  compgen -G "$d/checkpoint.json" > /dev/null || compgen -G "$d/step-*/checkpoint.json" > /dev/null &&
    resume=(--resume "$d")
  log="$tmp/kill$k.jsonl"
  "$bin" "${run[@]}" "${resume[@]}" --save "$d" --json-log "$log" > /dev/null 2> "$tmp/kill$k.err" &
  pid=$!
  if ((RANDOM % 5 == 0)); then
    sleep "0.$(printf '%03d' $((RANDOM % 300)))"
    points+=("start")
  else
    target=$((from + 1 + RANDOM % 2))
    ((target >= steps)) && target=$((steps - 1))
    while kill -0 $pid 2> /dev/null; do
      s=$(last_step "$log")
      [ -n "$s" ] && [ "$s" -ge "$target" ] && break
      sleep 0.005
    done
    extra=$((RANDOM % (step_ms + 1)))
    sleep "$((extra / 1000)).$(printf '%03d' $((extra % 1000)))"
    points+=("$target+${extra}ms")
  fi
  kill -9 $pid 2> /dev/null
  wait $pid 2> /dev/null
  # Each run resumes from the state the previous kill left (its load comes before any save of
  # its own): a load that fails is an error on stderr. What it logged before the kill lies on
  # the uninterrupted trajectory.
  if grep -q "error" "$tmp/kill$k.err"; then
    cat "$tmp/kill$k.err"
    die "kill $k: the directory's latest checkpoint did not resume"
  fi
  if [ -s "$log" ]; then on_reference "$log" || die "kill $k: a step left the uninterrupted trajectory"; fi
  at=$(sed -nE 's/^resumed from .* at step ([0-9]+)$/\1/p' "$tmp/kill$k.err")
  resumed_at+=("${at:--}")
  # Where the next run will resume: the directory's latest checkpoint.
  from=$(ls -d "$d"/step-*/checkpoint.json 2> /dev/null | sed -nE 's#.*/step-([0-9]+)/checkpoint.json#\1#p' | sort -n | tail -1)
  from=${from:-0}
done
echo "kill points (step reached + extra delay, or start-up): ${points[*]}"
echo "resumed at step (- = no checkpoint yet, or killed before loading): ${resumed_at[*]}"
# The last run goes to the end without a kill.
"$bin" "${run[@]}" --resume "$d" --save "$d" --json-log "$tmp/last.jsonl" > /dev/null 2> "$tmp/last.err" ||
  { cat "$tmp/last.err"; die "the final resume failed"; }
grep -q "^resumed from" "$tmp/last.err" || die "the final run did not resume"
on_reference "$tmp/last.jsonl" || die "the final run left the uninterrupted trajectory"
ref_w=$(cat "$tmp"/ref/model.*.safetensors | cksum)
got_w=$(cat "$d"/model.*.safetensors | cksum)
[ "$ref_w" = "$got_w" ] || die "final weights differ from the uninterrupted run's"
# The kills must have interrupted training at different points, not only start-ups.
distinct=$(printf '%s\n' "${resumed_at[@]}" | grep -v -- - | sort -u | wc -l)
[ "$distinct" -ge 2 ] || die "the runs resumed from $distinct distinct steps: the kills missed the training"
echo "$kills kills, resumed from $distinct distinct steps, final weights identical"
