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

void install_nccl_communicators() {
  set_device_communicator_maker(
      [](Device memory, Communicator&, double) -> std::unique_ptr<Communicator> {
        fail("[nccl] collectives on ", memory.str(),
             "'s memory (ZeRO with a GPU --state-device) need NCCL, and this build has none: "
             "configure with the CUDA backend on and a CUDA toolkit that ships nccl.h and libnccl, "
             "or give --state-device cpu or sim:N");
      });
}

}  // namespace hetrain::distributed
#endif
