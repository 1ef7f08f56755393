// Checkpoint directories (checkpoint.h): parts in per-generation files, an index as the commit
// point, the previous generation removed only after the index names the new one.
#include "hetrain/training/checkpoint.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iomanip>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "hetrain/base/error.h"
#include "hetrain/base/file_output.h"
#include "hetrain/graph/ops.h"

namespace hetrain::training::checkpoint {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr int kVersion = 2;
constexpr int kShardedVersion = 3;
constexpr const char* kLegacyFiles[][2] = {{"model", "model.safetensors"},
                                           {"train_state", "train_state.safetensors"}};

bool plain_word(const std::string& s) {
  if (s.empty()) return false;
  for (char c : s)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-') return false;
  return true;
}

std::string hex32(uint32_t v) {
  std::ostringstream os;
  os << std::hex << std::setw(8) << std::setfill('0') << v;
  return os.str();
}

/// The parsed index: part -> (file name, bytes, crc32).
struct Entry {
  std::string file;
  uint64_t bytes = 0;
  uint32_t crc32 = 0;
};

/// A part or shard file named by the index, read whole and checked against the size and CRC-32
/// the index records for it; `what` names it in the error ("file", "shard").
safetensors::File load_checked(const std::string& path, const Entry& e,
                               const std::string& index_path, const char* what) {
  safetensors::File f = safetensors::load(path);
  if (f.bytes != e.bytes || f.crc32 != e.crc32)
    fail("[checkpoint] ", path, " does not match ", index_path, ": the file has ", f.bytes,
         " bytes with CRC-32 ", hex32(f.crc32), ", the index records ", e.bytes,
         " bytes with CRC-32 ", hex32(e.crc32), "; it is not the ", what,
         " this checkpoint was written with (truncated, copied from another checkpoint, or "
         "modified)");
  return f;
}
struct Index {
  int version = kVersion;
  int64_t step = 0;
  uint64_t generation = 0;
  std::map<std::string, Entry> parts;
  // Version 3: the ranks, the stage and each logical part's metadata and tensor layouts.
  int world_size = 1, stage = 0;
  std::vector<ShardedPart> sharded;
};

/// "shard-<r>" -> r, or -1 for any other name.
int shard_rank(const std::string& part) {
  if (part.rfind("shard-", 0) != 0 || part.size() == 6 || part.size() > 12) return -1;
  int r = -1;
  const auto [end, ec] = std::from_chars(part.data() + 6, part.data() + part.size(), r);
  return ec == std::errc() && end == part.data() + part.size() &&
                 std::to_string(r) == part.substr(6)
             ? r
             : -1;
}

/// The "sharded" object of a version-3 index.
void parse_sharded(const json& j, Index& idx, const std::function<void(const std::string&)>& bad) {
  if (!j.contains("sharded") || !j["sharded"].is_object())
    bad("'sharded' is missing (a version-3 index describes its shards)");
  const json& s = j["sharded"];
  for (const char* k : {"world_size", "stage"})
    if (!s.contains(k) || !s[k].is_number_unsigned() || s[k].get<uint64_t>() > 1000000)
      bad(std::string("sharded.") + k + " is missing or not a non-negative integer");
  idx.world_size = s["world_size"].get<int>();
  idx.stage = s["stage"].get<int>();
  if (idx.world_size < 1) bad("sharded.world_size must be at least 1");
  if (!s.contains("parts") || !s["parts"].is_object() || s["parts"].empty())
    bad("sharded.parts is missing or empty");
  for (auto it = s["parts"].begin(); it != s["parts"].end(); ++it) {
    const std::string where = "sharded part '" + it.key() + "'";
    if (!plain_word(it.key())) bad(where + ": not a plain name");
    const json& v = it.value();
    if (!v.is_object() || !v.contains("tensors") || !v["tensors"].is_object() ||
        !v.contains("metadata") || !v["metadata"].is_object())
      bad(where + ": 'tensors' and 'metadata' must be objects");
    ShardedPart part{it.key(), {}, {}};
    for (auto m = v["metadata"].begin(); m != v["metadata"].end(); ++m) {
      if (!m.value().is_string()) bad(where + ": metadata '" + m.key() + "' is not a string");
      part.metadata[m.key()] = m.value().get<std::string>();
    }
    for (auto t = v["tensors"].begin(); t != v["tensors"].end(); ++t) {
      const json& tv = t.value();
      const std::string tw = where + ", tensor '" + t.key() + "'";
      if (!tv.is_object() || !tv.contains("dtype") || !tv["dtype"].is_string() ||
          !tv.contains("shape") || !tv["shape"].is_array())
        bad(tw + ": needs 'dtype' (a string) and 'shape' (an array)");
      TensorLayout l;
      try {
        l.dtype = safetensors::dtype_from_name(tv["dtype"].get<std::string>());
      } catch (const Error& e) {
        bad(tw + ": " + e.what());
      }
      int64_t n = 1;
      for (const json& d : tv["shape"]) {
        if (!d.is_number_unsigned() || d.get<uint64_t>() > (uint64_t{1} << 40))
          bad(tw + ": shape entries must be non-negative integers below 2^40");
        l.shape.push_back(d.get<int64_t>());
        if (__builtin_mul_overflow(n, l.shape.back(), &n) || n > (int64_t{1} << 40))
          bad(tw + ": more than 2^40 elements");
      }
      part.tensors.emplace(t.key(), std::move(l));
    }
    idx.sharded.push_back(std::move(part));
  }
  // The parts are the shards 0..N-1, each once.
  std::vector<bool> seen(static_cast<size_t>(idx.world_size), false);
  for (const auto& [name, e] : idx.parts) {
    const int r = shard_rank(name);
    if (r < 0 || r >= idx.world_size)
      bad("part '" + name + "' is not one of the " + std::to_string(idx.world_size) +
          " shards shard-0 .. shard-" + std::to_string(idx.world_size - 1));
    seen[static_cast<size_t>(r)] = true;
  }
  for (int r = 0; r < idx.world_size; ++r)
    if (!seen[static_cast<size_t>(r)])
      bad("the index names no file for shard " + std::to_string(r) + " of " +
          std::to_string(idx.world_size));
}

Index parse_index(const std::string& path) {
  auto bad = [&](const auto&... what) -> void { fail("[checkpoint] ", path, ": ", what...); };
  std::ifstream in(path, std::ios::binary);
  if (!in) bad("cannot open: ", std::strerror(errno));
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) bad("read failed");
  json j;
  try {
    j = json::parse(ss.str());
  } catch (const json::exception& e) {
    bad("not valid JSON (", e.what(), "); the checkpoint index is damaged");
  }
  if (!j.is_object() || !j.contains("format") || j["format"] != "hetrain-checkpoint")
    bad("not a Hetrain checkpoint index ('format' is not \"hetrain-checkpoint\")");
  if (!j.contains("version") || !j["version"].is_number_unsigned())
    bad("'version' is missing or not a non-negative integer");
  if (j["version"].get<uint64_t>() != kVersion && j["version"].get<uint64_t>() != kShardedVersion)
    bad("checkpoint format version ", j["version"].get<uint64_t>(), "; this Hetrain reads ",
        kVersion, " and ", kShardedVersion);
  Index idx;
  idx.version = j["version"].get<int>();
  if (!j.contains("step") || !j["step"].is_number_unsigned() ||
      j["step"].get<uint64_t>() > uint64_t{std::numeric_limits<int64_t>::max()})
    bad("'step' is missing or not a non-negative integer");
  idx.step = j["step"].get<int64_t>();
  if (!j.contains("generation") || !j["generation"].is_number_unsigned())
    bad("'generation' is missing or not a non-negative integer");
  idx.generation = j["generation"].get<uint64_t>();
  if (!j.contains("parts") || !j["parts"].is_object() || j["parts"].empty())
    bad("'parts' is missing or empty");
  for (auto it = j["parts"].begin(); it != j["parts"].end(); ++it) {
    const json& v = it.value();
    const std::string where = "part '" + it.key() + "'";
    if (!plain_word(it.key())) bad(where, ": not a plain name");
    if (!v.is_object() || !v.contains("file") || !v["file"].is_string())
      bad(where, ": 'file' is missing");
    Entry e;
    e.file = v["file"].get<std::string>();
    if (e.file.empty() || e.file.find('/') != std::string::npos || e.file[0] == '.')
      bad(where, ": file '", e.file, "' is not a plain file name in the checkpoint directory");
    if (!v.contains("bytes") || !v["bytes"].is_number_unsigned())
      bad(where, ": 'bytes' is missing or not a non-negative integer");
    e.bytes = v["bytes"].get<uint64_t>();
    const std::string crc =
        v.contains("crc32") && v["crc32"].is_string() ? v["crc32"].get<std::string>() : "";
    uint32_t c = 0;
    const auto [end, ec] = std::from_chars(crc.data(), crc.data() + crc.size(), c, 16);
    if (crc.size() != 8 || ec != std::errc() || end != crc.data() + crc.size())
      bad(where, ": 'crc32' must be 8 hexadecimal digits, got '", crc, "'");
    e.crc32 = c;
    idx.parts.emplace(it.key(), std::move(e));
  }
  if (idx.version == kShardedVersion)
    parse_sharded(j, idx, [&](const std::string& what) { bad(what); });
  return idx;
}

bool is_file(const fs::path& p) {
  struct stat st;
  return ::lstat(p.c_str(), &st) == 0;
}

/// Removes what an earlier generation or an interrupted write left in dir: files named
/// "<part>.<n>.safetensors" other than the current ones (parts: the names given, "model",
/// "train_state" and "shard-<r>"), version-1 files of those parts, and temporary files.
/// Best-effort: the new checkpoint is already complete.
void remove_stale(const fs::path& dir, std::set<std::string> names,
                  const std::set<std::string>& keep) {
  names.insert(kLegacyFiles[0][0]);
  names.insert(kLegacyFiles[1][0]);
  std::error_code ec;
  for (const auto& de : fs::directory_iterator(dir, ec)) {
    const std::string f = de.path().filename().string();
    if (keep.count(f)) continue;
    bool stale = false;
    // ".<file>.tmp.XXXXXX" from write_output_file of a part or the index.
    if (f.size() > 1 && f[0] == '.' && f.find(".tmp.") != std::string::npos)
      stale = f.rfind(".checkpoint.json.tmp.", 0) == 0 ||
              f.find(".safetensors.tmp.") != std::string::npos;
    const std::string post = ".safetensors";
    const std::string stem = f.substr(0, f.find('.'));
    if (names.count(stem) && f == stem + post) stale = true;  // version 1
    if ((names.count(stem) || shard_rank(stem) >= 0) && f.size() > stem.size() + 1 + post.size() &&
        f.compare(f.size() - post.size(), post.size(), post) == 0) {
      const std::string mid = f.substr(stem.size() + 1, f.size() - stem.size() - 1 - post.size());
      stale = stale || mid.find_first_not_of("0123456789") == std::string::npos;
    }
    if (stale) fs::remove(de.path(), ec);
  }
}

template <class T>
T metadata_number(const std::map<std::string, std::string>& m, const std::string& key,
                  const std::string& file) {
  auto it = m.find(key);
  if (it == m.end()) fail("[checkpoint] ", file, " lacks metadata field '", key, "'");
  const std::string& v = it->second;
  T x{};
  const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
  if (v.empty() || ec != std::errc() || end != v.data() + v.size())
    fail("[checkpoint] ", file, ": metadata field '", key, "' is not ",
         std::is_signed_v<T> ? "an integer" : "a non-negative integer", " in range: '", v, "'");
  return x;
}

/// The generation a new checkpoint's files take: one past the current index's. Its file names
/// then differ from every file the current index names, so the current checkpoint stays whole
/// until the new index replaces it.
uint64_t next_generation(const fs::path& index_path) {
  if (!is_file(index_path)) return 1;
  try {
    return parse_index(index_path.string()).generation + 1;
  } catch (const Error&) {
    return 1;  // a damaged index names no checkpoint: nothing to preserve
  }
}

std::string piece_name(const Piece& p) {
  return p.part + ":" + p.tensor + "@" + std::to_string(p.begin);
}

/// Gathers the pieces of the shard files into whole tensors, part by part, checking that every
/// element comes from exactly one piece. The shards are read one at a time, each let go once its
/// pieces are copied, so that reading holds the whole tensors and one shard, not every shard
/// twice. Throws Error naming the file or the tensor at fault.
void assemble(const Index& idx, const std::vector<std::string>& paths,
              const std::vector<Entry>& entries, const std::string& index_path, Contents& c) {
  struct Run {
    int64_t begin, end;
    size_t shard;
  };
  struct Whole {
    const TensorLayout* layout;
    std::vector<unsigned char> bytes;
    std::vector<Run> runs;
  };
  std::map<std::string, std::map<std::string, Whole>> whole;
  for (const ShardedPart& p : idx.sharded) {
    whole[p.name];  // a part may have no tensors (no optimizer state before the first update)
    for (const auto& [name, l] : p.tensors)
      whole[p.name][name] = Whole{
          &l,
          std::vector<unsigned char>(static_cast<size_t>(numel(l.shape)) * dtype_size(l.dtype)),
          {}};
  }
  for (size_t s = 0; s < paths.size(); ++s) {
    const std::string& path = paths[s];
    const safetensors::File shard = load_checked(path, entries[s], index_path, "shard");
    const auto& meta = shard.metadata;
    const auto rank = meta.find("rank"), world = meta.find("world_size");
    if (rank == meta.end() || world == meta.end() || rank->second != std::to_string(s) ||
        world->second != std::to_string(idx.world_size))
      fail("[checkpoint] ", path, " is not shard ", s, " of ", idx.world_size,
           " (its metadata says rank '", rank == meta.end() ? "?" : rank->second, "' of '",
           world == meta.end() ? "?" : world->second, "')");
    for (const auto& [key, t] : shard.tensors) {
      const size_t colon = key.find(':'), at = key.rfind('@');
      int64_t begin = -1;
      if (colon != std::string::npos && at != std::string::npos && at > colon) {
        const auto [end, ec] = std::from_chars(key.data() + at + 1, key.data() + key.size(), begin);
        if (ec != std::errc() || end != key.data() + key.size()) begin = -1;
      }
      if (begin < 0)
        fail("[checkpoint] ", path, ": tensor '", key,
             "' is not a piece named <part>:<tensor>@<first element>");
      const std::string part = key.substr(0, colon), name = key.substr(colon + 1, at - colon - 1);
      auto pit = whole.find(part);
      if (pit == whole.end() || !pit->second.count(name))
        fail("[checkpoint] ", path, ": piece '", key, "' is of tensor '", name, "' of part '", part,
             "', which ", index_path, " does not list");
      Whole& w = pit->second.at(name);
      const int64_t n = t.numel(), total = numel(w.layout->shape);
      if (t.dtype() != w.layout->dtype || begin > total || n > total - begin)
        fail("[checkpoint] ", path, ": piece '", key, "' (", dtype_name(t.dtype()), ", ", n,
             " elements) does not fit tensor '", name, "' (", dtype_name(w.layout->dtype), ", ",
             total, " elements)");
      const Array& a = t.eval().array();
      HT_ASSERT(a.contiguous() && a.device().kind == DeviceKind::cpu);
      const size_t es = dtype_size(a.dtype);
      if (n > 0) std::memcpy(w.bytes.data() + static_cast<size_t>(begin) * es, a.raw(), n * es);
      w.runs.push_back({begin, begin + n, s});
    }
  }
  for (auto& [part, tensors] : whole) {
    safetensors::File f;
    for (auto& [name, w] : tensors) {
      std::sort(w.runs.begin(), w.runs.end(),
                [](const Run& a, const Run& b) { return a.begin < b.begin; });
      int64_t covered = 0;
      for (const Run& r : w.runs) {
        if (r.begin < covered)
          fail("[checkpoint] ", paths[r.shard], ": elements [", r.begin, ", ",
               std::min(covered, r.end), ") of '", part, ":", name,
               "' are also in another shard; the shard set is not one checkpoint's");
        if (r.begin > covered) break;
        covered = r.end;
      }
      if (covered != numel(w.layout->shape))
        fail("[checkpoint] ", index_path, ": elements from ", covered, " of the ",
             numel(w.layout->shape), " of '", part, ":", name,
             "' are in no shard file; the shard set is incomplete");
      f.tensors.emplace(name, from_blob(w.bytes.data(), w.layout->shape, w.layout->dtype).eval());
      w.bytes = {};
    }
    for (const ShardedPart& p : idx.sharded)
      if (p.name == part) f.metadata = p.metadata;
    c.files[part] = index_path;
    c.parts.emplace(part, std::move(f));
  }
}

/// A version-3 checkpoint: every shard file checked against the index, no shard file of this
/// generation beyond the index's, the pieces gathered.
void read_sharded(const fs::path& d, const Index& idx, Contents& c) {
  const std::string index_path = (d / kIndexFile).string();
  c.version = kShardedVersion;
  c.step = idx.step;
  c.world_size = idx.world_size;
  c.stage = idx.stage;
  // A shard file of this generation that the index does not name (copied in, or left by a
  // larger world): refused, since it would be silently ignored.
  std::error_code ec;
  for (const auto& de : fs::directory_iterator(d, ec)) {
    const std::string f = de.path().filename().string();
    const std::string suffix = "." + std::to_string(idx.generation) + ".safetensors";
    if (f.size() <= suffix.size() || f.compare(f.size() - suffix.size(), suffix.size(), suffix))
      continue;
    const int r = shard_rank(f.substr(0, f.size() - suffix.size()));
    if (r >= idx.world_size)
      fail("[checkpoint] ", de.path().string(), " is an extra shard: ", index_path, " names ",
           idx.world_size, " shard(s) of generation ", idx.generation,
           "; remove the file or restore the checkpoint it came from");
  }
  std::vector<std::string> paths(static_cast<size_t>(idx.world_size));
  std::vector<Entry> entries(paths.size());
  for (const auto& [name, e] : idx.parts) {
    const size_t r = static_cast<size_t>(shard_rank(name));
    paths[r] = (d / e.file).string();
    entries[r] = e;
    if (!is_file(paths[r]))
      fail("[checkpoint] ", paths[r], " (shard ", r, " of ", idx.world_size, ") is missing; ",
           index_path, " names it");
  }
  c.shard_files = paths;
  assemble(idx, paths, entries, index_path, c);
}

}  // namespace

uint64_t begin_sharded(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) fail("[checkpoint] cannot create checkpoint directory ", dir, ": ", ec.message());
  return next_generation(fs::path(dir) / kIndexFile);
}

std::string shard_file(int rank, uint64_t generation) {
  return "shard-" + std::to_string(rank) + "." + std::to_string(generation) + ".safetensors";
}

ShardWritten write_shard(const std::string& dir, uint64_t generation, int rank, int world_size,
                         const std::vector<Piece>& pieces) {
  std::vector<std::pair<std::string, Tensor>> tensors;
  tensors.reserve(pieces.size());
  for (const Piece& p : pieces) {
    if (!plain_word(p.part) || p.tensor.empty() || p.begin < 0)
      fail("[checkpoint] invalid piece '", piece_name(p), "'");
    tensors.emplace_back(piece_name(p), reshape(p.values, {p.values.numel()}));
  }
  return safetensors::save((fs::path(dir) / shard_file(rank, generation)).string(), tensors,
                           {{"format", "hetrain-shard"},
                            {"rank", std::to_string(rank)},
                            {"world_size", std::to_string(world_size)},
                            {"generation", std::to_string(generation)}});
}

void commit_sharded(const std::string& dir, int64_t step, uint64_t generation, int stage,
                    const std::vector<ShardedPart>& parts,
                    const std::vector<ShardWritten>& shards) {
  if (parts.empty() || shards.empty()) fail("[checkpoint] ", dir, ": nothing to commit");
  json j = {
      {"format", "hetrain-checkpoint"},
      {"version", kShardedVersion},
      {"step", step},
      {"generation", generation},
      {"parts", json::object()},
      {"sharded", {{"world_size", shards.size()}, {"stage", stage}, {"parts", json::object()}}}};
  std::set<std::string> keep = {kIndexFile};
  for (size_t r = 0; r < shards.size(); ++r) {
    const std::string file = shard_file(static_cast<int>(r), generation);
    j["parts"]["shard-" + std::to_string(r)] = {
        {"file", file}, {"bytes", shards[r].bytes}, {"crc32", hex32(shards[r].crc32)}};
    keep.insert(file);
  }
  for (const ShardedPart& p : parts) {
    if (!plain_word(p.name)) fail("[checkpoint] invalid part name '", p.name, "'");
    json t = json::object();
    for (const auto& [name, l] : p.tensors)
      t[name] = {{"dtype", safetensors::dtype_to_name(l.dtype)}, {"shape", l.shape}};
    j["sharded"]["parts"][p.name] = {{"metadata", p.metadata}, {"tensors", t}};
  }
  const fs::path d(dir);
  write_output_file((d / kIndexFile).string(), j.dump(1) + "\n", "checkpoint index");
  remove_stale(d, {}, keep);
}

int64_t metadata_int(const std::map<std::string, std::string>& m, const std::string& key,
                     const std::string& file) {
  return metadata_number<int64_t>(m, key, file);
}
uint64_t metadata_uint(const std::map<std::string, std::string>& m, const std::string& key,
                       const std::string& file) {
  return metadata_number<uint64_t>(m, key, file);
}

void write(const std::string& dir, int64_t step, const std::vector<Part>& parts) {
  if (parts.empty()) fail("[checkpoint] ", dir, ": nothing to write");
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) fail("[checkpoint] cannot create checkpoint directory ", dir, ": ", ec.message());
  const fs::path d(dir), index_path = d / kIndexFile;
  const uint64_t generation = next_generation(index_path);
  json j = {{"format", "hetrain-checkpoint"},
            {"version", kVersion},
            {"step", step},
            {"generation", generation},
            {"parts", json::object()}};
  std::set<std::string> keep = {kIndexFile};
  for (const Part& p : parts) {
    if (!plain_word(p.name)) fail("[checkpoint] invalid part name '", p.name, "'");
    if (j["parts"].contains(p.name)) fail("[checkpoint] duplicate part '", p.name, "'");
    const std::string file = p.name + "." + std::to_string(generation) + ".safetensors";
    const safetensors::Written w = safetensors::save((d / file).string(), p.tensors, p.metadata);
    j["parts"][p.name] = {{"file", file}, {"bytes", w.bytes}, {"crc32", hex32(w.crc32)}};
    keep.insert(file);
  }
  write_output_file(index_path.string(), j.dump(1) + "\n", "checkpoint index");
  std::set<std::string> names;
  for (const Part& p : parts) names.insert(p.name);
  remove_stale(d, names, keep);
}

std::string latest(const std::string& dir) {
  const fs::path d(dir);
  std::string best = dir;
  int64_t best_step = -1;
  if (is_file(d / kIndexFile)) {
    try {
      best_step = parse_index((d / kIndexFile).string()).step;
    } catch (const Error&) {
      return dir;
    }
  } else if (exists(dir)) {
    return dir;  // version 1: no periodic subdirectories beside it
  }
  std::error_code ec;
  for (const auto& de : fs::directory_iterator(d, ec)) {
    const std::string f = de.path().filename().string();
    int64_t n = -1;
    if (f.rfind("step-", 0) != 0) continue;
    const auto [end, err] = std::from_chars(f.data() + 5, f.data() + f.size(), n);
    if (err != std::errc() || end != f.data() + f.size() || n <= best_step) continue;
    if (!de.is_directory(ec) || !is_file(de.path() / kIndexFile)) continue;
    best_step = n;
    best = de.path().string();
  }
  return best;
}

bool exists(const std::string& dir) {
  const fs::path d(dir);
  if (is_file(d / kIndexFile)) return true;
  for (const auto& lf : kLegacyFiles)
    if (!is_file(d / lf[1])) return false;
  return true;
}

Contents read(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) fail("[checkpoint] ", dir, " is not a directory");
  const fs::path d(dir), index_path = d / kIndexFile;
  Contents c;
  if (is_file(index_path)) {
    const Index idx = parse_index(index_path.string());
    if (idx.version == kShardedVersion) {
      read_sharded(d, idx, c);
      return c;
    }
    c.version = kVersion;
    c.step = idx.step;
    for (const auto& [name, e] : idx.parts) {
      const std::string path = (d / e.file).string();
      safetensors::File f = load_checked(path, e, index_path.string(), "file");
      c.files[name] = path;
      c.parts.emplace(name, std::move(f));
    }
    return c;
  }
  if (!exists(dir))
    fail("[checkpoint] ", dir, " holds no checkpoint (no ", kIndexFile, ", and not the ",
         kLegacyFiles[0][1], " and ", kLegacyFiles[1][1], " of an older Hetrain)");
  c.version = 1;
  for (const auto& lf : kLegacyFiles) {
    const std::string path = (d / lf[1]).string();
    c.files[lf[0]] = path;
    c.parts.emplace(lf[0], safetensors::load(path));
  }
  c.step = metadata_int(c.parts.at("train_state").metadata, "step", c.files.at("train_state"));
  return c;
}

}  // namespace hetrain::training::checkpoint
