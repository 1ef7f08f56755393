// The MPI communicator: MPI-3 non-blocking collectives on a duplicate of MPI_COMM_WORLD, and a
// watchdog in every wait. Each collective is announced to the other ranks on a second
// duplicate (one small message per peer), so a rank whose wait times out knows which ranks
// never reached the collective it waits for and says so before MPI_Abort ends the job.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "hetrain/base/error.h"
#include "hetrain/distributed/mpi.h"
#include "hetrain/distributed/nccl.h"

namespace hetrain::distributed {

namespace {

#define HT_MPI_CHECK(call)                                                                        \
  do {                                                                                            \
    const int rc_ = (call);                                                                       \
    if (rc_ != MPI_SUCCESS) {                                                                     \
      char msg_[MPI_MAX_ERROR_STRING];                                                            \
      int len_ = 0;                                                                               \
      MPI_Error_string(rc_, msg_, &len_);                                                         \
      ::hetrain::fail("[mpi] ", #call, " failed: ", std::string(msg_, static_cast<size_t>(len_)), \
                      " at ", __FILE__, ":", __LINE__);                                           \
    }                                                                                             \
  } while (0)

using Clock = std::chrono::steady_clock;
constexpr int kArrivalTag = 7;

MPI_Datatype mpi_type(Dtype dt, bool reduces, const char* op) {
  switch (dt) {
    case Dtype::f32:
      return MPI_FLOAT;
    case Dtype::f64:
      return MPI_DOUBLE;
    case Dtype::i32:
      return MPI_INT32_T;
    case Dtype::i64:
      return MPI_INT64_T;
    case Dtype::f16:
    case Dtype::bf16:
      if (reduces) fail("[mpi ", op, "] MPI cannot reduce ", dtype_name(dt), "; use f32");
      return MPI_UINT16_T;
    case Dtype::boolean:
      return MPI_UINT8_T;
  }
  return MPI_BYTE;
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return MPI_SUM;
    case ReduceOp::max:
      return MPI_MAX;
    case ReduceOp::min:
      return MPI_MIN;
  }
  return MPI_SUM;
}

int as_int(int64_t count, const char* op) {
  if (count > INT_MAX) fail("[mpi ", op, "] ", count, " elements exceed MPI's int count");
  return static_cast<int>(count);
}

bool g_mpi_live = false;  // one communicator owns MPI at a time

class MpiCommunicator;

class MpiWork final : public Work {
 public:
  MpiWork(MpiCommunicator& c, MPI_Request r, int64_t seq, std::string name, CollectiveContext ctx)
      : c_(c), req_(r), seq_(seq), name_(std::move(name)), ctx_(std::move(ctx)) {}
  bool test() override;
  void wait() override;

 private:
  MpiCommunicator& c_;
  MPI_Request req_;
  int64_t seq_;
  std::string name_;
  CollectiveContext ctx_;
  bool done_ = false;
};

class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(const MpiOptions& opt) : timeout_s_(opt.timeout_s) {
    int inited = 0;
    HT_MPI_CHECK(MPI_Initialized(&inited));
    if (!inited) {
      int provided = 0;
      // A communication thread (HETRAIN_DDP_PROGRESS=thread) tests requests while the main
      // thread may start others: MPI_THREAD_MULTIPLE; otherwise one thread at a time.
      const bool comm_thread = progress_mode_from_env() == ProgressMode::thread;
      const int want = comm_thread ? MPI_THREAD_MULTIPLE : MPI_THREAD_SERIALIZED;
      HT_MPI_CHECK(MPI_Init_thread(nullptr, nullptr, want, &provided));
      if (provided < want)
        fail("[mpi] HETRAIN_DDP_PROGRESS=thread needs MPI_THREAD_MULTIPLE; this MPI gives ",
             provided == MPI_THREAD_SERIALIZED ? "MPI_THREAD_SERIALIZED" : "less");
      owns_mpi_ = true;
    }
    HT_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &comm_));
    HT_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &watch_));
    HT_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
    HT_MPI_CHECK(MPI_Comm_size(comm_, &size_));
    MPI_Comm local;
    HT_MPI_CHECK(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &local));
    HT_MPI_CHECK(MPI_Comm_rank(local, &local_rank_));
    HT_MPI_CHECK(MPI_Comm_size(local, &local_size_));
    HT_MPI_CHECK(MPI_Comm_free(&local));
    arrived_.assign(static_cast<size_t>(size_), 0);
    g_mpi_live = true;
  }
  ~MpiCommunicator() override {
    try {
      barrier();  // no rank finalises while another still sends to it
    } catch (...) {
    }
    for (Announcement& a : announced_)
      MPI_Waitall(static_cast<int>(a.reqs.size()), a.reqs.data(), MPI_STATUSES_IGNORE);
    drain_arrivals();
    MPI_Comm_free(&watch_);
    MPI_Comm_free(&comm_);
    if (owns_mpi_) MPI_Finalize();
    g_mpi_live = false;
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_rank() const override { return local_rank_; }
  int local_size() const override { return local_size_; }
  const char* backend() const override { return "mpi"; }

  WorkPtr iall_reduce(void* buf, int64_t count, Dtype dt, ReduceOp op) override {
    check_collective(*this, "all_reduce", count, dt, true);
    const MPI_Datatype t = mpi_type(dt, true, "all_reduce");
    return start("all_reduce", [&](MPI_Request* r) {
      return MPI_Iallreduce(MPI_IN_PLACE, buf, as_int(count, "all_reduce"), t, mpi_op(op), comm_,
                            r);
    });
  }
  WorkPtr ireduce_scatter(const void* send, void* recv, int64_t count, Dtype dt,
                          ReduceOp op) override {
    check_collective(*this, "reduce_scatter", count, dt, true);
    const MPI_Datatype t = mpi_type(dt, true, "reduce_scatter");
    return start("reduce_scatter", [&](MPI_Request* r) {
      return MPI_Ireduce_scatter_block(send, recv, as_int(count, "reduce_scatter"), t, mpi_op(op),
                                       comm_, r);
    });
  }
  WorkPtr iall_gather(const void* send, void* recv, int64_t count, Dtype dt) override {
    check_collective(*this, "all_gather", count, dt, false);
    const MPI_Datatype t = mpi_type(dt, false, "all_gather");
    const int n = as_int(count, "all_gather");
    return start("all_gather",
                 [&](MPI_Request* r) { return MPI_Iallgather(send, n, t, recv, n, t, comm_, r); });
  }
  WorkPtr iall_to_all(const void* send, void* recv, int64_t count, Dtype dt) override {
    check_collective(*this, "all_to_all", count, dt, false);
    const MPI_Datatype t = mpi_type(dt, false, "all_to_all");
    const int n = as_int(count, "all_to_all");
    return start("all_to_all",
                 [&](MPI_Request* r) { return MPI_Ialltoall(send, n, t, recv, n, t, comm_, r); });
  }
  WorkPtr ibroadcast(void* buf, int64_t count, Dtype dt, int root) override {
    check_collective(*this, "broadcast", count, dt, false, root);
    const MPI_Datatype t = mpi_type(dt, false, "broadcast");
    return start("broadcast", [&](MPI_Request* r) {
      return MPI_Ibcast(buf, as_int(count, "broadcast"), t, root, comm_, r);
    });
  }
  void abort_job(int code) override {
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, code);
  }
  WorkPtr ibarrier() override {
    return start("barrier", [&](MPI_Request* r) { return MPI_Ibarrier(comm_, r); });
  }

  // ---- for MpiWork ----
  bool test_request(MPI_Request* r) {
    std::lock_guard lock(mu_);
    int flag = 0;
    HT_MPI_CHECK(MPI_Test(r, &flag, MPI_STATUS_IGNORE));
    drain_arrivals();
    return flag != 0;
  }
  double timeout_s() const { return timeout_s_; }
  [[noreturn]] void abort_job(int64_t seq, const std::string& name, const CollectiveContext& ctx,
                              double waited) {
    std::string missing;
    {
      std::lock_guard lock(mu_);
      drain_arrivals();
      for (int r = 0; r < size_; ++r)
        if (r != rank_ && arrived_[static_cast<size_t>(r)] < seq)
          missing += (missing.empty() ? "" : ", ") + std::to_string(r);
    }
    const std::string step = ctx.step >= 0 ? "step " + std::to_string(ctx.step + 1) : "set-up";
    std::fprintf(stderr,
                 "[mpi] rank %d: %s: %s (%s, collective #%lld) did not complete within "
                 "--comm-timeout %g s (waited %.1f s); %s. Aborting the job.\n",
                 rank_, step.c_str(), ctx.what.empty() ? name.c_str() : ctx.what.c_str(),
                 name.c_str(), static_cast<long long>(seq), timeout_s_, waited,
                 missing.empty() ? "every rank reached it (the transport stalled)"
                                 : ("rank(s) " + missing + " never reached it").c_str());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 3);
    std::_Exit(3);  // MPI_Abort does not return; this keeps the promise to the compiler
  }

 private:
  struct Announcement {
    std::unique_ptr<int64_t> value;
    std::vector<MPI_Request> reqs;
  };

  template <class F>
  WorkPtr start(const char* name, F&& issue) {
    std::lock_guard lock(mu_);
    const int64_t seq = ++seq_;
    announce(seq);
    MPI_Request r = MPI_REQUEST_NULL;
    const int rc = issue(&r);
    if (rc != MPI_SUCCESS) {
      char msg[MPI_MAX_ERROR_STRING];
      int len = 0;
      MPI_Error_string(rc, msg, &len);
      fail("[mpi ", name, "] failed: ", std::string(msg, static_cast<size_t>(len)));
    }
    return std::make_unique<MpiWork>(*this, r, seq, name, context_);
  }

  // Tells every other rank that this rank reached collective `seq`.
  void announce(int64_t seq) {
    while (!announced_.empty()) {  // retire completed announcements
      int flag = 0;
      Announcement& a = announced_.front();
      HT_MPI_CHECK(
          MPI_Testall(static_cast<int>(a.reqs.size()), a.reqs.data(), &flag, MPI_STATUSES_IGNORE));
      if (!flag) break;
      announced_.pop_front();
    }
    if (size_ == 1) return;
    Announcement a{std::make_unique<int64_t>(seq), {}};
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      a.reqs.emplace_back();
      HT_MPI_CHECK(
          MPI_Isend(a.value.get(), 1, MPI_INT64_T, r, kArrivalTag, watch_, &a.reqs.back()));
    }
    announced_.push_back(std::move(a));
  }
  void drain_arrivals() {
    while (true) {
      int flag = 0;
      MPI_Status st;
      HT_MPI_CHECK(MPI_Iprobe(MPI_ANY_SOURCE, kArrivalTag, watch_, &flag, &st));
      if (!flag) return;
      int64_t v = 0;
      HT_MPI_CHECK(
          MPI_Recv(&v, 1, MPI_INT64_T, st.MPI_SOURCE, kArrivalTag, watch_, MPI_STATUS_IGNORE));
      int64_t& a = arrived_[static_cast<size_t>(st.MPI_SOURCE)];
      a = std::max(a, v);
    }
  }

  double timeout_s_;
  bool owns_mpi_ = false;
  MPI_Comm comm_ = MPI_COMM_NULL, watch_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1;
  std::mutex mu_;
  int64_t seq_ = 0;
  std::vector<int64_t> arrived_;
  std::deque<Announcement> announced_;
};

bool MpiWork::test() {
  if (!done_) done_ = c_.test_request(&req_);
  return done_;
}

void MpiWork::wait() {
  const auto t0 = Clock::now();
  for (int spins = 0; !test(); ++spins) {
    // Poll quickly at first, then yield the core: ranks may share cores.
    if (spins > 200) std::this_thread::sleep_for(std::chrono::microseconds(50));
    if ((spins & 63) == 0 && c_.timeout_s() > 0) {
      const double waited = std::chrono::duration<double>(Clock::now() - t0).count();
      if (waited > c_.timeout_s()) c_.abort_job(seq_, name_, ctx_, waited);
    }
  }
}

}  // namespace

bool launched_by_mpi() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE", "PMI_RANK"})
    if (std::getenv(v)) return true;
  return false;
}

std::unique_ptr<Communicator> make_mpi_communicator(const MpiOptions& opt) {
  if (g_mpi_live) fail("[mpi] an MPI communicator already exists in this process");
  return std::make_unique<MpiCommunicator>(opt);
}

std::unique_ptr<Communicator> make_world_communicator(const MpiOptions& opt) {
  install_nccl_communicators();  // ZeRO's collectives on GPU memory
  if (launched_by_mpi()) return make_mpi_communicator(opt);
  return make_local_communicator();
}

std::string mpi_library_version() {
  int inited = 0;
  MPI_Initialized(&inited);
  if (!inited) return "";
  char v[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  MPI_Get_library_version(v, &len);
  std::string s(v, static_cast<size_t>(len));
  const auto nl = s.find_first_of("\n,");
  return nl == std::string::npos ? s : s.substr(0, nl);
}

std::string mpi_thread_level() {
  int inited = 0;
  MPI_Initialized(&inited);
  if (!inited) return "";
  int level = 0;
  MPI_Query_thread(&level);
  switch (level) {
    case MPI_THREAD_SINGLE:
      return "single";
    case MPI_THREAD_FUNNELED:
      return "funneled";
    case MPI_THREAD_SERIALIZED:
      return "serialized";
    default:
      return "multiple";
  }
}

std::string mpi_processor_name() {
  int inited = 0;
  MPI_Initialized(&inited);
  if (!inited) return "";
  char name[MPI_MAX_PROCESSOR_NAME];
  int len = 0;
  MPI_Get_processor_name(name, &len);
  return std::string(name, static_cast<size_t>(len));
}

}  // namespace hetrain::distributed
