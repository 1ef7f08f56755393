// safetensors reader and writer. The writer goes through write_output_file (a temporary file and
// rename) so a crash or full disk never leaves a checkpoint half-written; the reader checks every
// field before it creates a single tensor.
#include "hetrain/interop/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "hetrain/base/error.h"
#include "hetrain/base/file_output.h"
#include "hetrain/graph/ops.h"
#include "interop/file_write.h"

namespace hetrain::safetensors {

namespace {

using nlohmann::json;

constexpr uint64_t kMaxHeader = uint64_t{100} << 20;  // the reference implementation's limit

std::string errno_str() { return std::strerror(errno); }

/// zlib's crc32 over any length (its length argument is 32-bit).
uLong crc32_of(uLong crc, const char* p, size_t n) {
  while (n > 0) {
    const uInt chunk = static_cast<uInt>(std::min<size_t>(n, uInt{1} << 30));
    crc = ::crc32(crc, reinterpret_cast<const Bytef*>(p), chunk);
    p += chunk;
    n -= chunk;
  }
  return crc;
}

}  // namespace

const char* dtype_to_name(Dtype dt) {
  switch (dt) {
    case Dtype::f64:
      return "F64";
    case Dtype::f32:
      return "F32";
    case Dtype::f16:
      return "F16";
    case Dtype::bf16:
      return "BF16";
    case Dtype::i32:
      return "I32";
    case Dtype::i64:
      return "I64";
    case Dtype::boolean:
      return "BOOL";
  }
  return "?";
}

Dtype dtype_from_name(const std::string& name) {
  for (Dtype dt : kAllDtypes)
    if (name == dtype_to_name(dt)) return dt;
  fail("[safetensors] unknown dtype '", name, "'");
}

Written save(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
             const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<Array> data;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    if (name.empty() || name == "__metadata__")
      fail("[safetensors] ", path, ": invalid tensor name '", name, "'");
    if (header.contains(name)) fail("[safetensors] ", path, ": duplicate tensor name '", name, "'");
    if (!t.defined()) fail("[safetensors] ", path, ": tensor '", name, "' is undefined");
    data.push_back(interop::contiguous_host(t.array()));
    uint64_t n = data.back().nbytes();
    header[name] = {{"dtype", dtype_to_name(t.dtype())},
                    {"shape", t.shape()},
                    {"data_offsets", {offset, offset + n}}};
    offset += n;
  }
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');  // 8-byte aligned data, as the reference writes
  char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<char>((uint64_t{h.size()} >> (8 * i)) & 0xff);
  std::vector<std::string_view> pieces = {std::string_view(len, 8), h};
  for (const Array& a : data)
    if (a.nbytes()) pieces.emplace_back(static_cast<const char*>(a.raw()), a.nbytes());
  Written w;
  uLong crc = ::crc32(0L, Z_NULL, 0);
  for (std::string_view p : pieces) {
    crc = crc32_of(crc, p.data(), p.size());
    w.bytes += p.size();
  }
  w.crc32 = static_cast<uint32_t>(crc);
  try {
    write_output_file(path, pieces, "checkpoint file");
  } catch (const Error& e) {
    fail("[safetensors] ", e.what());
  }
  return w;
}

File load(const std::string& path) {
  auto bad = [&](const auto&... what) -> void { fail("[safetensors] ", path, ": ", what...); };
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) bad("cannot open: ", errno_str());
  if (!S_ISREG(st.st_mode)) bad("not a regular file");
  std::ifstream in(path, std::ios::binary);
  if (!in) bad("cannot open: ", errno_str());
  in.seekg(0, std::ios::end);
  const std::streamoff end = in.tellg();
  in.seekg(0);
  if (end < 0 || !in) bad("cannot determine the file size");
  const uint64_t file_size = static_cast<uint64_t>(end);
  if (file_size < 8) bad("file of ", file_size, " bytes is too short for the 8-byte header length");
  unsigned char len[8];
  in.read(reinterpret_cast<char*>(len), 8);
  if (!in) bad("read failed in the 8-byte header length");
  uint64_t hlen = 0;
  for (int i = 0; i < 8; ++i) hlen |= uint64_t{len[i]} << (8 * i);
  if (hlen > kMaxHeader) bad("header length ", hlen, " exceeds the limit of ", kMaxHeader);
  if (hlen > file_size - 8)
    bad("header length ", hlen, " runs past the end of the file (", file_size, " bytes)");
  std::string htext(hlen, '\0');
  in.read(htext.data(), static_cast<std::streamsize>(hlen));
  if (!in) bad("read failed in the header");

  json header;
  try {
    header = json::parse(htext);
  } catch (const json::exception& e) {  // parse_error, or out_of_range (a number too large)
    bad("header is not valid JSON: ", e.what());
  }
  if (!header.is_object()) bad("header is not a JSON object");

  struct Entry {
    std::string name;
    Dtype dtype;
    Shape shape;
    uint64_t begin, end;
  };
  File file;
  std::vector<Entry> entries;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) bad("__metadata__ is not an object");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) bad("__metadata__.", m.key(), " is not a string");
        file.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    if (!v.is_object()) bad("tensor '", name, "': entry is not an object");
    if (!v.contains("dtype") || !v["dtype"].is_string()) bad("tensor '", name, "': dtype missing");
    Entry e{name, Dtype::f32, {}, 0, 0};
    const std::string dt = v["dtype"].get<std::string>();
    try {
      e.dtype = dtype_from_name(dt);
    } catch (const Error&) {
      bad("tensor '", name, "': unknown dtype '", dt, "'");
    }
    if (!v.contains("shape") || !v["shape"].is_array()) bad("tensor '", name, "': shape missing");
    uint64_t count = 1;
    for (const json& d : v["shape"]) {
      if (!d.is_number_unsigned())
        bad("tensor '", name, "': shape has a non-integer or negative entry");
      uint64_t n = d.get<uint64_t>();
      if (n > uint64_t{std::numeric_limits<int64_t>::max()} ||
          (n && count > std::numeric_limits<uint64_t>::max() / n))
        bad("tensor '", name, "': shape overflows");
      count *= n;
      e.shape.push_back(static_cast<int64_t>(n));
    }
    const json& off = v.contains("data_offsets") ? v["data_offsets"] : json();
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() ||
        !off[1].is_number_unsigned())
      bad("tensor '", name, "': data_offsets must be two non-negative integers");
    e.begin = off[0].get<uint64_t>();
    e.end = off[1].get<uint64_t>();
    if (e.end < e.begin)
      bad("tensor '", name, "': data_offsets [", e.begin, ", ", e.end, "] end before they begin");
    if (count > std::numeric_limits<uint64_t>::max() / dtype_size(e.dtype) ||
        e.end - e.begin != count * dtype_size(e.dtype))
      bad("tensor '", name, "': data_offsets [", e.begin, ", ", e.end, "] hold ", e.end - e.begin,
          " bytes but shape ", shape_str(e.shape), " of ", dt, " needs ",
          count * dtype_size(e.dtype));
    entries.push_back(std::move(e));
  }

  // The tensors must tile the data section exactly: in order, no gaps, no overlap.
  const uint64_t data_size = file_size - 8 - hlen;
  std::vector<const Entry*> by_offset;
  for (const auto& e : entries) by_offset.push_back(&e);
  std::stable_sort(by_offset.begin(), by_offset.end(), [](const Entry* a, const Entry* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  uint64_t expect = 0;
  for (const Entry* e : by_offset) {
    if (e->begin < expect)
      bad("tensor '", e->name, "': data_offsets [", e->begin, ", ", e->end,
          "] overlap the previous tensor, which ends at ", expect);
    if (e->begin > expect)
      bad("tensor '", e->name, "': data_offsets [", e->begin, ", ", e->end,
          "] leave a gap after offset ", expect);
    if (e->end > data_size)
      bad("tensor '", e->name, "': data_offsets [", e->begin, ", ", e->end,
          "] are past the end of the data (", data_size, " bytes; file truncated?)");
    expect = e->end;
  }
  if (expect != data_size)
    bad("data section has ", data_size, " bytes but the tensors cover ", expect);

  std::vector<char> data(data_size);
  if (data_size) in.read(data.data(), static_cast<std::streamsize>(data_size));
  if (!in) bad("read failed in the data section");
  for (const auto& e : entries) {
    const char* p = data.data() + e.begin;
    if (e.dtype == Dtype::boolean)
      for (uint64_t i = 0; i < e.end - e.begin; ++i)
        if (p[i] != 0 && p[i] != 1) bad("tensor '", e.name, "': BOOL byte ", i, " is not 0 or 1");
  }
  for (const auto& e : entries)
    file.tensors.emplace(e.name, from_blob(data.data() + e.begin, e.shape, e.dtype));
  uLong crc = crc32_of(::crc32(0L, Z_NULL, 0), reinterpret_cast<const char*>(len), 8);
  crc = crc32_of(crc, htext.data(), htext.size());
  file.crc32 = static_cast<uint32_t>(crc32_of(crc, data.data(), data.size()));
  file.bytes = file_size;
  return file;
}

}  // namespace hetrain::safetensors
