#!/usr/bin/env bash
# A dead process's empty OpenMP registration file under this process's PID does not stop it.
# LLVM's libomp (the sanitizer build's OpenMP runtime) reads /dev/shm/__KMP_REGISTERED_LIB_<pid>_<uid>
# at its start when one exists; an empty one, left by a process stopped while creating it, made
# the next process with that PID die of SIGBUS (a CI run). Hetrain removes such a file before its
# runtime starts: the run succeeds and the file is gone, whichever OpenMP runtime the build has.
# Usage: stale_openmp_registration.sh HETRAIN   (exit 77, skipped, where there is no /dev/shm)
set -euo pipefail
bin=$1
[[ -d /dev/shm && -w /dev/shm ]] || { echo "no writable /dev/shm: skipped"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"; [[ -s $tmp.name ]] && rm -f "$(cat "$tmp.name")"; rm -f "$tmp.name"' EXIT
export XDG_CACHE_HOME=$tmp/cache
fail() {
  echo "FAIL: $*"
  exit 1
}
# with_stale_file OUT CMD ARGS...: CMD (output in OUT) started under a PID that has an empty
# registration file: the shell writes it for its own PID, then becomes CMD (exec keeps the PID).
# Returns CMD's status; $tmp.name holds the file's path.
with_stale_file() {
  local out=$1
  shift
  # shellcheck disable=SC2016  # expanded by the inner shell
  bash -c 'f=/dev/shm/__KMP_REGISTERED_LIB_$$_$(id -u); echo "$f" > "$1"; : > "$f"; exec "${@:2}"' \
    _ "$tmp.name" "$@" > "$out" 2>&1
}
# run_checked WHAT LINE_REGEX CMD ARGS...: CMD must succeed, print LINE_REGEX and leave no file.
run_checked() {
  local what=$1 line=$2 rc=0
  shift 2
  with_stale_file "$tmp/out" "$@" || rc=$?
  ((rc == 0)) || { cat "$tmp/out"; fail "$what failed (rc $rc)"; }
  grep -q "$line" "$tmp/out" || { cat "$tmp/out"; fail "$what printed no line matching $line"; }
  [[ ! -e $(cat "$tmp.name") ]] || fail "the empty registration file is still there after $what"
}
run_checked "hetrain version" '^hetrain ' "$bin" version
# A threaded command as well: its OpenMP team starts after the check.
run_checked "hetrain train" '^result: ' "$bin" train --preset fashion-mlp --hidden 32 \
  --batch-size 16 --steps 2 --threads 2 --no-progress --no-record
echo "stale OpenMP registration files removed; version and train ran"
