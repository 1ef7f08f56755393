// Builds without NCCL: the NCCL entry points say why there is no GPU communicator.
#ifndef HETRAIN_HAVE_NCCL
#include "hetrain/base/error.h"
#include "hetrain/distributed/nccl.h"

namespace hetrain::distributed {

bool nccl_available() { return false; }
std::string nccl_version() { return ""; }
std::unique_ptr<Communicator> make_nccl_communicator(Communicator&, const NcclOptions&) {
  fail(
      "[nccl] this build has no NCCL (configure with the CUDA backend on and a CUDA toolkit "
      "that ships nccl.h and libnccl)");
}

}  // namespace hetrain::distributed
#endif
