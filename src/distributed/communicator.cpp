// The communicator interface's shared checks and the world of one process.
#include "hetrain/distributed/communicator.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>

#include "hetrain/base/error.h"

namespace hetrain::distributed {

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return "sum";
    case ReduceOp::max:
      return "max";
    case ReduceOp::min:
      return "min";
  }
  return "?";
}

void check_collective(const Communicator& c, const char* op, int64_t count, Dtype dt, bool reduces,
                      int root) {
  if (count < 0) fail("[", c.backend(), " ", op, "] negative element count ", count);
  if (reduces && dt == Dtype::boolean)
    fail("[", c.backend(), " ", op, "] cannot reduce dtype ", dtype_name(dt));
  if (root < 0 || root >= c.size())
    fail("[", c.backend(), " ", op, "] root ", root, " is not a rank of this world of ", c.size());
}

namespace {

class DoneWork final : public Work {
 public:
  bool test() override { return true; }
  void wait() override {}
};

class LocalCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  int local_rank() const override { return 0; }
  int local_size() const override { return 1; }
  const char* backend() const override { return "local"; }

  WorkPtr iall_reduce(void*, int64_t count, Dtype dt, ReduceOp) override {
    check_collective(*this, "all_reduce", count, dt, true);
    return done();
  }
  WorkPtr ireduce_scatter(const void* send, void* recv, int64_t count, Dtype dt,
                          ReduceOp) override {
    check_collective(*this, "reduce_scatter", count, dt, true);
    return copy(send, recv, count, dt);
  }
  WorkPtr iall_gather(const void* send, void* recv, int64_t count, Dtype dt) override {
    check_collective(*this, "all_gather", count, dt, false);
    return copy(send, recv, count, dt);
  }
  WorkPtr iall_to_all(const void* send, void* recv, int64_t count, Dtype dt) override {
    check_collective(*this, "all_to_all", count, dt, false);
    return copy(send, recv, count, dt);
  }
  WorkPtr ibroadcast(void*, int64_t count, Dtype dt, int root) override {
    check_collective(*this, "broadcast", count, dt, false, root);
    return done();
  }
  WorkPtr ibarrier() override { return done(); }
  void abort_job(int) override {}

 private:
  static WorkPtr done() { return std::make_unique<DoneWork>(); }
  static WorkPtr copy(const void* send, void* recv, int64_t count, Dtype dt) {
    if (send != recv && count > 0)
      std::memmove(recv, send, static_cast<size_t>(count) * dtype_size(dt));
    return done();
  }
};

}  // namespace

std::unique_ptr<Communicator> make_local_communicator() {
  return std::make_unique<LocalCommunicator>();
}

namespace {
std::atomic<DeviceCommunicatorMaker> g_device_maker{nullptr};
}  // namespace

void set_device_communicator_maker(DeviceCommunicatorMaker make) { g_device_maker = make; }

std::unique_ptr<Communicator> make_device_communicator(Device memory, Communicator& host,
                                                       double timeout_s) {
  if (memory.kind != DeviceKind::cuda) return nullptr;
  const DeviceCommunicatorMaker make = g_device_maker.load();
  if (!make)
    fail("[distributed] collectives on ", memory.str(),
         "'s memory need the NCCL communicator of the hetrain_distributed library, which this "
         "program did not install (call distributed::install_nccl_communicators() or "
         "make_world_communicator() first)");
  return make(memory, host, timeout_s);
}

ProgressMode progress_mode_from_env() {
  const char* e = std::getenv("HETRAIN_DDP_PROGRESS");
  const std::string v = e ? e : "";
  if (v.empty() || v == "executor") return ProgressMode::executor;
  if (v == "thread") return ProgressMode::thread;
  if (v == "none") return ProgressMode::none;
  fail("[ddp] HETRAIN_DDP_PROGRESS must be executor, thread or none, got '", v, "'");
}

const char* progress_mode_name(ProgressMode m) {
  return m == ProgressMode::thread ? "thread" : m == ProgressMode::none ? "none" : "executor";
}

}  // namespace hetrain::distributed
