// A checkpoint directory's index (checkpoint.json: step, generation, each part's file, size and
// CRC-32), read beside a valid part so that the checks past the index's syntax are reached.
// The seed corpus/checkpoint_index/valid is the index checkpoint::write makes for that part:
// HETRAIN_FUZZ_SEED_OUT=FILE fuzz_checkpoint_index -runs=0 copies it to FILE.
#include <cstdlib>
#include <filesystem>

#include "fuzz_common.h"
#include "hetrain/graph/ops.h"
#include "hetrain/training/checkpoint.h"

namespace ckpt = hetrain::training::checkpoint;

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const std::string dir = hetrain::fuzz::scratch_dir();
  ckpt::write(dir, 3, {{"model", {{"w", hetrain::full({2}, 1.5)}}, {{"step", "3"}}}});
  if (const char* out = std::getenv("HETRAIN_FUZZ_SEED_OUT"))
    std::filesystem::copy_file(dir + "/" + ckpt::kIndexFile, out,
                               std::filesystem::copy_options::overwrite_existing);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  hetrain::fuzz::write_input(data, size, ckpt::kIndexFile);
  hetrain::fuzz::expect_only_errors([&] { (void)ckpt::read(hetrain::fuzz::scratch_dir()); });
  return 0;
}
