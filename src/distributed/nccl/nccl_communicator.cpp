// The NCCL communicator: collectives on a stream of the rank's GPU; a Work is an event after
// the collective, polled together with ncclCommGetAsyncError; a collective that outlives the
// timeout is aborted (ncclCommAbort) and the job ended through the bootstrap.
#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstdio>
#include <thread>

#include "backends/cuda/flat_buffers.h"
#include "hetrain/base/error.h"
#include "hetrain/distributed/nccl.h"

namespace hetrain::distributed {

namespace {

#define HT_NCCL_CHECK(call)                                                                    \
  do {                                                                                         \
    const ncclResult_t r_ = (call);                                                            \
    if (r_ != ncclSuccess)                                                                     \
      ::hetrain::fail("[nccl] ", #call, " failed: ", ncclGetErrorString(r_), " at ", __FILE__, \
                      ":", __LINE__);                                                          \
  } while (0)
#define HT_CUDA_CHECK(call)                                                                    \
  do {                                                                                         \
    const cudaError_t e_ = (call);                                                             \
    if (e_ != cudaSuccess)                                                                     \
      ::hetrain::fail("[nccl] ", #call, " failed: ", cudaGetErrorString(e_), " at ", __FILE__, \
                      ":", __LINE__);                                                          \
  } while (0)

using Clock = std::chrono::steady_clock;

/// Makes a GPU current for a scope (events are created on the current device and must be
/// recorded on a stream of the same one), and restores the caller's.
class CurrentDevice {
 public:
  explicit CurrentDevice(int device) {
    if (cudaGetDevice(&prev_) != cudaSuccess) prev_ = -1;
    if (prev_ != device) HT_CUDA_CHECK(cudaSetDevice(device));
  }
  ~CurrentDevice() {
    int cur = -1;
    if (prev_ >= 0 && cudaGetDevice(&cur) == cudaSuccess && cur != prev_)
      (void)cudaSetDevice(prev_);
  }
  CurrentDevice(const CurrentDevice&) = delete;
  CurrentDevice& operator=(const CurrentDevice&) = delete;

 private:
  int prev_ = -1;
};

ncclDataType_t nccl_type(Dtype dt) {
  switch (dt) {
    case Dtype::f32:
      return ncclFloat32;
    case Dtype::f64:
      return ncclFloat64;
    case Dtype::f16:
      return ncclFloat16;
    case Dtype::bf16:
      return ncclBfloat16;
    case Dtype::i32:
      return ncclInt32;
    case Dtype::i64:
      return ncclInt64;
    case Dtype::boolean:
      return ncclUint8;
  }
  return ncclUint8;
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return ncclSum;
    case ReduceOp::max:
      return ncclMax;
    case ReduceOp::min:
      return ncclMin;
  }
  return ncclSum;
}

class NcclCommunicator;

class NcclWork final : public Work {
 public:
  NcclWork(NcclCommunicator& c, cudaEvent_t ev, std::string name, CollectiveContext ctx)
      : c_(c), ev_(ev), name_(std::move(name)), ctx_(std::move(ctx)) {}
  // A collective not waited for (an error unwinding): the compute stream's later work, which
  // may reuse its buffers once they are freed, still runs after it.
  ~NcclWork() override;
  bool test() override;
  void wait() override;

 private:
  NcclCommunicator& c_;
  cudaEvent_t ev_;
  std::string name_;
  CollectiveContext ctx_;
  bool done_ = false;
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(Communicator& boot, const NcclOptions& opt)
      : boot_(boot), timeout_s_(opt.timeout_s) {
    int devices = 0;
    HT_CUDA_CHECK(cudaGetDeviceCount(&devices));
    if (devices < 1) fail("[nccl] rank ", boot.rank(), " sees no GPU");
    if (opt.device >= devices)
      fail("[nccl] rank ", boot.rank(), ": cuda:", opt.device, " asked for, but this process sees ",
           devices, " GPU(s)");
    device_ = opt.device >= 0 ? opt.device : boot.local_rank() % devices;
    HT_CUDA_CHECK(cudaSetDevice(device_));
    compute_ = static_cast<cudaStream_t>(cuda::stream_handle(device_));
    HT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    HT_CUDA_CHECK(cudaEventCreateWithFlags(&inputs_ready_, cudaEventDisableTiming));
    ncclUniqueId id;
    if (boot.rank() == 0) HT_NCCL_CHECK(ncclGetUniqueId(&id));
    boot.set_context({-1, "broadcast of the NCCL unique id"});
    boot.broadcast(&id, static_cast<int64_t>(sizeof id), Dtype::boolean, 0);
    HT_NCCL_CHECK(ncclCommInitRank(&comm_, boot.size(), id, boot.rank()));
  }
  ~NcclCommunicator() override {
    if (comm_) ncclCommDestroy(comm_);
    if (stream_) cudaStreamDestroy(stream_);
    if (inputs_ready_) cudaEventDestroy(inputs_ready_);
    if (barrier_buf_) cudaFree(barrier_buf_);
  }

  int rank() const override { return boot_.rank(); }
  int size() const override { return boot_.size(); }
  int local_rank() const override { return boot_.local_rank(); }
  int local_size() const override { return boot_.local_size(); }
  const char* backend() const override { return "nccl"; }

  WorkPtr iall_reduce(void* buf, int64_t count, Dtype dt, ReduceOp op) override {
    check_collective(*this, "all_reduce", count, dt, true);
    CurrentDevice on(device_);  // NCCL's calls, the events, on the communicator's GPU
    after_device_work();
    HT_NCCL_CHECK(ncclAllReduce(buf, buf, static_cast<size_t>(count), nccl_type(dt), nccl_op(op),
                                comm_, stream_));
    return record("all_reduce");
  }
  WorkPtr ireduce_scatter(const void* send, void* recv, int64_t count, Dtype dt,
                          ReduceOp op) override {
    check_collective(*this, "reduce_scatter", count, dt, true);
    CurrentDevice on(device_);  // NCCL's calls, the events, on the communicator's GPU
    after_device_work();
    HT_NCCL_CHECK(ncclReduceScatter(send, recv, static_cast<size_t>(count), nccl_type(dt),
                                    nccl_op(op), comm_, stream_));
    return record("reduce_scatter");
  }
  WorkPtr iall_gather(const void* send, void* recv, int64_t count, Dtype dt) override {
    check_collective(*this, "all_gather", count, dt, false);
    CurrentDevice on(device_);  // NCCL's calls, the events, on the communicator's GPU
    after_device_work();
    HT_NCCL_CHECK(
        ncclAllGather(send, recv, static_cast<size_t>(count), nccl_type(dt), comm_, stream_));
    return record("all_gather");
  }
  WorkPtr iall_to_all(const void* send, void* recv, int64_t count, Dtype dt) override {
    check_collective(*this, "all_to_all", count, dt, false);
    CurrentDevice on(device_);  // NCCL's calls, the events, on the communicator's GPU
    after_device_work();
    // Grouped point-to-point: block r of send to rank r, rank r's block into recv's slot r.
    const size_t bytes = static_cast<size_t>(count) * dtype_size(dt);
    HT_NCCL_CHECK(ncclGroupStart());
    for (int r = 0; r < size(); ++r) {
      HT_NCCL_CHECK(ncclSend(static_cast<const char*>(send) + r * bytes, static_cast<size_t>(count),
                             nccl_type(dt), r, comm_, stream_));
      HT_NCCL_CHECK(ncclRecv(static_cast<char*>(recv) + r * bytes, static_cast<size_t>(count),
                             nccl_type(dt), r, comm_, stream_));
    }
    HT_NCCL_CHECK(ncclGroupEnd());
    return record("all_to_all");
  }
  WorkPtr ibroadcast(void* buf, int64_t count, Dtype dt, int root) override {
    check_collective(*this, "broadcast", count, dt, false, root);
    CurrentDevice on(device_);  // NCCL's calls, the events, on the communicator's GPU
    after_device_work();
    HT_NCCL_CHECK(
        ncclBroadcast(buf, buf, static_cast<size_t>(count), nccl_type(dt), root, comm_, stream_));
    return record("broadcast");
  }
  WorkPtr ibarrier() override {
    // NCCL has no barrier: an all-reduce of one value on the device.
    CurrentDevice on(device_);
    if (!barrier_buf_) HT_CUDA_CHECK(cudaMalloc(&barrier_buf_, sizeof(float)));
    HT_NCCL_CHECK(
        ncclAllReduce(barrier_buf_, barrier_buf_, 1, ncclFloat32, ncclSum, comm_, stream_));
    return record("barrier");
  }
  void abort_job(int code) override {
    ncclCommAbort(comm_);
    comm_ = nullptr;
    boot_.abort_job(code);
  }

  // ---- for NcclWork ----
  bool poll(cudaEvent_t ev, const std::string& name) {
    ncclResult_t async = ncclSuccess;
    HT_NCCL_CHECK(ncclCommGetAsyncError(comm_, &async));
    if (async != ncclSuccess && async != ncclInProgress)
      fail("[nccl] rank ", rank(), ": ", name, " failed: ", ncclGetErrorString(async));
    const cudaError_t e = cudaEventQuery(ev);
    if (e == cudaErrorNotReady) return false;
    HT_CUDA_CHECK(e);
    return true;
  }
  double timeout_s() const { return timeout_s_; }
  cudaStream_t compute_stream() const { return compute_; }
  [[noreturn]] void timed_out(const std::string& name, const CollectiveContext& ctx,
                              double waited) {
    const std::string step = ctx.step >= 0 ? "step " + std::to_string(ctx.step + 1) : "set-up";
    std::fprintf(stderr,
                 "[nccl] rank %d (GPU %d): %s: %s (%s) did not complete within --comm-timeout %g "
                 "s (waited %.1f s); aborting the NCCL communicator and the job.\n",
                 rank(), device_, step.c_str(), ctx.what.empty() ? name.c_str() : ctx.what.c_str(),
                 name.c_str(), timeout_s_, waited);
    abort_job(3);
    std::_Exit(3);
  }

 private:
  // NCCL's stream waits for the work queued so far on the GPU's compute stream (the kernels and
  // copies that wrote the buffers), without blocking the host.
  void after_device_work() {
    CurrentDevice on(device_);
    HT_CUDA_CHECK(cudaEventRecord(inputs_ready_, compute_));
    HT_CUDA_CHECK(cudaStreamWaitEvent(stream_, inputs_ready_, 0));
  }
  WorkPtr record(const char* name) {
    CurrentDevice on(device_);
    cudaEvent_t ev;
    HT_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    HT_CUDA_CHECK(cudaEventRecord(ev, stream_));
    return std::make_unique<NcclWork>(*this, ev, name, context_);
  }

  Communicator& boot_;
  double timeout_s_;
  int device_ = 0;
  cudaStream_t stream_ = nullptr;   // NCCL's
  cudaStream_t compute_ = nullptr;  // the CUDA backend's stream of device_ (not owned)
  cudaEvent_t inputs_ready_ = nullptr;
  ncclComm_t comm_ = nullptr;
  void* barrier_buf_ = nullptr;
};

NcclWork::~NcclWork() {
  if (!done_) (void)cudaStreamWaitEvent(c_.compute_stream(), ev_, 0);
  cudaEventDestroy(ev_);
}

bool NcclWork::test() {
  if (!done_) done_ = c_.poll(ev_, name_);
  return done_;
}

void NcclWork::wait() {
  const auto t0 = Clock::now();
  for (int spins = 0; !test(); ++spins) {
    if (spins > 200) std::this_thread::sleep_for(std::chrono::microseconds(20));
    const double waited = std::chrono::duration<double>(Clock::now() - t0).count();
    if (c_.timeout_s() > 0 && waited > c_.timeout_s()) c_.timed_out(name_, ctx_, waited);
  }
}

}  // namespace

bool nccl_available() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

std::string nccl_version() {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return "";
  // NCCL_VERSION(X, Y, Z) = X * 10000 + Y * 100 + Z since 2.9.
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." +
         std::to_string(v % 100);
}

std::unique_ptr<Communicator> make_nccl_communicator(Communicator& bootstrap,
                                                     const NcclOptions& opt) {
  return std::make_unique<NcclCommunicator>(bootstrap, opt);
}

void install_nccl_communicators() {
  set_device_communicator_maker(
      [](Device memory, Communicator& host, double timeout_s) -> std::unique_ptr<Communicator> {
        if (!nccl_available())
          fail("[nccl] collectives on ", memory.str(), "'s memory: this process sees no GPU");
        return make_nccl_communicator(host, {.timeout_s = timeout_s, .device = memory.index});
      });
}

}  // namespace hetrain::distributed
