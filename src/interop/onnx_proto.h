// Conversions between Hetrain tensors and ONNX protobuf messages (Debian's generated classes),
// shared by the exporter and the importer. Only src/interop includes this header.
#pragma once

#include <onnx/onnx_pb.h>

#include <string>

#include "hetrain/graph/tensor.h"

namespace hetrain::interop {

/// The most elements (and the largest dimension) a shape taken from an ONNX file may have:
/// 2^40, so that element counts and byte sizes computed from it cannot overflow int64.
inline constexpr int64_t kOnnxMaxElements = int64_t{1} << 40;
/// dims as a Shape after checking each is in [0, kOnnxMaxElements] and their product is too;
/// the error names `what` (a tensor, a node's input) and the dims as given.
Shape onnx_checked_shape(const std::vector<int64_t>& dims, const std::string& what);

/// TensorProto.DataType of a Hetrain dtype.
int onnx_elem_type(Dtype dt);
/// The Hetrain dtype that holds an ONNX element type: narrower integers widen to i32, uint32 to
/// i64. Throws naming `what` for types Hetrain cannot hold (strings, complex, uint64, fp8).
Dtype dtype_from_onnx(int elem_type, const std::string& what);
const char* onnx_type_name(int elem_type);

/// Fills proto with name, type, dims and the row-major bytes in raw_data.
void tensor_to_proto(const Tensor& t, const std::string& name, onnx::TensorProto* proto);
/// Reads a TensorProto: raw_data, the typed fields, or external data (location relative to
/// base_dir, offset, length). Errors name `what` (a file, an initializer).
Tensor tensor_from_proto(const onnx::TensorProto& proto, const std::string& base_dir,
                         const std::string& what);

/// Parses a serialized message of type M from path; a truncated or corrupt file is an error
/// naming it.
void parse_proto_file(const std::string& path, google::protobuf::MessageLite* msg,
                      const char* kind);

}  // namespace hetrain::interop
