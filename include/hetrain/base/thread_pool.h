// The process's CPU threads: parallel_for runs its chunks on an OpenMP team, the same team
// oneDNN runs its kernels on. With a pool of its own beside OpenMP's, the two sets of threads
// took turns on the same cores: each spins a while after its work, and a barrier of one waited
// for a thread the other had displaced (oneDNN's bf16 matmuls ran 2x slower inside a training
// step than alone, on a 2-vCPU AMX Xeon). Graph nodes run one at a time on the CPU, each with
// the whole team (runtime/executor.cpp).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>

namespace hetrain {

class ThreadPool {
 public:
  explicit ThreadPool(int threads);
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  /// Threads of the team, the caller included.
  int size() const { return threads_.load(std::memory_order_relaxed); }
  /// A new team size, for the parallel_for calls that start after this one (a call in flight
  /// on another thread keeps the size it started with); also the calling thread's OpenMP team
  /// size, which its oneDNN calls use.
  void resize(int threads);
  /// Calls fn(begin, end) over [0, n) in chunks of at least grain, in parallel. The chunks
  /// depend on n, grain and size() only, never on which thread takes one, so results that
  /// depend on the split (partial sums) are the same bits on every run. Called from inside a
  /// chunk (a kernel nested in a kernel), or under a SerialScope, the same chunks run one
  /// after another on the calling thread. The first exception a chunk throws reaches the
  /// caller once every chunk has run.
  void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

 private:
  std::atomic<int> threads_;
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
/// Resizes the process-wide pool (in place: a parallel_for in flight on another thread is not
/// disturbed); n <= 0 means available_cpus(). Also sets the calling thread's OpenMP team size,
/// which oneDNN's calls from that thread use. Throws Error above max_threads().
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
