// Language-model data: byte-level text corpora, uint16 token shards, and windowed datasets.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>

#include "hetrain/base/error.h"
#include "hetrain/memory/allocator.h"
#include "hetrain/training/data.h"
#include "training/data/file_io.h"

namespace hetrain::data {

namespace {

// Text: no NUL byte and at most 1% control characters other than whitespace, backspace and escape
// (fortune files use the last two for overstrike and terminal effects). Rejects binaries, fortune's
// .dat index files and UTF-16.
bool looks_like_text(const std::vector<uint8_t>& b) {
  size_t control = 0;
  for (uint8_t c : b) {
    if (c == 0) return false;
    if ((c < 0x20 && !(c >= 0x08 && c <= 0x0d) && c != 0x1b) || c == 0x7f) ++control;
  }
  return control * 100 <= b.size();
}

// Windows of context + 1 symbols: example i covers [i*T, i*T + T].
template <class T>
class WindowDataset final : public Dataset {
 public:
  WindowDataset(std::vector<T> data, int64_t context, const char* kind)
      : data_(std::move(data)), context_(context), kind_(kind) {
    const int64_t n = static_cast<int64_t>(data_.size());
    if (context < 1) fail("[data] ", kind, " dataset: context must be >= 1, got ", context);
    if (n < context + 1)
      fail("[data] ", kind, " dataset: ", n, " ", kind, " are too few for one window of context ",
           context, " (needs ", context + 1, ")");
    size_ = (n - 1) / context;
  }

  int64_t size() const override { return size_; }

  Batch make_batch(const std::vector<int64_t>& indices) const override {
    const int64_t bsz = static_cast<int64_t>(indices.size());
    Array x, y;
    x.shape = y.shape = {bsz, context_};
    x.dtype = y.dtype = Dtype::i64;
    x.tag = y.tag = MemoryTagScope::current();
    x.allocate();
    y.allocate();
    int64_t* xp = x.data<int64_t>();
    int64_t* yp = y.data<int64_t>();
    for (int64_t b = 0; b < bsz; ++b) {
      const int64_t i = indices[b];
      if (i < 0 || i >= size_)
        fail("[data] ", kind_, " dataset: index ", i, " out of range [0, ", size_, ")");
      const T* src = data_.data() + i * context_;
      for (int64_t t = 0; t < context_; ++t) {
        xp[b * context_ + t] = src[t];
        yp[b * context_ + t] = src[t + 1];
      }
    }
    return {make_leaf(std::move(x)), make_leaf(std::move(y))};
  }

  std::string describe() const override {
    return hetrain::detail::concat(kind_, ": ", data_.size(), " ", kind_, ", ", size_,
                                   " windows of context ", context_);
  }

 private:
  std::vector<T> data_;
  int64_t context_;
  int64_t size_;
  std::string kind_;
};

template <class T>
double entropy_of(const std::vector<T>& s) {
  if (s.empty()) return 0;
  std::vector<int64_t> counts(size_t{1} << (8 * sizeof(T)), 0);
  for (T v : s) ++counts[v];
  const double n = static_cast<double>(s.size());
  double h = 0;
  for (int64_t c : counts)
    if (c > 0) {
      const double p = static_cast<double>(c) / n;
      h -= p * std::log(p);
    }
  return h;
}

constexpr char kShardMagic[4] = {'H', 'T', 'O', 'K'};
constexpr uint32_t kShardVersion = 1;
constexpr size_t kShardHeader = 16;

uint64_t read_le(const uint8_t* p, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
void write_le(uint8_t* p, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}

}  // namespace

TextCorpus load_text_corpus(const std::string& path, double val_fraction) {
  namespace fs = std::filesystem;
  if (!(val_fraction >= 0 && val_fraction < 1))
    fail("[data] val_fraction must be in [0, 1), got ", val_fraction);
  std::error_code ec;
  const bool fortunes = path.rfind(kFortunesDir, 0) == 0;
  if (!fs::exists(path, ec))
    fail("[data] text corpus ", path, " does not exist",
         fortunes ? "; the Debian package fortunes provides "
                    "/usr/share/games/fortunes "
                    "(apt install fortunes)"
                  : "");
  TextCorpus c;
  std::vector<uint8_t> all;
  int64_t files = 0;
  if (fs::is_directory(path, ec)) {
    std::vector<fs::path> entries;
    for (const auto& e : fs::directory_iterator(path, ec))
      if (e.is_regular_file(ec)) entries.push_back(e.path());  // follows links
    if (ec) fail("[data] text corpus ", path, ": cannot list: ", ec.message());
    std::sort(entries.begin(), entries.end());
    std::set<fs::path> seen;  // canonical paths: fortune's foo.u8 links to foo
    for (const auto& p : entries) {
      const fs::path canon = fs::canonical(p, ec);
      if (!seen.insert(ec ? p : canon).second) continue;
      std::vector<uint8_t> b = detail::read_file(p.string());
      if (b.empty() || !looks_like_text(b)) continue;
      all.insert(all.end(), b.begin(), b.end());
      ++files;
    }
    if (files == 0) fail("[data] text corpus ", path, ": the directory holds no text files");
  } else {
    // A FIFO or device would block or never end; a binary would be trained on as bytes.
    if (!fs::is_regular_file(path, ec))
      fail("[data] text corpus ", path, ": not a regular file or a directory");
    all = detail::read_maybe_gzip(path);
    if (!looks_like_text(all))
      fail("[data] text corpus ", path,
           ": does not look like text (NUL bytes, or over 1% control bytes); give a text file "
           "(gzip is read) or a directory of them");
    files = 1;
  }
  if (all.size() < 2) fail("[data] text corpus ", path, ": ", all.size(), " bytes, too short");
  const size_t n_val =
      static_cast<size_t>(std::floor(static_cast<double>(all.size()) * val_fraction));
  c.train.assign(all.begin(), all.end() - static_cast<std::ptrdiff_t>(n_val));
  c.val.assign(all.end() - static_cast<std::ptrdiff_t>(n_val), all.end());
  c.source = hetrain::detail::concat(path, " (", files, files == 1 ? " file, " : " files, ",
                                     all.size(), " bytes)");
  return c;
}

std::shared_ptr<Dataset> make_text_dataset(std::vector<uint8_t> bytes, int64_t context) {
  return std::make_shared<WindowDataset<uint8_t>>(std::move(bytes), context, "bytes");
}

std::shared_ptr<Dataset> make_token_dataset(std::vector<uint16_t> tokens, int64_t context) {
  return std::make_shared<WindowDataset<uint16_t>>(std::move(tokens), context, "tokens");
}

double unigram_entropy(const std::vector<uint8_t>& bytes) { return entropy_of(bytes); }
double unigram_entropy(const std::vector<uint16_t>& tokens) { return entropy_of(tokens); }

std::vector<uint16_t> load_token_shard(const std::string& path, int64_t vocab) {
  if (vocab < 1 || vocab > 65536)
    fail("[data] ", path, ": vocab must be in [1, 65536] for uint16 tokens, got ", vocab);
  const std::vector<uint8_t> b = detail::read_file(path);
  if (b.size() < kShardHeader)
    fail("[data] ", path, ": truncated: ", b.size(), " bytes, shorter than the ", kShardHeader,
         "-byte token shard header");
  if (std::memcmp(b.data(), kShardMagic, 4) != 0) {
    char got[16];
    std::snprintf(got, sizeof got, "%02x %02x %02x %02x", b[0], b[1], b[2], b[3]);
    fail("[data] ", path, ": wrong magic (bytes ", got, "), not a token shard (expected \"HTOK\")");
  }
  const uint32_t version = static_cast<uint32_t>(read_le(b.data() + 4, 4));
  if (version != kShardVersion)
    fail("[data] ", path, ": token shard version ", version, " is not supported (expected ",
         kShardVersion, ")");
  const uint64_t count = read_le(b.data() + 8, 8);
  const uint64_t body = b.size() - kShardHeader;
  if (count > body / 2 || body != count * 2)
    fail("[data] ", path, ": ", count > body / 2 ? "truncated" : "size mismatch", ": header says ",
         count, " tokens (", kShardHeader, " + 2 x ", count, " bytes), file holds ", b.size(),
         " bytes");
  std::vector<uint16_t> tokens(count);
  const uint8_t* p = b.data() + kShardHeader;
  for (uint64_t i = 0; i < count; ++i) {
    const uint16_t t = static_cast<uint16_t>(p[2 * i] | (p[2 * i + 1] << 8));
    if (t >= vocab)
      fail("[data] ", path, ": token ", i, " (byte offset ", kShardHeader + 2 * i, ") is ", t,
           ", not below the vocabulary size ", vocab);
    tokens[i] = t;
  }
  return tokens;
}

void save_token_shard(const std::string& path, const std::vector<uint16_t>& tokens) {
  std::vector<uint8_t> b(kShardHeader + 2 * tokens.size());
  std::memcpy(b.data(), kShardMagic, 4);
  write_le(b.data() + 4, kShardVersion, 4);
  write_le(b.data() + 8, tokens.size(), 8);
  for (size_t i = 0; i < tokens.size(); ++i)
    write_le(b.data() + kShardHeader + 2 * i, tokens[i], 2);
  detail::write_file_atomic(path, b.data(), b.size());
}

}  // namespace hetrain::data
