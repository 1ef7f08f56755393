// The MPI communicator (Open MPI or any MPI-3 library) for host memory, the job's bootstrap,
// and the watchdog that ends a job whose collective does not complete in time.
//
//   // mpirun -np 4 ./prog
//   auto comm = hetrain::distributed::make_world_communicator({.timeout_s = 60});
//   // comm->size() == 4 under mpirun; a world of one (make_local_communicator) without it
//
// Part of the hetrain_distributed library (links MPI); the core library does not depend on it.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "hetrain/distributed/communicator.h"

namespace hetrain::distributed {

struct MpiOptions {
  /// Seconds a collective may take before the job is aborted (MPI_Abort) with a message that
  /// names the step, the collective and the ranks that did not reach it; <= 0: no limit.
  double timeout_s = 600;
};

/// Whether mpirun (Open MPI, or a PMI/PMIx launcher) started this process.
bool launched_by_mpi();

/// Initialises MPI (thread level MPI_THREAD_SERIALIZED) and returns MPI_COMM_WORLD's
/// communicator. One at a time per process; MPI is finalised when it is destroyed.
std::unique_ptr<Communicator> make_mpi_communicator(const MpiOptions& opt = {});

/// An MPI communicator when launched_by_mpi(), else the world of one.
std::unique_ptr<Communicator> make_world_communicator(const MpiOptions& opt = {});

/// MPI_Get_library_version's first line, and the thread level MPI gave ("serialized", ...);
/// empty before MPI is initialised.
std::string mpi_library_version();
std::string mpi_thread_level();
/// The host name as MPI reports it.
std::string mpi_processor_name();

/// Fault injection for tests, from HETRAIN_FAULT_INJECT="RANK:STEP:KIND[@POINT]" (KIND: exit,
/// abort, segv, hang or kill, a SIGKILL): rank RANK fails at the start of step STEP (0-based),
/// or with @POINT while writing the sharded checkpoint of step STEP (steps done): @shard once
/// its shard file is written, @commit (rank 0) once the index is.
struct Fault {
  enum class Kind { exit, abort, segv, hang, kill };
  int rank = 0;
  int64_t step = 0;
  Kind kind = Kind::exit;
  std::string point;  // empty: the start of the step; "shard" or "commit"
};
/// The fault the environment asks for; throws naming the variable for a malformed value.
std::optional<Fault> fault_from_env();
/// Fails as the fault says when (rank, step) is its target; otherwise returns.
void inject_fault(const Fault& f, int rank, int64_t step);

}  // namespace hetrain::distributed
