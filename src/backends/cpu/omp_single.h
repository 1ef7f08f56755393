// oneDNN runs its kernels on OpenMP teams. Inside Hetrain's pool, which may already be running
// other nodes side by side, a team of more than one thread per call spins at its barriers against
// the pool's threads; so oneDNN calls run single-threaded, on blocks the pool spreads over its
// threads (conv_dnnl.cpp's batch chunks, gemm_blocks' row or column blocks).
#pragma once

#include <omp.h>

namespace hetrain::cpu {

/// OpenMP's team size at one for the current scope on the calling thread (the setting is per
/// thread). oneDNN fixes a kernel's thread count when it builds it: build under this too.
class SingleOmpThread {
 public:
  SingleOmpThread() : saved_(omp_get_max_threads()) {
    if (saved_ != 1) omp_set_num_threads(1);
  }
  ~SingleOmpThread() {
    if (saved_ != 1) omp_set_num_threads(saved_);
  }
  SingleOmpThread(const SingleOmpThread&) = delete;
  SingleOmpThread& operator=(const SingleOmpThread&) = delete;

 private:
  int saved_;
};

}  // namespace hetrain::cpu
