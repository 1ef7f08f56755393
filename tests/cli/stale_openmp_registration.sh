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
# The shell writes the file for its own PID, then becomes hetrain (exec keeps the PID).
# shellcheck disable=SC2016  # expanded by the inner shell
bash -c 'f=/dev/shm/__KMP_REGISTERED_LIB_$$_$(id -u); echo "$f" > "$1"; : > "$f"; exec "$2" version' \
  _ "$tmp.name" "$bin" > "$tmp/out" 2>&1 || { cat "$tmp/out"; fail "hetrain version failed (rc $?)"; }
f=$(cat "$tmp.name")
grep -q '^hetrain ' "$tmp/out" || { cat "$tmp/out"; fail "no version line"; }
[[ ! -e $f ]] || fail "the empty registration file $f is still there"
# A threaded command as well: its OpenMP team starts after the check.
bash -c 'f=/dev/shm/__KMP_REGISTERED_LIB_$$_$(id -u); echo "$f" > "$1"; : > "$f"; exec "$2" "${@:3}"' \
  _ "$tmp.name" "$bin" train --preset fashion-mlp --hidden 32 --batch-size 16 --steps 2 --threads 2 --no-progress \
  --no-record > "$tmp/out" 2>&1 || { cat "$tmp/out"; fail "hetrain train failed"; }
grep -q '^result: ' "$tmp/out" || { cat "$tmp/out"; fail "no result line"; }
[[ ! -e $(cat "$tmp.name") ]] || fail "the empty registration file is still there after train"
echo "stale OpenMP registration files removed; version and train ran"
