// Tensors in and out of ONNX TensorProto messages and NumPy .npy files.
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "hetrain/base/error.h"
#include "hetrain/graph/ops.h"
#include "hetrain/interop/onnx.h"
#include "interop/file_write.h"
#include "interop/onnx_proto.h"

namespace hetrain::interop {

namespace {

using TP = onnx::TensorProto;

std::string read_whole_file(const std::string& path, const char* kind) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("[onnx] cannot open ", kind, " ", path, ": ", std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

/// A leaf of dtype and shape filled from `count` values of a typed repeated field.
template <class Src, class Field>
Tensor from_field(const Field& f, Dtype dt, const Shape& shape) {
  std::vector<Src> v(f.begin(), f.end());
  Tensor t = from_blob(v.data(), shape, dtype_of<Src>());
  return dt == dtype_of<Src>() ? t : cast(t, dt).eval().detach();
}

/// Raw little-endian bytes of elem_type widened into Hetrain's dtype.
Tensor from_raw(const char* p, size_t nbytes, int et, Dtype dt, const Shape& shape,
                const std::string& what) {
  const int64_t n = numel(shape);
  auto need = [&](size_t item) {
    if (nbytes != static_cast<size_t>(n) * item)
      fail("[onnx] ", what, ": ", nbytes, " bytes of data for ", n, " elements of ",
           onnx_type_name(et), " (", static_cast<size_t>(n) * item, " expected)");
  };
  auto widen = [&](auto tag) {
    using S = decltype(tag);
    need(sizeof(S));
    std::vector<S> src(static_cast<size_t>(n));
    if (n) std::memcpy(src.data(), p, nbytes);
    std::vector<int64_t> v(src.begin(), src.end());
    Tensor t = from_blob(v.data(), shape, Dtype::i64);
    return dt == Dtype::i64 ? t : cast(t, dt).eval().detach();
  };
  switch (et) {
    case TP::INT8:
      return widen(int8_t{});
    case TP::UINT8:
      return widen(uint8_t{});
    case TP::INT16:
      return widen(int16_t{});
    case TP::UINT16:
      return widen(uint16_t{});
    case TP::UINT32:
      return widen(uint32_t{});
    default:
      break;
  }
  need(dtype_size(dt));
  return from_blob(p, shape, dt);
}

}  // namespace

Shape onnx_checked_shape(const std::vector<int64_t>& dims, const std::string& what) {
  auto dims_str = [&] {
    std::string out = "(";
    for (size_t i = 0; i < dims.size(); ++i) out += (i ? ", " : "") + std::to_string(dims[i]);
    return out + ")";
  };
  int64_t n = 1;
  for (int64_t d : dims) {
    if (d < 0 || d > kOnnxMaxElements)
      fail(what, ": dimension ", d, " in ", dims_str(), " is outside [0, 2^40]");
    if (d != 0 && n > kOnnxMaxElements / d)
      fail(what, ": shape ", dims_str(), " has more than 2^40 elements");
    n *= d;
  }
  return Shape(dims.begin(), dims.end());
}

int onnx_elem_type(Dtype dt) {
  switch (dt) {
    case Dtype::f64:
      return TP::DOUBLE;
    case Dtype::f32:
      return TP::FLOAT;
    case Dtype::f16:
      return TP::FLOAT16;
    case Dtype::bf16:
      return TP::BFLOAT16;
    case Dtype::i32:
      return TP::INT32;
    case Dtype::i64:
      return TP::INT64;
    case Dtype::boolean:
      return TP::BOOL;
  }
  return TP::UNDEFINED;
}

const char* onnx_type_name(int et) {
  if (TP::DataType_IsValid(et)) return TP::DataType_Name(static_cast<TP::DataType>(et)).c_str();
  return "an unknown element type";
}

Dtype dtype_from_onnx(int et, const std::string& what) {
  switch (et) {
    case TP::DOUBLE:
      return Dtype::f64;
    case TP::FLOAT:
      return Dtype::f32;
    case TP::FLOAT16:
      return Dtype::f16;
    case TP::BFLOAT16:
      return Dtype::bf16;
    case TP::INT8:
    case TP::UINT8:
    case TP::INT16:
    case TP::UINT16:
    case TP::INT32:
      return Dtype::i32;
    case TP::UINT32:
    case TP::INT64:
      return Dtype::i64;
    case TP::BOOL:
      return Dtype::boolean;
    default:
      break;
  }
  fail("[onnx] ", what, ": element type ", onnx_type_name(et), " (", et,
       ") is not supported (float, double, float16, bfloat16, bool and integers up to int64)");
}

void tensor_to_proto(const Tensor& t, const std::string& name, onnx::TensorProto* proto) {
  proto->set_name(name);
  proto->set_data_type(onnx_elem_type(t.dtype()));
  for (int64_t d : t.shape()) proto->add_dims(d);
  Array a = contiguous_host(t.eval().array());
  proto->set_raw_data(std::string(static_cast<const char*>(a.raw()), a.nbytes()));
}

Tensor tensor_from_proto(const onnx::TensorProto& p, const std::string& base_dir,
                         const std::string& what) {
  const int et = p.data_type();
  const Dtype dt = dtype_from_onnx(et, what);
  const Shape shape = onnx_checked_shape({p.dims().begin(), p.dims().end()}, "[onnx] " + what);
  const int64_t n = numel(shape);
  if (p.data_location() == TP::EXTERNAL) {
    std::string location;
    int64_t offset = 0, length = -1;
    auto number = [&](const std::string& key, const std::string& v) {
      // A byte count: digits only, at most 2^40 * 8 (what a checked shape of 8-byte items holds).
      if (v.empty() || v.size() > 15 || v.find_first_not_of("0123456789") != std::string::npos)
        fail("[onnx] ", what, ": external data '", key, "' is '", v,
             "', not a byte count below 10^15");
      return std::stoll(v);
    };
    for (const auto& kv : p.external_data()) {
      if (kv.key() == "location")
        location = kv.value();
      else if (kv.key() == "offset")
        offset = number(kv.key(), kv.value());
      else if (kv.key() == "length")
        length = number(kv.key(), kv.value());
    }
    if (location.empty()) fail("[onnx] ", what, ": external data without a 'location'");
    namespace fs = std::filesystem;
    fs::path file = fs::path(base_dir) / location;
    std::ifstream in(file, std::ios::binary);
    if (!in)
      fail("[onnx] ", what, ": external data file ", file.string(),
           " cannot be opened: ", std::strerror(errno));
    const int64_t item = static_cast<int64_t>(dtype_size(dtype_from_onnx(et, what)));
    const int64_t want = length >= 0 ? length : n * item;
    in.seekg(0, std::ios::end);
    const int64_t size = static_cast<int64_t>(in.tellg());
    if (want > size || offset > size - want)
      fail("[onnx] ", what, ": external data ", file.string(), " has ", size,
           " bytes, but the tensor needs bytes [", offset, ", ", offset + want, ")");
    std::string buf(static_cast<size_t>(want), '\0');
    in.seekg(offset);
    in.read(buf.data(), want);
    return from_raw(buf.data(), buf.size(), et, dt, shape, what);
  }
  if (p.has_raw_data())
    return from_raw(p.raw_data().data(), p.raw_data().size(), et, dt, shape, what);
  auto check_count = [&](int64_t got) {
    if (got != n)
      fail("[onnx] ", what, ": ", got, " values stored for shape ", shape_str(shape), " (", n,
           " elements)");
  };
  switch (et) {
    case TP::FLOAT:
      check_count(p.float_data_size());
      return from_field<float>(p.float_data(), dt, shape);
    case TP::DOUBLE:
      check_count(p.double_data_size());
      return from_field<double>(p.double_data(), dt, shape);
    case TP::INT64:
      check_count(p.int64_data_size());
      return from_field<int64_t>(p.int64_data(), dt, shape);
    case TP::UINT32:
      check_count(p.uint64_data_size());
      return from_field<int64_t>(p.uint64_data(), dt, shape);
    case TP::FLOAT16:
    case TP::BFLOAT16: {
      check_count(p.int32_data_size());
      std::vector<uint16_t> bits(p.int32_data().begin(), p.int32_data().end());
      return from_blob(bits.data(), shape, dt);
    }
    case TP::BOOL: {
      check_count(p.int32_data_size());
      std::vector<uint8_t> v(p.int32_data().begin(), p.int32_data().end());
      for (auto& b : v) b = b != 0;
      return from_blob(v.data(), shape, Dtype::boolean);
    }
    default:
      check_count(p.int32_data_size());
      return from_field<int32_t>(p.int32_data(), dt, shape);
  }
}

void parse_proto_file(const std::string& path, google::protobuf::MessageLite* msg,
                      const char* kind) {
  std::string bytes = read_whole_file(path, kind);
  if (!msg->ParseFromString(bytes))
    fail("[onnx] ", path, ": not a valid ", kind, " (truncated or corrupt protobuf, ", bytes.size(),
         " bytes)");
}

// ---- .npy -----------------------------------------------------------------------------------

namespace {

const char* npy_descr(Dtype dt) {
  switch (dt) {
    case Dtype::f64:
      return "<f8";
    case Dtype::f32:
      return "<f4";
    case Dtype::f16:
      return "<f2";
    case Dtype::i32:
      return "<i4";
    case Dtype::i64:
      return "<i8";
    case Dtype::boolean:
      return "|b1";
    case Dtype::bf16:
      break;
  }
  fail("[npy] bfloat16 has no NumPy dtype; cast the tensor first");
}

/// The value of `key` in a .npy header dict ("{'descr': '<f4', 'fortran_order': False, ...}").
std::string npy_field(const std::string& h, const std::string& key, const std::string& path) {
  size_t k = h.find("'" + key + "'");
  if (k == std::string::npos) fail("[npy] ", path, ": header lacks '", key, "'");
  size_t c = h.find(':', k);
  size_t b = h.find_first_not_of(' ', c + 1);
  if (h[b] == '(') return h.substr(b + 1, h.find(')', b) - b - 1);
  if (h[b] == '\'') return h.substr(b + 1, h.find('\'', b + 1) - b - 1);
  return h.substr(b, h.find_first_of(",}", b) - b);
}

Tensor read_npy(const std::string& path) {
  std::string s = read_whole_file(path, "NumPy file");
  if (s.size() < 10 || s.compare(0, 6, "\x93NUMPY") != 0)
    fail("[npy] ", path, ": not a .npy file (magic \\x93NUMPY missing)");
  const int major = static_cast<unsigned char>(s[6]);
  size_t hlen, hstart;
  if (major == 1) {
    hlen = static_cast<unsigned char>(s[8]) | static_cast<size_t>(static_cast<unsigned char>(s[9]))
                                                  << 8;
    hstart = 10;
  } else {
    if (s.size() < 12) fail("[npy] ", path, ": truncated header");
    hlen = 0;
    for (int i = 0; i < 4; ++i)
      hlen |= static_cast<size_t>(static_cast<unsigned char>(s[8 + i])) << (8 * i);
    hstart = 12;
  }
  if (hstart + hlen > s.size()) fail("[npy] ", path, ": truncated header");
  std::string h = s.substr(hstart, hlen);
  std::string descr = npy_field(h, "descr", path);
  if (npy_field(h, "fortran_order", path) != "False")
    fail("[npy] ", path, ": Fortran-order arrays are not supported");
  Dtype dt;
  if (descr == "<f8")
    dt = Dtype::f64;
  else if (descr == "<f4")
    dt = Dtype::f32;
  else if (descr == "<f2")
    dt = Dtype::f16;
  else if (descr == "<i4")
    dt = Dtype::i32;
  else if (descr == "<i8")
    dt = Dtype::i64;
  else if (descr == "|b1")
    dt = Dtype::boolean;
  else
    fail("[npy] ", path, ": dtype '", descr, "' is not supported (<f8 <f4 <f2 <i4 <i8 |b1)");
  std::vector<int64_t> dims;
  std::stringstream shape_text(npy_field(h, "shape", path));
  for (std::string d; std::getline(shape_text, d, ',');) {
    const size_t b = d.find_first_not_of(' '), e = d.find_last_not_of(' ');
    if (b == std::string::npos) continue;
    const std::string digits = d.substr(b, e - b + 1);
    if (digits.size() > 15 || digits.find_first_not_of("0123456789") != std::string::npos)
      fail("[npy] ", path, ": shape entry '", digits, "' is not a dimension below 10^15");
    dims.push_back(std::stoll(digits));
  }
  const Shape shape = onnx_checked_shape(dims, "[npy] " + path);
  const size_t want = static_cast<size_t>(numel(shape)) * dtype_size(dt);
  const size_t data = hstart + hlen;
  if (s.size() - data != want)
    fail("[npy] ", path, ": ", s.size() - data, " bytes of data for shape ", shape_str(shape),
         " of ", descr, " (", want, " expected)");
  return from_blob(s.data() + data, shape, dt);
}

}  // namespace

Tensor read_tensor_file(const std::string& path) {
  std::string ext = std::filesystem::path(path).extension().string();
  if (ext == ".npy") return read_npy(path);
  if (ext != ".pb") fail("[onnx] ", path, ": expected a .pb (TensorProto) or .npy file");
  onnx::TensorProto p;
  parse_proto_file(path, &p, "TensorProto");
  return tensor_from_proto(p, std::filesystem::path(path).parent_path().string(), path);
}

void write_npy(const std::string& path, const Tensor& t) {
  std::string h =
      std::string("{'descr': '") + npy_descr(t.dtype()) + "', 'fortran_order': False, 'shape': (";
  for (size_t i = 0; i < t.shape().size(); ++i) h += (i ? ", " : "") + std::to_string(t.shape()[i]);
  h += t.ndim() == 1 ? ",)" : ")";
  h += ", }";
  size_t total = 10 + h.size() + 1;
  h.append((64 - total % 64) % 64, ' ');
  h += '\n';
  std::string pre = "\x93NUMPY";
  pre += '\x01';
  pre += '\x00';
  pre += static_cast<char>(h.size() & 0xff);
  pre += static_cast<char>((h.size() >> 8) & 0xff);
  Array a = contiguous_host(t.eval().array());
  write_file_atomically(path, {pre, h, {static_cast<const char*>(a.raw()), a.nbytes()}}, "[npy]");
}

void write_tensor_pb(const std::string& path, const Tensor& t, const std::string& name) {
  onnx::TensorProto p;
  tensor_to_proto(t, name, &p);
  std::string bytes = p.SerializeAsString();
  write_file_atomically(path, {bytes}, "[onnx]");
}

}  // namespace hetrain::interop
