#!/usr/bin/env bash
# `mpirun -np 2 hetrain topo --json` on this machine: two ranks, each bound to one CPU with one
# thread (threads come from the affinity mpirun gives each rank). Skips (77) where the host has
# fewer than 2 CPUs or mpirun does not bind.
set -uo pipefail
. "$(dirname "$0")/lib.sh"
ht=$1
out=$(mpi 2 60 "$ht" topo --json) || { echo "$out"; fail "topo failed"; }
echo "$out"
[[ $(nproc) -ge 2 ]] || exit 77
status=0
grep -q '"world_size": 2' <<< "$out" || { echo "FAIL: world_size is not 2"; status=1; }
[[ $(grep -c '"cpus": 1,' <<< "$out") == 2 ]] || { echo "FAIL: not one CPU per rank"; status=1; }
[[ $(grep -c '"threads": 1$' <<< "$out") == 2 ]] || { echo "FAIL: not 1 thread per rank"; status=1; }
grep -q '"mpi_library": "Open MPI' <<< "$out" || { echo "FAIL: no MPI library"; status=1; }
[[ $status == 0 ]] && echo "topo: 2 ranks, one CPU and one thread each"
exit $status
