// Checkpoint directories (training/checkpoint.h) and what resume accepts: the index and its
// checksums, stale files, strict metadata, dtypes, seeds up to 2^63 - 1, data-order settings.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <limits>

#include "hetrain/base/error.h"
#include "hetrain/graph/ops.h"
#include "hetrain/training/checkpoint.h"
#include "hetrain/training/data.h"
#include "hetrain/training/trainer.h"

using namespace hetrain;
using namespace hetrain::training;
namespace fs = std::filesystem;

namespace {

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("hetrain_ckpt_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  std::vector<std::string> files() const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(dir_)) out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  }
  fs::path dir_;
};

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

bool has(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

std::vector<checkpoint::Part> parts(float w, float m) {
  return {{"model", {{"w", from_vector<float>({w, w + 1}, {2})}}, {{"step", "3"}}},
          {"train_state", {{"exp_avg.w", from_vector<float>({m, m}, {2})}}, {{"step", "3"}}}};
}

}  // namespace

TEST_F(CheckpointTest, IndexNamesEachGenerationAndOldFilesGo) {
  checkpoint::write(dir_.string(), 3, parts(1, 2));
  EXPECT_EQ(files(), (std::vector<std::string>{"checkpoint.json", "model.1.safetensors",
                                               "train_state.1.safetensors"}));
  // Leftovers of an interrupted save and a version-1 pair are removed by the next save.
  std::ofstream(path(".model.2.safetensors.tmp.abcdef")) << "partial";
  std::ofstream(path("model.safetensors")) << "old";
  fs::create_directories(dir_ / "step-10");  // --save-every's subdirectories stay
  checkpoint::write(dir_.string(), 3, parts(5, 6));
  EXPECT_EQ(files(), (std::vector<std::string>{"checkpoint.json", "model.2.safetensors", "step-10",
                                               "train_state.2.safetensors"}));
  const checkpoint::Contents c = checkpoint::read(dir_.string());
  EXPECT_EQ(c.version, 2);
  EXPECT_EQ(c.step, 3);
  EXPECT_EQ(c.parts.at("model").tensors.at("w").to_vector<double>(), (std::vector<double>{5, 6}));
  EXPECT_EQ(c.parts.at("train_state").tensors.at("exp_avg.w").to_vector<double>(),
            (std::vector<double>{6, 6}));
}

// At equal steps a weights file from another checkpoint looks the same by name and step; the
// index's checksum tells them apart.
TEST_F(CheckpointTest, PartFromAnotherCheckpointIsRefused) {
  checkpoint::write(path("a"), 3, parts(1, 2));
  checkpoint::write(path("b"), 3, parts(7, 2));
  fs::copy_file(path("b/model.1.safetensors"), path("a/model.1.safetensors"),
                fs::copy_options::overwrite_existing);
  const std::string msg = error_of([&] { checkpoint::read(path("a")); });
  EXPECT_TRUE(has(msg, "a/model.1.safetensors does not match")) << msg;
  EXPECT_TRUE(has(msg, "CRC-32")) << msg;
  // A damaged index is named too, and so is an empty directory.
  std::ofstream(path("a/checkpoint.json")) << "{\"format\": \"hetrain-checkpoint\", \"vers";
  EXPECT_TRUE(
      has(error_of([&] { checkpoint::read(path("a")); }), "checkpoint.json: not valid JSON"));
  fs::create_directories(dir_ / "empty");
  EXPECT_TRUE(has(error_of([&] { checkpoint::read(path("empty")); }), "holds no checkpoint"));
}

TEST(CheckpointMetadata, IntegersAreWholeAndInRange) {
  const std::map<std::string, std::string> m = {{"a", "12"},
                                                {"b", "12abc"},
                                                {"c", ""},
                                                {"d", "-3"},
                                                {"e", "18446744073709551615"},
                                                {"f", "9223372036854775808"}};
  EXPECT_EQ(checkpoint::metadata_int(m, "a", "f.st"), 12);
  EXPECT_TRUE(has(error_of([&] { checkpoint::metadata_int(m, "b", "f.st"); }),
                  "f.st: metadata field 'b' is not an integer in range: '12abc'"));
  EXPECT_THROW(checkpoint::metadata_int(m, "c", "f.st"), Error);
  EXPECT_EQ(checkpoint::metadata_int(m, "d", "f.st"), -3);
  EXPECT_THROW(checkpoint::metadata_uint(m, "d", "f.st"), Error);
  EXPECT_EQ(checkpoint::metadata_uint(m, "e", "f.st"), std::numeric_limits<uint64_t>::max());
  EXPECT_THROW(checkpoint::metadata_int(m, "f", "f.st"), Error);
  EXPECT_TRUE(
      has(error_of([&] { checkpoint::metadata_int(m, "z", "f.st"); }), "lacks metadata field 'z'"));
}

// ---- resume through train() -----------------------------------------------------------------

class ResumeTest : public CheckpointTest {
 protected:
  void SetUp() override {
    if (!fs::exists(std::string(data::kFashionMnistDir) + "/train-images-idx3-ubyte.gz"))
      GTEST_SKIP() << data::kFashionMnistDir << " missing (Debian package dataset-fashion-mnist)";
    CheckpointTest::SetUp();
    cfg_ = preset_config("fashion-mlp");
    cfg_.hidden = {8};
    cfg_.batch_size = 8;
    cfg_.steps = 2;
    cfg_.threads = 1;
    cfg_.progress = false;
    cfg_.final_eval = false;
  }
  TrainResult run(int64_t steps, const std::string& save, const std::string& resume,
                  int64_t save_every = 0) {
    TrainConfig c = cfg_;
    c.steps = steps;
    c.save_every = save_every;
    c.save_dir = save;
    c.resume_dir = resume;
    return train(c);
  }
  /// Rewrites the checkpoint in dir through edit (indexed again: checksums match).
  void edit(const std::string& dir,
            const std::function<void(std::map<std::string, safetensors::File>&)>& f) {
    checkpoint::Contents c = checkpoint::read(dir);
    f(c.parts);
    std::vector<checkpoint::Part> ps;
    for (auto& [name, file] : c.parts) {
      checkpoint::Part p{name, {}, file.metadata};
      for (auto& [n, t] : file.tensors) p.tensors.emplace_back(n, t);
      ps.push_back(std::move(p));
    }
    checkpoint::write(dir, c.step, ps);
  }
  TrainConfig cfg_;
};

TEST_F(ResumeTest, TensorOfAnotherDtypeIsRefused) {
  run(2, path("c"), "");
  edit(path("c"), [](auto& p) {
    Tensor& w = p.at("model").tensors.at("1.weight");
    w = cast(w, Dtype::i32);
  });
  const std::string msg = error_of([&] { run(4, "", path("c")); });
  EXPECT_TRUE(has(msg, "tensor '1.weight' is i32 but the model's is f32")) << msg;
}

TEST_F(ResumeTest, MalformedMetadataIsRefused) {
  run(2, path("c"), "");
  edit(path("c"), [](auto& p) { p.at("train_state").metadata["optimizer_steps"] = "2abc"; });
  const std::string msg = error_of([&] { run(4, "", path("c")); });
  EXPECT_TRUE(has(msg, "metadata field 'optimizer_steps' is not an integer in range: '2abc'"))
      << msg;
}

// The dropout stream's seed is the run's seed + 1: 2^63 for the largest seed.
TEST_F(ResumeTest, LargestSeedResumes) {
  cfg_.seed = std::numeric_limits<int64_t>::max();
  const TrainResult straight = run(4, path("c"), "", 2);
  const TrainResult resumed = run(4, "", path("c/step-2"));
  EXPECT_EQ(resumed.train_loss, straight.train_loss);
}

TEST_F(ResumeTest, ChangedDataOrderSettingIsRefused) {
  run(2, path("c"), "");
  cfg_.batch_size = 16;
  const std::string msg = error_of([&] { run(4, "", path("c")); });
  EXPECT_TRUE(has(msg, "was trained with --batch-size 8 but this run uses --batch-size 16")) << msg;
  cfg_.batch_size = 8;
  cfg_.seed = 3;
  EXPECT_TRUE(has(error_of([&] { run(4, "", path("c")); }), "--seed 0 but this run uses --seed 3"));
}

namespace {

// --resume DIR after periodic saves: the step-N subdirectory at the highest step whose index
// exists; one without an index (a save killed before its commit point) is passed over, and the
// directory's own checkpoint counts when it is later.
TEST_F(CheckpointTest, LatestIsTheHighestCompleteStep) {
  const std::vector<checkpoint::Part> parts = {{"model", {{"w", full({2}, 1.0)}}, {}}};
  EXPECT_EQ(checkpoint::latest(dir_.string()), dir_.string());  // nothing yet: read() says so
  checkpoint::write(path("step-2"), 2, parts);
  checkpoint::write(path("step-10"), 10, parts);
  checkpoint::write(path("step-9"), 9, parts);
  EXPECT_EQ(checkpoint::latest(dir_.string()), path("step-10"));
  // step-11: parts written, killed before the index.
  checkpoint::write(path("step-11"), 11, parts);
  fs::remove(path("step-11/checkpoint.json"));
  fs::create_directories(path("step-12"));
  fs::create_directories(path("step-x13"));
  EXPECT_EQ(checkpoint::latest(dir_.string()), path("step-10"));
  checkpoint::write(dir_.string(), 12, parts);  // the final save into the directory itself
  EXPECT_EQ(checkpoint::latest(dir_.string()), dir_.string());
  EXPECT_EQ(checkpoint::read(checkpoint::latest(dir_.string())).step, 12);
}

}  // namespace
