#!/usr/bin/env bash
# A rank that fails mid-run: `mpirun -np 2 hetrain train` must return non-zero within its bound
# and leave no process behind. KIND is exit, abort, segv or hang (HETRAIN_FAULT_INJECT); a hang
# must end every other rank within --comm-timeout + 5 s with a message naming the step, the
# collective and the missing rank.
# Usage: failure.sh HETRAIN KIND
set -uo pipefail
. "$(dirname "$0")/lib.sh"
ht=$1 kind=$2
timeout_s=4
fault_step=3
export HETRAIN_FAULT_INJECT="1:$fault_step:$kind"
start=$(date +%s.%N)
mpi 2 120 -x HETRAIN_FAULT_INJECT -- "$ht" train --preset fashion-mlp --hidden 16 \
  --batch-size 16 --steps 100000 "${quiet[@]}" --comm-timeout "$timeout_s" --save "$dir/ckpt" \
  > "$dir/out" 2>&1
rc=$?
end=$(date +%s.%N)
elapsed=$(awk "BEGIN {print $end - $start}")
status=0
echo "mpirun exit status $rc after $elapsed s"
grep -E "\[fault\]|\[mpi\]" "$dir/out"
[[ $rc != 0 ]] || { echo "FAIL: mpirun returned 0"; status=1; }
[[ $rc != 124 && $rc != 137 ]] || { echo "FAIL: mpirun had to be killed by timeout"; status=1; }
grep -q "\[fault\] rank 1: injected $kind at step $((fault_step + 1))" "$dir/out" \
  || { echo "FAIL: the fault was not injected"; status=1; }
# Bounds: start-up (a few seconds on a loaded machine) plus 5 s, or the timeout plus 5 s.
bound=15
if [[ $kind == hang ]]; then
  bound=$((timeout_s + 15))
  grep -qE "\[mpi\] rank 0: step $((fault_step + 1)): .* did not complete within --comm-timeout $timeout_s s .*rank\(s\) 1 never reached it" "$dir/out" \
    || { echo "FAIL: no watchdog message naming step $((fault_step + 1)) and rank 1"; cat "$dir/out"; status=1; }
fi
awk "BEGIN {exit !($elapsed < $bound)}" || { echo "FAIL: took $elapsed s (bound $bound s)"; status=1; }
sleep 1
if pgrep -f "$dir/ckpt" > /dev/null; then
  echo "FAIL: processes left:"; pgrep -af "$dir/ckpt"; status=1
fi
[[ $status == 0 ]] && echo "rank failure ($kind) handled"
exit $status
