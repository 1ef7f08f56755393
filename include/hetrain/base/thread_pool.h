// A thread pool whose waiting threads help: parallel_for's caller works on its own loop and,
// while it waits, runs other queued tasks, so kernels may nest inside graph-level tasks
// without deadlock.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace hetrain {

class ThreadPool {
 public:
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  /// Total threads that run work, the caller included.
  int size() const { return static_cast<int>(workers_.size()) + 1; }
  void submit(std::function<void()> task);
  /// Runs queued tasks until done() is true.
  void help_until(const std::function<bool()>& done);
  /// Calls fn(begin, end) over [0, n) in chunks of at least grain, in parallel.
  void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

 private:
  bool run_one();
  void worker_loop();

  std::vector<std::thread> workers_;
  std::deque<std::function<void()>> queue_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
};

/// Makes parallel_for run its whole range inline on this thread while in scope (a sim
/// device's dedicated worker runs its kernels on one thread).
class SerialScope {
 public:
  SerialScope();
  ~SerialScope();
  SerialScope(const SerialScope&) = delete;
  SerialScope& operator=(const SerialScope&) = delete;
  static bool active();

 private:
  bool prev_;
};

/// CPUs this process may run on: its affinity mask (what mpirun's binding or taskset left it),
/// at least 1.
int available_cpus();
/// The process-wide pool, sized to available_cpus() (or set_num_threads).
ThreadPool& thread_pool();
/// Resizes the process-wide pool; n <= 0 means available_cpus(). Throws Error above
/// max_threads().
void set_num_threads(int n);
int num_threads();
/// The most threads a pool may have: 4 per core, at least 64. More only thrash (10000 threads
/// nearly exhausted a machine's process table), so a larger request is an error, not a wait.
int max_threads();

/// parallel_for on the process-wide pool.
inline void parallel_for(int64_t n, int64_t grain,
                         const std::function<void(int64_t, int64_t)>& fn) {
  thread_pool().parallel_for(n, grain, fn);
}

}  // namespace hetrain
