// The process-group interface of the distributed layer: collectives over every rank of a job,
// each blocking or non-blocking with a handle. Implementations: a world of one process
// (make_local_communicator, what a run without mpirun uses), MPI for host memory
// (distributed/mpi.h) and NCCL for GPU memory (distributed/nccl.h).
//
//   using namespace hetrain::distributed;
//   std::unique_ptr<Communicator> comm = make_local_communicator();
//   std::vector<float> v = {1, 2, 3};
//   comm->all_reduce(v.data(), 3, Dtype::f32, ReduceOp::sum);        // blocking
//   WorkPtr w = comm->iall_reduce(v.data(), 3, Dtype::f32, ReduceOp::sum);
//   ...                                                                // overlap other work
//   w->wait();
//
// Buffers are raw pointers with an element count and a dtype: host memory for the MPI and local
// communicators, device memory of the communicator's GPU for NCCL. A non-blocking operation's
// buffers must stay alive and untouched until its Work completes. Every rank must issue the
// same collectives in the same order.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "hetrain/base/dtype.h"
#include "hetrain/memory/device.h"

namespace hetrain::distributed {

enum class ReduceOp { sum, max, min };
const char* reduce_op_name(ReduceOp op);

/// A non-blocking collective in flight.
class Work {
 public:
  virtual ~Work() = default;
  /// Whether the operation has completed (drives its progress; never blocks).
  virtual bool test() = 0;
  /// Blocks until the operation completes. Under a communicator with a timeout, a collective
  /// that does not complete in time ends the job with a message naming the step, the
  /// collective and the ranks that did not reach it.
  virtual void wait() = 0;
};
using WorkPtr = std::unique_ptr<Work>;

/// What the job is doing, for the watchdog's message ("step 12, all_to_all of bucket 3").
struct CollectiveContext {
  int64_t step = -1;  // -1: before training
  std::string what;   // the purpose of the next collectives
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// Rank among the processes on this host, and their number.
  virtual int local_rank() const = 0;
  virtual int local_size() const = 0;
  /// "local", "mpi" or "nccl".
  virtual const char* backend() const = 0;

  /// In place: every rank ends with op over all ranks' buf (count elements).
  virtual WorkPtr iall_reduce(void* buf, int64_t count, Dtype dt, ReduceOp op) = 0;
  /// send holds count * size() elements; rank r receives op over all ranks of block r in
  /// recv (count elements).
  virtual WorkPtr ireduce_scatter(const void* send, void* recv, int64_t count, Dtype dt,
                                  ReduceOp op) = 0;
  /// send holds count elements; recv gets rank r's block at offset r * count.
  virtual WorkPtr iall_gather(const void* send, void* recv, int64_t count, Dtype dt) = 0;
  /// send holds size() blocks of count elements, block r going to rank r; recv gets rank r's
  /// block for this rank at offset r * count.
  virtual WorkPtr iall_to_all(const void* send, void* recv, int64_t count, Dtype dt) = 0;
  /// In place: every rank ends with root's buf.
  virtual WorkPtr ibroadcast(void* buf, int64_t count, Dtype dt, int root) = 0;
  virtual WorkPtr ibarrier() = 0;
  /// Ends every process of the job with `code` after an error on this rank, so that no other
  /// rank waits for it (MPI_Abort). The world of one returns and lets the error propagate.
  virtual void abort_job(int code) = 0;

  void all_reduce(void* buf, int64_t count, Dtype dt, ReduceOp op) {
    iall_reduce(buf, count, dt, op)->wait();
  }
  void reduce_scatter(const void* send, void* recv, int64_t count, Dtype dt, ReduceOp op) {
    ireduce_scatter(send, recv, count, dt, op)->wait();
  }
  void all_gather(const void* send, void* recv, int64_t count, Dtype dt) {
    iall_gather(send, recv, count, dt)->wait();
  }
  void all_to_all(const void* send, void* recv, int64_t count, Dtype dt) {
    iall_to_all(send, recv, count, dt)->wait();
  }
  void broadcast(void* buf, int64_t count, Dtype dt, int root) {
    ibroadcast(buf, count, dt, root)->wait();
  }
  void barrier() { ibarrier()->wait(); }

  /// Names what the following collectives are for (the watchdog's message).
  void set_context(CollectiveContext c) { context_ = std::move(c); }
  const CollectiveContext& context() const { return context_; }

 protected:
  CollectiveContext context_;
};

/// A world of one process: rank 0 of 1; collectives copy (or do nothing) and complete at once.
std::unique_ptr<Communicator> make_local_communicator();

/// The communicator for collectives on the memory of `memory`, bootstrapped over `host` (the
/// same ranks): null for memory the host reads in place (the CPU, sim devices), where `host`
/// serves; for a GPU, NCCL on that GPU (one per rank; a world of one needs no mpirun), whose
/// buffers are the GPU's pointers. NCCL is in the hetrain_distributed library, which installs
/// its maker (install_nccl_communicators, distributed/nccl.h; make_world_communicator does);
/// without it, or in a build without NCCL, this throws saying what to do.
std::unique_ptr<Communicator> make_device_communicator(Device memory, Communicator& host,
                                                       double timeout_s);
using DeviceCommunicatorMaker = std::unique_ptr<Communicator> (*)(Device memory, Communicator& host,
                                                                  double timeout_s);
void set_device_communicator_maker(DeviceCommunicatorMaker make);

/// Checks the arguments every implementation shares (count >= 0, root in range, reductions only
/// on numeric dtypes); `op` names the collective in the error.
void check_collective(const Communicator& c, const char* op, int64_t count, Dtype dt, bool reduces,
                      int root = 0);

/// Who polls DDP's bucket exchanges in flight during backward (distributed/grad_reducer.h);
/// MPI is initialised with the thread level the mode needs.
enum class ProgressMode { none, executor, thread };
/// $HETRAIN_DDP_PROGRESS (none|executor|thread; unset: executor). Throws for another value.
ProgressMode progress_mode_from_env();
const char* progress_mode_name(ProgressMode m);

}  // namespace hetrain::distributed
