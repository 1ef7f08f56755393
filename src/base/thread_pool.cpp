#include "hetrain/base/thread_pool.h"

#include <sched.h>

#include <algorithm>
#include <exception>
#include <memory>

#include "hetrain/base/error.h"

namespace hetrain {

namespace {
thread_local bool g_serial = false;
}
SerialScope::SerialScope() : prev_(g_serial) { g_serial = true; }
SerialScope::~SerialScope() { g_serial = prev_; }
bool SerialScope::active() { return g_serial; }

ThreadPool::ThreadPool(int threads) {
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& w : workers_) w.join();
}

void ThreadPool::submit(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    queue_.push_back(std::move(task));
  }
  cv_.notify_one();
}

bool ThreadPool::run_one() {
  std::function<void()> task;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (queue_.empty()) return false;
    task = std::move(queue_.front());
    queue_.pop_front();
  }
  task();
  return true;
}

void ThreadPool::help_until(const std::function<bool()>& done) {
  while (!done()) {
    if (!run_one()) std::this_thread::yield();
  }
}

void ThreadPool::worker_loop() {
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [this] { return stop_ || !queue_.empty(); });
      if (stop_ && queue_.empty()) return;
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();
  }
}

void ThreadPool::parallel_for(int64_t n, int64_t grain,
                              const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  int64_t chunks = std::min<int64_t>((n + grain - 1) / grain, size() * 4);
  if (chunks <= 1 || size() == 1) {
    fn(0, n);
    return;
  }
  const int64_t per = (n + chunks - 1) / chunks;
  if (g_serial) {
    // The same chunks as a parallel run, one after another: results that depend on the
    // split (partial sums) come out bit for bit the same.
    for (int64_t b = 0; b < n; b += per) fn(b, std::min(n, b + per));
    return;
  }
  // Shared state outlives this frame only through helper tasks that find no chunk left.
  struct State {
    std::atomic<int64_t> next{0};
    std::atomic<int64_t> done{0};
    std::mutex mu;
    std::exception_ptr error;  // the first exception a chunk threw, rethrown by the caller
  };
  auto st = std::make_shared<State>();
  auto work = [st, per, n, chunks, &fn] {
    for (;;) {
      int64_t c = st->next.fetch_add(1);
      if (c >= chunks) return;
      int64_t b = c * per, e = std::min(n, b + per);
      try {
        if (b < e) fn(b, e);
      } catch (...) {
        std::lock_guard<std::mutex> lk(st->mu);
        if (!st->error) st->error = std::current_exception();
      }
      st->done.fetch_add(1);
    }
  };
  int helpers = static_cast<int>(std::min<int64_t>(chunks - 1, size() - 1));
  for (int i = 0; i < helpers; ++i) {
    // A helper that starts after all chunks are taken returns without touching fn.
    submit(work);
  }
  work();
  help_until([&] { return st->done.load() >= chunks; });
  if (st->error) std::rethrow_exception(st->error);
}

namespace {
std::unique_ptr<ThreadPool>& pool_slot() {
  static std::unique_ptr<ThreadPool> p;
  return p;
}
}  // namespace

int available_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  const unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : static_cast<int>(n);
}

namespace {
int default_threads() { return available_cpus(); }
}  // namespace

ThreadPool& thread_pool() {
  auto& p = pool_slot();
  if (!p) p = std::make_unique<ThreadPool>(default_threads());
  return *p;
}

int max_threads() { return std::max(64, 4 * default_threads()); }

void set_num_threads(int n) {
  if (n <= 0) n = default_threads();
  if (n > max_threads())
    fail("[threads] ", n, " threads requested; at most ", max_threads(),
         " (4 per core, at least 64) are allowed");
  auto& p = pool_slot();
  if (p && p->size() == n) return;
  p = std::make_unique<ThreadPool>(n);
}

int num_threads() { return thread_pool().size(); }

}  // namespace hetrain
