#!/usr/bin/env bash
# Runs a command under mpirun for ctest: mpirun.sh NP LIMIT_S [MPIRUN_FLAGS... --] CMD ARGS...
# Each launch gets its own TMPDIR (Open MPI's session directory) and cache directory, ranks may
# outnumber the cores (--oversubscribe), root may run it, and `timeout` ends it after LIMIT_S.
#
# One retry, for one known fault of Open MPI 4's run-time (ORTE) and nothing else: on a loaded
# machine mpirun can see a rank's output close before it reaps the process, and then reports
# "process rank R with PID 0 ... exiting improperly" and fails a job whose ranks all finished
# and called MPI_Finalize (open-mpi/ompi issues 7833, 9389, 12607; CI hit it once, in an ASan
# run, after rank 0 had printed its result). PID 0 is the mark of that race: a rank that really
# exits without MPI_Finalize is reported with its own PID. Such a launch is run once more, from
# the start; a run with an injected fault (HETRAIN_FAULT_INJECT) is never repeated.
set -uo pipefail
np=$1 limit=$2
shift 2
flags=()
if [[ " $* " == *" -- "* ]]; then
  while [[ $1 != "--" ]]; do flags+=("$1"); shift; done
  shift
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
. "$(dirname "$0")/lib.sh"  # $dir: this launch's own, removed on exit, its cache below it
export TMPDIR=$dir
launch() {  # mpirun's stderr goes through tee, into $TMPDIR/stderr as well
  { timeout -k 5 "$limit" mpirun --oversubscribe -np "$np" "${flags[@]}" "$@" 2>&1 1>&3 3>&- \
      | tee "$TMPDIR/stderr" >&2; } 3>&1
  return "${PIPESTATUS[0]}"
}
launch "$@"
rc=$?
if ((rc != 0)) && [[ -z ${HETRAIN_FAULT_INJECT:-} ]] \
  && grep -q "with PID 0 on" "$TMPDIR/stderr" && grep -q "exiting improperly" "$TMPDIR/stderr"; then
  echo "mpirun.sh: Open MPI reported a rank with PID 0 exiting improperly (its run-time's" \
    "shutdown race, not this program); running the job once more" >&2
  launch "$@"
  rc=$?
fi
exit $rc
