#!/usr/bin/env bash
# Output files are written, not replaced: a symlink stays a link, a FIFO or device is written
# through (a write error fails the run), a directory is refused; a --json-log survives a run that
# fails on its inputs, a write error to it fails the run without a half record, a NaN loss is
# valid JSON, and a measured run that cannot be recorded does not fail the training.
# Usage: output_files.sh HETRAIN
set -uo pipefail
bin=$1
tmp=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$tmp"' EXIT
export XDG_CACHE_HOME="$tmp/cache"
die() { echo "FAIL: $*"; exit 1; }
sim=(simulate --preset fashion-mlp --batch-size 64 --devices cpu,sim:0 --steps 1)
mlp=(train --preset fashion-mlp --hidden 32 --batch-size 16 --no-progress --threads 2)

# A symlink: its target gets the trace, the link stays.
echo old > "$tmp/target.json"
ln -s target.json "$tmp/link.json"
"$bin" "${sim[@]}" --trace "$tmp/link.json" > /dev/null 2>&1 || die "trace through a symlink failed"
[ -L "$tmp/link.json" ] || die "the symlink was replaced"
grep -q traceEvents "$tmp/target.json" || die "the symlink's target was not written"
# A FIFO is written through, not replaced by a regular file.
mkfifo "$tmp/fifo"
cat "$tmp/fifo" > "$tmp/from_fifo" &
reader=$!
timeout 60 "$bin" "${sim[@]}" --trace "$tmp/fifo" > /dev/null 2>&1 || die "trace into a FIFO failed"
wait $reader
[ -p "$tmp/fifo" ] || die "the FIFO was replaced"
grep -q traceEvents "$tmp/from_fifo" || die "nothing came through the FIFO"
# A device that cannot take the data: the error, and the device is still a device.
out=$("$bin" "${sim[@]}" --trace /dev/full 2>&1) && die "a write to /dev/full succeeded"
echo "$out"
grep -q "cannot write --trace file '/dev/full': No space left on device" <<<"$out" ||
  die "the write error is not reported"
[ -c /dev/full ] || die "/dev/full is no longer a device"
out=$("$bin" "${sim[@]}" --trace "$tmp" 2>&1) && die "a directory was accepted"
grep -q "is a directory" <<<"$out" || die "the directory is not named"
out=$("$bin" bench --quick --no-store --json /dev/full 2>&1) && die "bench --json /dev/full succeeded"
grep -q "No space left on device" <<<"$out" || die "bench: the write error is not reported"
[ -c /dev/full ] || die "/dev/full is no longer a device"
grep -q '\.tmp' <<<"$(ls -A "$tmp")" && die "temporary files left: $(ls -A "$tmp")"
echo "outputs: symlink, FIFO, device and directory handled"

# --json-log: a run that fails on bad data leaves the old log alone.
echo '{"old": true}' > "$tmp/log.jsonl"
"$bin" "${mlp[@]}" --steps 2 --data "$tmp/nonexistent" --json-log "$tmp/log.jsonl" > /dev/null 2>&1 &&
  die "a run on missing data succeeded"
[ "$(cat "$tmp/log.jsonl")" = '{"old": true}' ] || die "the old log was emptied before the inputs were checked"
# A full device fails the run.
out=$("$bin" "${mlp[@]}" --steps 2 --no-record --json-log /dev/full 2>&1) &&
  die "a run logging to /dev/full exited 0"
grep -q "cannot write --json-log file '/dev/full': No space left on device" <<<"$out" ||
  { echo "$out"; die "the log write error is not reported"; }
# A full disk in the middle of a record: the run fails and the log holds whole records only.
(
  trap '' XFSZ
  ulimit -f 1
  exec "$bin" "${mlp[@]}" --steps 40 --log-every 1 --no-record --json-log "$tmp/cut.jsonl"
) > "$tmp/cut.out" 2>&1 && die "a run whose log hit the file-size limit exited 0"
grep -q "cannot write --json-log file '$tmp/cut.jsonl': File too large" "$tmp/cut.out" ||
  { cat "$tmp/cut.out"; die "the log write error is not reported"; }
[ -s "$tmp/cut.jsonl" ] || die "no records before the limit"
[ "$(tail -c1 "$tmp/cut.jsonl" | od -An -c | tr -d ' ')" = '\n' ] || die "the log ends in a half record"
grep -vq '^{.*}$' "$tmp/cut.jsonl" && die "a log line is not a whole record"
echo "json-log: kept on bad input, write errors fail the run, no half records"

# A final loss of NaN (every step skipped by the scaler) still ends with valid JSON and a result.
out=$("$bin" "${mlp[@]}" --steps 5 --no-record --lr 1e30 --grad-scaler on \
  --json-log "$tmp/nan.jsonl" 2>&1) || { echo "$out"; die "a run with a NaN loss failed"; }
grep -q "^result: .*train loss -\?nan" <<<"$out" || { echo "$out"; die "no result line"; }
grep -q '"final":true,.*"train_loss":null' "$tmp/nan.jsonl" || die "the final record is not valid JSON"
echo "NaN loss: valid JSON and a result"

# Recording the measured run is best-effort: a cache that cannot be written (file-size limit 0)
# gives a warning, and the training's result and exit status stand. The sanitizer build runs on
# LLVM's OpenMP runtime (tools/run_sanitizers.sh), which sizes a shared-memory file at start-up
# and stops the process when that fails, before any of Hetrain's code: the check needs GCC's.
# (grep reads ldd's whole output: under pipefail, `ldd | grep -q` fails at random when grep
# stops reading first and ldd dies of SIGPIPE, as it did in a CI run.)
if grep -q 'libomp\.so' <<<"$(ldd "$bin")"; then
  echo "full cache: not checked, $bin runs on LLVM's libomp (cannot start under ulimit -f 0)"
else
  out=$(
    trap '' XFSZ
    ulimit -f 0
    "$bin" "${mlp[@]}" --steps 2 2>&1
  ) || { echo "$out"; die "a full cache failed the training"; }
  echo "$out"
  grep -q "^result: " <<<"$out" || die "no result line"
  grep -q "warning: run not recorded" <<<"$out" || die "no warning about the record"
fi
echo "output files behave"
