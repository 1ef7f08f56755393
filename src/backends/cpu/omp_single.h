// oneDNN runs its kernels on OpenMP teams. Where a kernel splits its work into blocks itself
// (conv_dnnl.cpp's batch chunks, gemm_blocks' row or column blocks), the blocks run on the pool's
// team and each oneDNN call inside a block runs on its thread alone.
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
