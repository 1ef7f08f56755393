// safetensors files: the 8-byte header length, the JSON header (dtypes, shapes, offsets,
// metadata) and the data it describes.
#include "fuzz_common.h"
#include "hetrain/interop/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = hetrain::fuzz::write_input(data, size, "model.safetensors");
  hetrain::fuzz::expect_only_errors([&] {
    hetrain::safetensors::File f = hetrain::safetensors::load(path);
    for (auto& [name, t] : f.tensors) (void)t.numel();
  });
  return 0;
}
