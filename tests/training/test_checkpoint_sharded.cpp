// Sharded checkpoints (training/checkpoint.h, version 3): pieces written by several "ranks"
// (called in turn here), committed by one, read back as whole tensors; the coverage checks
// (every element from exactly one piece) and the files a sharded save replaces.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "hetrain/base/error.h"
#include "hetrain/graph/ops.h"
#include "hetrain/memory/allocator.h"
#include "hetrain/training/checkpoint.h"

using namespace hetrain;
using namespace hetrain::training;
namespace fs = std::filesystem;

namespace {

class ShardedCheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (fs::temp_directory_path() /
            ("hetrain_sharded_" + std::to_string(::getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name()))
               .string();
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  /// Writes a checkpoint of w = [0, 1, ..., 6] (f32) and n = 7 (i64, whole on rank 0), the
  /// pieces of w given per rank as (begin, count); returns the generation.
  uint64_t save(int64_t step, const std::vector<std::vector<std::pair<int64_t, int64_t>>>& ranks) {
    const uint64_t gen = checkpoint::begin_sharded(dir_);
    std::vector<checkpoint::ShardWritten> written;
    for (size_t r = 0; r < ranks.size(); ++r) {
      std::vector<checkpoint::Piece> pieces;
      for (const auto& [begin, count] : ranks[r]) {
        std::vector<float> v;
        for (int64_t i = 0; i < count; ++i) v.push_back(static_cast<float>(begin + i));
        pieces.push_back({"model", "w", begin, from_vector(v, {count})});
      }
      if (r == 0) pieces.push_back({"train_state", "n", 0, full({}, 7, Dtype::i64)});
      written.push_back(checkpoint::write_shard(dir_, gen, static_cast<int>(r),
                                                static_cast<int>(ranks.size()), pieces));
    }
    checkpoint::ShardedPart model{"model", {{"w", {Dtype::f32, {7}}}}, {{"step", "5"}}};
    checkpoint::ShardedPart state{"train_state", {{"n", {Dtype::i64, {}}}}, {}};
    checkpoint::commit_sharded(dir_, step, gen, 2, {model, state}, written);
    return gen;
  }
  std::string error_of_read() const {
    try {
      checkpoint::read(dir_);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }
  std::string dir_;
};

}  // namespace

TEST_F(ShardedCheckpointTest, PiecesOfThreeRanksReadAsWholeTensors) {
  // Rank 1 holds two runs and rank 2 one that a plain split would have cut differently.
  save(5, {{{0, 2}}, {{2, 1}, {3, 2}}, {{5, 2}}});
  const checkpoint::Contents c = checkpoint::read(dir_);
  EXPECT_EQ(c.version, 3);
  EXPECT_EQ(c.step, 5);
  EXPECT_EQ(c.world_size, 3);
  EXPECT_EQ(c.stage, 2);
  ASSERT_EQ(c.shard_files.size(), 3u);
  EXPECT_EQ(fs::path(c.shard_files[2]).filename(), "shard-2.1.safetensors");
  const Tensor w = c.parts.at("model").tensors.at("w");
  EXPECT_EQ(w.shape(), (Shape{7}));
  EXPECT_EQ(w.to_vector<float>(), (std::vector<float>{0, 1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(c.parts.at("model").metadata.at("step"), "5");
  EXPECT_EQ(c.parts.at("train_state").tensors.at("n").item<int64_t>(), 7);
}

TEST_F(ShardedCheckpointTest, GapAndOverlapAreRefused) {
  save(5, {{{0, 3}}, {{4, 3}}});  // element 3 in no piece
  EXPECT_NE(error_of_read().find("elements from 3 of the 7 of 'model:w' are in no shard file"),
            std::string::npos)
      << error_of_read();
  fs::remove_all(dir_);
  save(5, {{{0, 4}}, {{3, 4}}});  // element 3 twice
  const std::string e = error_of_read();
  EXPECT_NE(e.find("shard-1.1.safetensors: elements [3, 4) of 'model:w' are also in another"),
            std::string::npos)
      << e;
}

TEST_F(ShardedCheckpointTest, PieceOutsideItsTensorIsRefused) {
  save(5, {{{0, 4}}, {{4, 4}}});  // 8 elements of a 7-element tensor
  const std::string e = error_of_read();
  EXPECT_NE(e.find("shard-1.1.safetensors: piece 'model:w@4' (f32, 4 elements) does not fit "
                   "tensor 'w' (f32, 7 elements)"),
            std::string::npos)
      << e;
}

TEST_F(ShardedCheckpointTest, ANewSaveReplacesTheShardsOfAnotherWorldSize) {
  save(5, {{{0, 2}}, {{2, 2}}, {{4, 3}}});
  // A plain checkpoint into the same directory: the shards go once its index is written.
  checkpoint::write(dir_, 6, {{"model", {{"w", zeros({7})}}, {{"step", "6"}}}});
  for (const auto& e : fs::directory_iterator(dir_))
    EXPECT_EQ(e.path().filename().string().rfind("shard-", 0), std::string::npos) << e.path();
  // And a 2-rank sharded one over it: generation 3, no plain part left.
  EXPECT_EQ(save(7, {{{0, 4}}, {{4, 3}}}), 3u);
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir_)) names.push_back(e.path().filename());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"checkpoint.json", "shard-0.3.safetensors",
                                             "shard-1.3.safetensors"}));
  EXPECT_EQ(checkpoint::read(dir_).step, 7);
}

TEST_F(ShardedCheckpointTest, ShardOfAnotherRankIsRefused) {
  // A file that says it is rank 0's, under rank 1's name, with an index that matches its bytes.
  const uint64_t gen = checkpoint::begin_sharded(dir_);
  std::vector<checkpoint::ShardWritten> w(2);
  w[1] = checkpoint::write_shard(dir_, gen, 0, 2, {{"model", "w", 3, zeros({4})}});
  fs::rename(fs::path(dir_) / checkpoint::shard_file(0, gen),
             fs::path(dir_) / checkpoint::shard_file(1, gen));
  w[0] = checkpoint::write_shard(dir_, gen, 0, 2, {{"model", "w", 0, zeros({3})}});
  checkpoint::commit_sharded(dir_, 5, gen, 1, {{"model", {{"w", {Dtype::f32, {7}}}}, {}}}, w);
  const std::string e = error_of_read();
  EXPECT_NE(e.find("shard-1.1.safetensors is not shard 1 of 2 (its metadata says rank '0'"),
            std::string::npos)
      << e;
}

TEST_F(ShardedCheckpointTest, ShardsAreReadOneAtATime) {
  // A 4 MiB tensor in four 1 MiB shards: reading holds the whole tensor and one shard at a time
  // (the host allocator's peak), not every shard beside the whole tensor (8 MiB).
  constexpr int64_t kN = 1 << 20, kRanks = 4, kPiece = kN / kRanks;
  const uint64_t gen = checkpoint::begin_sharded(dir_);
  std::vector<checkpoint::ShardWritten> written;
  for (int64_t r = 0; r < kRanks; ++r)
    written.push_back(checkpoint::write_shard(
        dir_, gen, static_cast<int>(r), kRanks,
        {{"model", "w", r * kPiece, full({kPiece}, static_cast<double>(r), Dtype::f32)}}));
  checkpoint::commit_sharded(dir_, 3, gen, 3, {{"model", {{"w", {Dtype::f32, {kN}}}}, {}}},
                             written);
  host_allocator().reset_peak();
  const int64_t before = host_allocator().stats().current_total;
  {
    const checkpoint::Contents c = checkpoint::read(dir_);
    const std::vector<float> w = c.parts.at("model").tensors.at("w").to_vector<float>();
    for (int64_t r = 0; r < kRanks; ++r) EXPECT_EQ(w[static_cast<size_t>(r * kPiece)], r);
  }
  const int64_t grew = host_allocator().stats().peak_total - before;
  EXPECT_GE(grew, kN * 4);  // the whole tensor itself
  EXPECT_LE(grew, kN * 4 + kN + kN / 4) << "bytes held at once while reading 4 shards of 1 MiB";
}
