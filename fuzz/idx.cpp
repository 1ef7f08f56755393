// IDX image sets (MNIST, Fashion-MNIST), raw or gzip: the first input byte splits the rest into
// an images file and a labels file.
#include "fuzz_common.h"
#include "hetrain/training/data.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const size_t split = std::min<size_t>(data[0] * 4, size - 1);
  const std::string images = hetrain::fuzz::write_input(data + 1, split, "images");
  const std::string labels = hetrain::fuzz::write_input(data + 1 + split, size - 1 - split, "labels");
  hetrain::fuzz::expect_only_errors([&] {
    auto ds = hetrain::data::load_idx(images, labels);
    if (ds->size() > 0) (void)ds->make_batch({0, ds->size() - 1});
  });
  return 0;
}
