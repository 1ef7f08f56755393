// Byte-level text corpora, windowed LM datasets, token shards, unigram entropy.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "data_test_util.h"
#include "hetrain/training/data.h"

namespace hetrain {
namespace {

using testing::error_of;
using testing::has;
using testing::TempDir;

std::vector<uint8_t> bytes_of(const std::string& s) { return {s.begin(), s.end()}; }

TEST(TextDataset, WindowsAndShiftedTargets) {
  // 10 bytes, context 3: windows [0,3], [3,6], [6,9] -> 3 examples.
  auto ds = data::make_text_dataset(bytes_of("abcdefghij"), 3);
  ASSERT_EQ(ds->size(), 3);
  data::Batch b = ds->make_batch({1, 2});
  EXPECT_EQ(b.inputs.shape(), (Shape{2, 3}));
  EXPECT_EQ(b.inputs.dtype(), Dtype::i64);
  EXPECT_EQ(b.targets.dtype(), Dtype::i64);
  EXPECT_EQ(b.inputs.to_vector<int64_t>(), (std::vector<int64_t>{'d', 'e', 'f', 'g', 'h', 'i'}));
  EXPECT_EQ(b.targets.to_vector<int64_t>(), (std::vector<int64_t>{'e', 'f', 'g', 'h', 'i', 'j'}));
  EXPECT_THROW(ds->make_batch({3}), Error);
  // Bytes >= 128 stay unsigned.
  auto hi = data::make_text_dataset({200, 255, 0}, 2);
  EXPECT_EQ(hi->make_batch({0}).targets.to_vector<int64_t>(), (std::vector<int64_t>{255, 0}));
  // 9 bytes with context 3: the last window would need byte 9.
  EXPECT_EQ(data::make_text_dataset(bytes_of("abcdefghi"), 3)->size(), 2);
  EXPECT_TRUE(has(error_of([] { data::make_text_dataset(bytes_of("abc"), 3); }), "too few"));
  EXPECT_THROW(data::make_text_dataset(bytes_of("abc"), 0), Error);
}

TEST(TextCorpus, DirectorySkipsBinaryAndLinks) {
  TempDir dir;
  testing::write_bytes(dir.file("b"), bytes_of("second file\n"));
  testing::write_bytes(dir.file("a"), bytes_of("first file\n"));
  testing::write_bytes(dir.file("a.dat"), {0, 0, 0, 2, 0, 0, 1, 0xd1, '%', 0});  // strfile index
  std::filesystem::create_symlink(dir.file("a"), dir.file("a.u8"));
  const std::string all = "first file\nsecond file\n";  // 23 bytes, sorted by name
  data::TextCorpus c = data::load_text_corpus(dir.str(), 0.25);
  // floor(23 * 0.25) = 5 held out.
  EXPECT_EQ(std::string(c.train.begin(), c.train.end()), all.substr(0, 18));
  EXPECT_EQ(std::string(c.val.begin(), c.val.end()), all.substr(18));
  EXPECT_TRUE(has(c.source, "2 files, 23 bytes"));
}

TEST(TextCorpus, SingleFileAndErrors) {
  TempDir dir;
  testing::write_bytes(dir.file("t.txt"), bytes_of("0123456789"));
  data::TextCorpus c = data::load_text_corpus(dir.file("t.txt"), 0.1);
  EXPECT_EQ(c.train.size(), 9u);
  EXPECT_EQ(c.val, bytes_of("9"));
  EXPECT_TRUE(has(error_of([&] { data::load_text_corpus(dir.file("none")); }), "does not exist"));
  EXPECT_TRUE(has(error_of([] { data::load_text_corpus("/usr/share/games/fortunes-missing"); }),
                  "Debian package fortunes"));
  EXPECT_THROW(data::load_text_corpus(dir.file("t.txt"), 1.0), Error);
  std::filesystem::create_directory(dir.file("bin"));
  testing::write_bytes(dir.file("bin/x"), {1, 0, 2});
  EXPECT_TRUE(has(error_of([&] { data::load_text_corpus(dir.file("bin")); }), "no text files"));
}

TEST(TextCorpus, Fortunes) {
  if (!std::filesystem::is_directory(data::kFortunesDir))
    GTEST_SKIP() << data::kFortunesDir << " is absent (Debian package fortunes not installed)";
  data::TextCorpus c = data::load_text_corpus(data::kFortunesDir);
  const size_t total = c.train.size() + c.val.size();
  EXPECT_GT(total, 100000u);
  EXPECT_EQ(c.val.size(), static_cast<size_t>(std::floor(total * 0.1)));
  // No NUL from a .dat index made it in.
  EXPECT_EQ(std::count(c.train.begin(), c.train.end(), 0), 0);
  const double h = data::unigram_entropy(c.train);
  EXPECT_GT(h, 2.5);
  EXPECT_LT(h, 4.0);
  std::printf("%s: unigram entropy %.4f nats\n", c.source.c_str(), h);
}

TEST(TokenShard, RoundTrip) {
  TempDir dir;
  std::vector<uint16_t> tokens = {0, 1, 2, 511, 65535, 300};
  data::save_token_shard(dir.file("s.htok"), tokens);
  auto b = testing::read_bytes(dir.file("s.htok"));
  ASSERT_EQ(b.size(), 16u + 12u);
  EXPECT_EQ(std::string(b.begin(), b.begin() + 4), "HTOK");
  EXPECT_EQ(b[4], 1);      // version, little-endian
  EXPECT_EQ(b[8], 6);      // count, little-endian
  EXPECT_EQ(b[22], 0xff);  // 511 = 0x01ff
  EXPECT_EQ(b[23], 0x01);
  EXPECT_EQ(b[24], 0xff);  // 65535
  EXPECT_EQ(b[25], 0xff);
  EXPECT_EQ(b[26], 0x2c);  // 300 = 0x012c
  EXPECT_EQ(b[27], 0x01);
  EXPECT_EQ(data::load_token_shard(dir.file("s.htok"), 65536), tokens);
  // Nothing left behind by the atomic write.
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.str()), {}), 1);
  // Overwrite.
  data::save_token_shard(dir.file("s.htok"), {5});
  EXPECT_EQ(data::load_token_shard(dir.file("s.htok"), 6), (std::vector<uint16_t>{5}));
}

TEST(TokenShard, BadMagicVersionCountVocab) {
  TempDir dir;
  const std::string p = dir.file("s.htok");
  data::save_token_shard(p, {1, 2, 3, 40, 5});
  const auto good = testing::read_bytes(p);

  auto b = good;
  b[0] = 'X';
  testing::write_bytes(p, b);
  std::string msg = error_of([&] { data::load_token_shard(p, 100); });
  EXPECT_TRUE(has(msg, p));
  EXPECT_TRUE(has(msg, "wrong magic"));

  b = good;
  b[4] = 2;
  testing::write_bytes(p, b);
  EXPECT_TRUE(has(error_of([&] { data::load_token_shard(p, 100); }), "version 2"));

  b = good;
  b.pop_back();
  testing::write_bytes(p, b);
  msg = error_of([&] { data::load_token_shard(p, 100); });
  EXPECT_TRUE(has(msg, p));
  EXPECT_TRUE(has(msg, "truncated: header says 5 tokens"));

  b = good;
  b.push_back(0);
  b.push_back(0);
  testing::write_bytes(p, b);
  EXPECT_TRUE(has(error_of([&] { data::load_token_shard(p, 100); }), "size mismatch"));

  b = good;
  b[8] = 0xff;  // count far beyond the file
  b[15] = 0xff;
  testing::write_bytes(p, b);
  EXPECT_TRUE(has(error_of([&] { data::load_token_shard(p, 100); }), "truncated"));

  testing::write_bytes(p, good);
  msg = error_of([&] { data::load_token_shard(p, 40); });
  EXPECT_TRUE(has(msg, p));
  EXPECT_TRUE(has(msg, "token 3 (byte offset 22) is 40"));
  EXPECT_TRUE(has(msg, "vocabulary size 40"));
  EXPECT_EQ(data::load_token_shard(p, 41).size(), 5u);

  testing::write_bytes(p, {'H', 'T'});
  EXPECT_TRUE(has(error_of([&] { data::load_token_shard(p, 100); }), "truncated"));
}

TEST(TokenDataset, Windows) {
  std::vector<uint16_t> t(21);
  std::iota(t.begin(), t.end(), 1000);
  auto ds = data::make_token_dataset(t, 4);
  ASSERT_EQ(ds->size(), 5);
  data::Batch b = ds->make_batch({4});
  EXPECT_EQ(b.inputs.to_vector<int64_t>(), (std::vector<int64_t>{1016, 1017, 1018, 1019}));
  EXPECT_EQ(b.targets.to_vector<int64_t>(), (std::vector<int64_t>{1017, 1018, 1019, 1020}));
}

TEST(UnigramEntropy, HandValues) {
  EXPECT_NEAR(data::unigram_entropy(bytes_of("aabb")), std::log(2.0), 1e-12);
  EXPECT_EQ(data::unigram_entropy(bytes_of("zzzz")), 0.0);
  // p = (1/2, 1/4, 1/4): H = 1.5 ln 2.
  EXPECT_NEAR(data::unigram_entropy(bytes_of("aabc")), 1.5 * std::log(2.0), 1e-12);
  std::vector<uint8_t> all(256);
  std::iota(all.begin(), all.end(), 0);
  EXPECT_NEAR(data::unigram_entropy(all), std::log(256.0), 1e-12);
  EXPECT_NEAR(data::unigram_entropy(std::vector<uint16_t>{7, 7, 60000, 60000}), std::log(2.0),
              1e-12);
}

}  // namespace
}  // namespace hetrain
