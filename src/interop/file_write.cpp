#include "interop/file_write.h"

#include "hetrain/base/error.h"
#include "hetrain/base/file_output.h"
#include "hetrain/graph/ops.h"

namespace hetrain::interop {

void write_file_atomically(const std::string& path, const std::vector<std::string_view>& pieces,
                           const std::string& who) {
  // One mechanism for every output file (base/file_output.h): atomic replacement of a regular
  // file, write-through for devices and FIFOs, symlinks followed, directories refused.
  try {
    write_output_file(path, pieces, "file");
  } catch (const Error& e) {
    fail(who, " ", e.what());
  }
}

Array contiguous_host(const Array& in) {
  Array a = in;
  if (!a.contiguous() && a.numel() != 0) a = copy(make_leaf(a)).array();
  if (a.device().kind == DeviceKind::cuda) a = copy_to_device(a, Device::cpu());
  return a;
}

}  // namespace hetrain::interop
