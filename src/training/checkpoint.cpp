// Checkpoint directories (checkpoint.h): parts in per-generation files, an index as the commit
// point, the previous generation removed only after the index names the new one.
#include "hetrain/training/checkpoint.h"

#include <sys/stat.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "hetrain/base/error.h"
#include "hetrain/base/file_output.h"

namespace hetrain::training::checkpoint {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr int kVersion = 2;
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
struct Index {
  int64_t step = 0;
  uint64_t generation = 0;
  std::map<std::string, Entry> parts;
};

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
  if (j["version"].get<uint64_t>() != kVersion)
    bad("checkpoint format version ", j["version"].get<uint64_t>(), "; this Hetrain reads ",
        kVersion);
  Index idx;
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
  return idx;
}

bool is_file(const fs::path& p) {
  struct stat st;
  return ::lstat(p.c_str(), &st) == 0;
}

/// Removes what an earlier generation or an interrupted write left in dir: files named
/// "<part>.<n>.safetensors" other than the current ones, version-1 files of the same parts, and
/// temporary files. Best-effort: the new checkpoint is already complete.
void remove_stale(const fs::path& dir, const std::vector<Part>& parts,
                  const std::set<std::string>& keep) {
  std::set<std::string> names;
  for (const Part& p : parts) names.insert(p.name);
  std::error_code ec;
  for (const auto& de : fs::directory_iterator(dir, ec)) {
    const std::string f = de.path().filename().string();
    if (keep.count(f)) continue;
    bool stale = false;
    // ".<file>.tmp.XXXXXX" from write_output_file of a part or the index.
    if (f.size() > 1 && f[0] == '.' && f.find(".tmp.") != std::string::npos)
      stale = f.rfind(".checkpoint.json.tmp.", 0) == 0 ||
              f.find(".safetensors.tmp.") != std::string::npos;
    for (const std::string& n : names) {
      if (f == n + ".safetensors") stale = true;  // version 1
      const std::string pre = n + ".", post = ".safetensors";
      if (f.size() > pre.size() + post.size() && f.rfind(pre, 0) == 0 &&
          f.compare(f.size() - post.size(), post.size(), post) == 0) {
        const std::string mid = f.substr(pre.size(), f.size() - pre.size() - post.size());
        stale = stale || mid.find_first_not_of("0123456789") == std::string::npos;
      }
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

}  // namespace

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
  // The next generation's file names differ from every file the current index names, so the
  // current checkpoint stays whole until the new index replaces it.
  uint64_t generation = 1;
  if (is_file(index_path)) {
    try {
      generation = parse_index(index_path.string()).generation + 1;
    } catch (const Error&) {
      // A damaged index names no checkpoint: nothing to preserve.
    }
  }
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
  remove_stale(d, parts, keep);
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
    c.version = kVersion;
    c.step = idx.step;
    for (const auto& [name, e] : idx.parts) {
      const std::string path = (d / e.file).string();
      safetensors::File f = safetensors::load(path);
      if (f.bytes != e.bytes || f.crc32 != e.crc32)
        fail("[checkpoint] ", path, " does not match ", index_path.string(), ": the file has ",
             f.bytes, " bytes with CRC-32 ", hex32(f.crc32), ", the index records ", e.bytes,
             " bytes with CRC-32 ", hex32(e.crc32),
             "; it is not the file this checkpoint was written with (copied from another "
             "checkpoint, or modified)");
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
