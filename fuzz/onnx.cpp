// ONNX models (`hetrain run`, `hetrain train --onnx`): protobuf decoding, the checker, and the
// import of the graph's nodes, initializers and shapes.
#include "fuzz_common.h"
#include "hetrain/interop/onnx.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = hetrain::fuzz::write_input(data, size, "model.onnx");
  hetrain::fuzz::expect_only_errors([&] { (void)hetrain::interop::load_onnx(path); });
  return 0;
}
