# shellcheck shell=bash
# What the multi-process tests of this folder share; each sources it after its `set` line:
#   . "$(dirname "$0")/lib.sh"
# It gives them
#   here   this folder (mpirun.sh, tensors_equal.py, bn_per_rank.py);
#   dir    a fresh directory, removed on exit, with XDG_CACHE_HOME=$dir/cache below it: no run
#          reads or writes the user's device profile or performance models (mpirun.sh, which
#          sources this file too, gives each launch its own, unless -x passes XDG_CACHE_HOME);
#   quiet  the flags every training run takes here: one thread a rank, no progress bar, no
#          record in the run history;
# and the functions below. It reads no arguments: each test takes its own (HETRAIN first).

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
dir=$(mktemp -d "${TMPDIR:-/tmp}/hetrain-test.XXXXXX")
trap 'rm -rf "$dir"' EXIT
export XDG_CACHE_HOME=$dir/cache
# shellcheck disable=SC2034  # used by the tests that source this file
quiet=(--no-progress --no-record --threads 1)

# fail MESSAGE...: prints "FAIL: MESSAGE" and ends the test (exit 1).
fail() {
  echo "FAIL: $*"
  exit 1
}

# mpi NP LIMIT_S [MPIRUN_FLAGS... --] CMD ARGS...: CMD on NP ranks under mpirun.sh (its own
# TMPDIR and cache, root allowed, ended after LIMIT_S seconds).
mpi() { bash "$here/mpirun.sh" "$@"; }

# logged NAME CMD ARGS...: runs CMD with its output in $dir/NAME.out; where CMD fails, prints
# that output and fails naming NAME.
logged() {
  local name=$1
  shift
  "$@" > "$dir/$name.out" 2>&1 || { cat "$dir/$name.out"; fail "$name"; }
}

# losses LOG: the losses a --json-log file records, one a line, as written.
losses() { grep -o '"loss":[^,]*' "$1"; }

# same_losses LOG_A LOG_B WHAT: true when both logs record the same losses; otherwise prints
# "FAIL: logged losses differ WHAT" and the two columns.
same_losses() {
  [[ "$(losses "$1")" == "$(losses "$2")" ]] && return 0
  echo "FAIL: logged losses differ $3"
  paste <(losses "$1") <(losses "$2")
  return 1
}

# same_files DIR_A DIR_B WHAT FILE...: true when each FILE is byte-identical in both folders;
# prints "FILE: identical (N bytes)" for each that is, "FAIL: FILE differs WHAT" (and cmp's first
# difference) for each that is not.
same_files() {
  local a=$1 b=$2 what=$3 f status=0
  shift 3
  for f in "$@"; do
    if cmp "$a/$f" "$b/$f"; then
      echo "$f: identical ($(stat -c %s "$b/$f") bytes)"
    else
      echo "FAIL: $f differs $what"
      status=1
    fi
  done
  return $status
}
