#!/usr/bin/env bash
# --threads 0 (the default) follows the CPUs other work leaves free: on two CPUs with a busy
# process of another session on one of them, the team drops to one thread, says so, and the JSON
# log's records say "threads": 1, and the run is not recorded for the planner's calibration;
# --threads 2 keeps 2 throughout and is recorded. Usage: threads_follow_load.sh
# HETRAIN
set -uo pipefail
bin=$1
tmp=$(mktemp -d)
hog=
cleanup() {
  [ -n "$hog" ] && kill "$hog" 2> /dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
export XDG_CACHE_HOME="$tmp/cache"
die() { echo "FAIL: $*"; exit 1; }
command -v taskset > /dev/null || { echo "SKIP: no taskset"; exit 0; }
# The first two CPUs of this process's mask.
cpus=$(python3 -c 'import os; c = sorted(os.sched_getaffinity(0)); print(",".join(map(str, c[:2])) if len(c) >= 2 else "")')
[ -n "$cpus" ] || { echo "SKIP: fewer than 2 CPUs"; exit 0; }
first=${cpus%%,*}
# A busy loop in a session of its own (as a compile in another terminal), on the first CPU.
setsid taskset -c "$first" sh -c 'while :; do :; done' &
hog=$!
mlp=(train --preset fashion-mlp --hidden 32 --batch-size 64 --eval-batches 1 --no-progress
     --log-every 10)
runs=$XDG_CACHE_HOME/hetrain/measured_runs.json

timeout 240 taskset -c "$cpus" "$bin" "${mlp[@]}" --steps 1500 --json-log "$tmp/auto.jsonl" \
  > "$tmp/auto.out" 2>&1 || die "the run under load failed: $(tail -5 "$tmp/auto.out")"
grep -q "up to 2 threads (as many as other work leaves free)" "$tmp/auto.out" \
  || die "no 'up to 2 threads' in: $(head -3 "$tmp/auto.out")"
grep -Eq "note: other work used [0-9.]+ of this process's 2 CPUs; now 1 thread" "$tmp/auto.out" \
  || die "no note of the team shrinking: $(cat "$tmp/auto.out")"
# Its steps ran on two team sizes: its step time goes to no planner calibration.
grep -Eq "note: run not recorded in .*the team changed size [0-9]+ time" "$tmp/auto.out" \
  || die "no note of the run left unrecorded: $(cat "$tmp/auto.out")"
[ -e "$runs" ] && die "the run whose team changed was recorded in $runs"
python3 - "$tmp/auto.jsonl" <<'PY' || die "auto records"
import json, sys
teams = [json.loads(l)["threads"] for l in open(sys.argv[1]) if '"samples_per_s"' in l]
assert teams and set(teams) <= {1, 2}, teams
assert teams[-1] == 1, f"the team did not end at 1 thread: {teams}"
print(f"auto: {teams.count(2)} records at 2 threads, then {teams.count(1)} at 1")
PY

timeout 240 taskset -c "$cpus" "$bin" "${mlp[@]}" --steps 60 --threads 2 \
  --json-log "$tmp/fixed.jsonl" > "$tmp/fixed.out" 2>&1 || die "the --threads 2 run failed"
grep -q "note: other work" "$tmp/fixed.out" && die "--threads 2 changed its team"
grep -q "not recorded" "$tmp/fixed.out" && die "the --threads 2 run was not recorded"
[ "$(grep -c '"step_time_s"' "$runs")" = 1 ] || die "expected the --threads 2 run in $runs"
python3 - "$tmp/fixed.jsonl" <<'PY' || die "fixed records"
import json, sys
teams = [json.loads(l)["threads"] for l in open(sys.argv[1]) if '"samples_per_s"' in l]
assert teams and set(teams) == {2}, teams
PY
echo "the team follows the free CPUs"
