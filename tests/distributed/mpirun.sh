#!/usr/bin/env bash
# Runs a command under mpirun for ctest: mpirun.sh NP LIMIT_S [MPIRUN_FLAGS... --] CMD ARGS...
# Each launch gets its own TMPDIR (Open MPI's session directory) and cache directory, ranks may
# outnumber the cores (--oversubscribe), root may run it, and `timeout` ends it after LIMIT_S.
set -uo pipefail
np=$1 limit=$2
shift 2
flags=()
if [[ " $* " == *" -- "* ]]; then
  while [[ $1 != "--" ]]; do flags+=("$1"); shift; done
  shift
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
TMPDIR=$(mktemp -d "${TMPDIR:-/tmp}/hetrain-mpi.XXXXXX")
export TMPDIR XDG_CACHE_HOME=$TMPDIR/cache
trap 'rm -rf "$TMPDIR"' EXIT
timeout -k 5 "$limit" mpirun --oversubscribe -np "$np" "${flags[@]}" "$@"
