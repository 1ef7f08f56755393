// The NCCL communicator for GPU memory: one GPU per rank, chosen by the rank's local rank, and
// a unique id made by rank 0 and broadcast over a bootstrap communicator (MPI, or the world of
// one: a single rank needs no mpirun). Collectives run on a stream of NCCL's own, after the work
// queued so far on the GPU's compute stream (the CUDA backend's), so buffers that kernels or
// copies just wrote are complete when NCCL reads them; Work::wait() blocks the host until the
// collective is done.
//
//   auto mpi = make_mpi_communicator();
//   auto gpu = make_nccl_communicator(*mpi, {.timeout_s = 60});   // buffers: device pointers
//   gpu->all_reduce(dev_ptr, n, Dtype::f32, ReduceOp::sum);
//
// Built when the CUDA backend is on and the toolkit has NCCL (HETRAIN_HAVE_NCCL); otherwise
// make_nccl_communicator throws saying so.
#pragma once

#include <memory>
#include <string>

#include "hetrain/distributed/communicator.h"

namespace hetrain::distributed {

struct NcclOptions {
  /// Seconds a collective may take; then ncclCommAbort and the bootstrap's abort_job.
  double timeout_s = 600;
  /// The GPU (-1: local_rank % the GPUs this process sees).
  int device = -1;
};

/// Whether this build has NCCL and this process sees at least one GPU.
bool nccl_available();
/// "2.28.3", or empty without NCCL.
std::string nccl_version();
/// Collectives over the GPUs of the bootstrap's ranks (each rank on GPU local_rank % GPUs).
/// The bootstrap must outlive the result.
std::unique_ptr<Communicator> make_nccl_communicator(Communicator& bootstrap,
                                                     const NcclOptions& opt = {});

/// Installs make_nccl_communicator as the maker of make_device_communicator
/// (distributed/communicator.h) for GPU memory; in a build without NCCL, a maker that throws
/// saying so. make_world_communicator calls it.
void install_nccl_communicators();

}  // namespace hetrain::distributed
