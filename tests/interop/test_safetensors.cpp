#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "hetrain/base/error.h"
#include "hetrain/graph/ops.h"
#include "hetrain/interop/safetensors.h"
#include "testing.h"

using namespace hetrain;
namespace fs = std::filesystem;

namespace {

/// A fresh empty directory per test, removed afterwards.
class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "hetrain_st_XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    fs::permissions(dir_, fs::perms::owner_all, fs::perm_options::add);
    fs::remove_all(dir_);
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  /// Writes a file by hand: 8-byte length (hlen, or header.size()), header text, data.
  std::string write_raw(const std::string& name, const std::string& header, const std::string& data,
                        int64_t hlen = -1) const {
    std::string p = path(name);
    std::ofstream f(p, std::ios::binary);
    uint64_t n = hlen < 0 ? header.size() : static_cast<uint64_t>(hlen);
    for (int i = 0; i < 8; ++i) f.put(static_cast<char>((n >> (8 * i)) & 0xff));
    f << header << data;
    return p;
  }

  /// load(p) must throw an Error whose message names the file and contains each needle.
  void expect_load_error(const std::string& p, const std::vector<std::string>& needles) const {
    try {
      safetensors::load(p);
      ADD_FAILURE() << "expected an error loading " << p;
    } catch (const Error& e) {
      std::string msg = e.what();
      EXPECT_NE(msg.find(p), std::string::npos) << msg;
      for (const auto& n : needles) EXPECT_NE(msg.find(n), std::string::npos) << msg;
    }
  }

  fs::path dir_;
};

std::string f32_bytes(std::initializer_list<float> v) {
  return std::string(reinterpret_cast<const char*>(std::data(v)), v.size() * sizeof(float));
}

}  // namespace

TEST_F(SafetensorsTest, RoundTripEveryDtype) {
  std::vector<std::pair<std::string, Tensor>> ts;
  Tensor base = from_vector<double>({-3.5, 2.25, 0, 1e-3, 7, -0.125}, {2, 3});
  for (Dtype dt : kAllDtypes) ts.emplace_back(std::string(dtype_name(dt)), cast(base, dt));
  // A non-contiguous view, a scalar and an empty tensor.
  ts.emplace_back("transposed", transpose(reshape(arange(0, 6, 1), {2, 3}), 0, 1));
  ts.emplace_back("scalar", scalar(4.5, Dtype::f64));
  ts.emplace_back("empty", zeros({0, 3}, Dtype::i32));
  std::map<std::string, std::string> meta{{"step", "42"}, {"note", "µ \"quoted\""}};
  safetensors::save(path("a.safetensors"), ts, meta);

  safetensors::File f = safetensors::load(path("a.safetensors"));
  EXPECT_EQ(f.metadata, meta);
  ASSERT_EQ(f.tensors.size(), ts.size());
  for (const auto& [name, t] : ts) {
    const Tensor& got = f.tensors.at(name);
    EXPECT_EQ(got.dtype(), t.dtype()) << name;
    EXPECT_EQ(got.shape(), t.shape()) << name;
    EXPECT_EQ(got.to_vector<double>(), t.to_vector<double>()) << name;
  }
  // The view was written in logical (row-major) order.
  EXPECT_EQ(f.tensors.at("transposed").to_vector<double>(),
            (std::vector<double>{0, 3, 1, 4, 2, 5}));
}

TEST_F(SafetensorsTest, ReadsFileWrittenByPythonSafetensors) {
  // tests/data/reference.safetensors comes from tools/gen_safetensors_fixture.py (HF safetensors).
  safetensors::File f =
      safetensors::load(std::string(HETRAIN_SOURCE_DIR) + "/tests/data/reference.safetensors");
  EXPECT_EQ(f.metadata.at("producer"), "safetensors-python");
  EXPECT_EQ(f.metadata.at("format"), "np");
  const auto& t = f.tensors;
  EXPECT_EQ(t.at("f64").shape(), (Shape{2, 3}));
  EXPECT_EQ(t.at("f64").to_vector<double>(), (std::vector<double>{1.5, -2.25, 3, 0, 1e-300, -7}));
  EXPECT_EQ(t.at("f32").shape(), (Shape{2, 3, 2}));
  EXPECT_EQ(t.at("f32").dtype(), Dtype::f32);
  EXPECT_EQ(t.at("f32").to_vector<double>(),
            (std::vector<double>{-1, -0.5, 0, 0.5, 1, 1.5, 2, 2.5, 3, 3.5, 4, 4.5}));
  EXPECT_EQ(t.at("f16").dtype(), Dtype::f16);
  // f16 nearest to 0.1 is 0.0999755859375; 6.1035e-05 rounds to the smallest normal 2^-14.
  EXPECT_EQ(t.at("f16").to_vector<double>(),
            (std::vector<double>{0.0999755859375, -65504, 6.103515625e-05, 1}));
  EXPECT_EQ(t.at("i32").to_vector<int64_t>(),
            (std::vector<int64_t>{-2147483648LL, 0, 2147483647LL}));
  EXPECT_EQ(t.at("i64").shape(), (Shape{2, 1}));
  EXPECT_EQ(t.at("i64").to_vector<int64_t>(), (std::vector<int64_t>{-(int64_t{1} << 62), 5}));
  EXPECT_EQ(t.at("bool").dtype(), Dtype::boolean);
  EXPECT_EQ(t.at("bool").to_vector<int64_t>(), (std::vector<int64_t>{1, 0, 1}));
  EXPECT_EQ(t.at("scalar").shape(), Shape{});
  EXPECT_EQ(t.at("scalar").item<double>(), 2.5);
  EXPECT_EQ(t.at("empty").shape(), (Shape{0, 4}));
}

TEST_F(SafetensorsTest, ReadsHandWrittenBf16AndPaddedHeader) {
  // bf16 1.0 = 0x3F80, -2.0 = 0xC000; the header is padded with spaces as the spec allows.
  std::string data("\x80\x3f\x00\xc0", 4);
  std::string p = write_raw("h.safetensors",
                            R"({"x":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]}}    )", data);
  Tensor x = safetensors::load(p).tensors.at("x");
  EXPECT_EQ(x.dtype(), Dtype::bf16);
  EXPECT_EQ(x.to_vector<double>(), (std::vector<double>{1.0, -2.0}));
}

TEST_F(SafetensorsTest, RejectsBadFilesNamingFileAndField) {
  const std::string ok = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  const std::string data = f32_bytes({1, 2});
  // Truncated data section.
  expect_load_error(write_raw("trunc.st", ok, data.substr(0, 5)), {"'a'", "past the end"});
  // Shorter than the length field.
  {
    std::ofstream(path("tiny.st"), std::ios::binary) << "abc";
    expect_load_error(path("tiny.st"), {"too short"});
  }
  // Header length past EOF.
  expect_load_error(write_raw("hlen.st", ok, data, 1000), {"header length 1000", "past the end"});
  // Bad JSON.
  expect_load_error(write_raw("json.st", R"({"a":{"dtype":"F32",)", data), {"not valid JSON"});
  // A number too large for a double is nlohmann's out_of_range, not a parse_error (fuzz finding).
  expect_load_error(write_raw("huge.st", R"({"a":{"dtype":"F32","shape":[2],"x":1e999999}})", data),
                    {"not valid JSON"});
  expect_load_error(write_raw("arr.st", "[1,2]", ""), {"not a JSON object"});
  // Unknown dtype.
  expect_load_error(
      write_raw("dt.st", R"({"a":{"dtype":"F8_E4M3","shape":[2],"data_offsets":[0,2]}})",
                std::string(2, '\0')),
      {"'a'", "unknown dtype 'F8_E4M3'"});
  // Bad shape entries.
  expect_load_error(
      write_raw("shape.st", R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", data),
      {"'a'", "shape"});
  // Size does not match numel * itemsize.
  expect_load_error(
      write_raw("size.st", R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", data),
      {"'a'", "needs 12"});
  // Overlapping offsets.
  expect_load_error(write_raw("overlap.st",
                              R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                              R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                              data),
                    {"'b'", "overlap"});
  // A gap between tensors.
  expect_load_error(
      write_raw("gap.st", R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", data),
      {"'a'", "gap"});
  // Offsets out of bounds.
  expect_load_error(
      write_raw("oob.st", R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", data),
      {"'a'", "past the end"});
  // Reversed offsets.
  expect_load_error(
      write_raw("rev.st", R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", data),
      {"'a'", "data_offsets"});
  // Trailing bytes no tensor covers.
  expect_load_error(write_raw("trail.st", ok, data + "xx"), {"cover 8"});
  // Metadata values must be strings.
  expect_load_error(write_raw("meta.st", R"({"__metadata__":{"k":1}})", ""), {"__metadata__.k"});
  // BOOL bytes other than 0/1.
  expect_load_error(
      write_raw("bool.st", R"({"a":{"dtype":"BOOL","shape":[2],"data_offsets":[0,2]}})",
                std::string("\x01\x07", 2)),
      {"'a'", "BOOL"});
  // Missing file.
  expect_load_error(path("missing.st"), {"cannot open"});
}

TEST_F(SafetensorsTest, SaveRejectsBadNames) {
  Tensor x = zeros({2});
  EXPECT_THROW(safetensors::save(path("d.st"), {{"x", x}, {"x", x}}), Error);
  EXPECT_THROW(safetensors::save(path("d.st"), {{"__metadata__", x}}), Error);
  EXPECT_FALSE(fs::exists(path("d.st")));
}

TEST_F(SafetensorsTest, FailedSaveLeavesOldFileIntact) {
  const std::string p = path("ckpt.safetensors");
  safetensors::save(p, {{"w", from_vector<float>({1, 2, 3}, {3})}});
  // A write that fails half-way: cap the file size so the data write hits EFBIG.
  struct sigaction ign {
  }, old_sa{};
  ign.sa_handler = SIG_IGN;
  sigaction(SIGXFSZ, &ign, &old_sa);
  rlimit old_lim{};
  getrlimit(RLIMIT_FSIZE, &old_lim);
  rlimit lim = old_lim;
  lim.rlim_cur = 4096;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &lim), 0);
  bool threw = false;
  try {
    safetensors::save(p, {{"w", zeros({100000})}});
  } catch (const Error& e) {
    threw = true;
    EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
  setrlimit(RLIMIT_FSIZE, &old_lim);
  sigaction(SIGXFSZ, &old_sa, nullptr);
  EXPECT_TRUE(threw);
  EXPECT_EQ(safetensors::load(p).tensors.at("w").to_vector<double>(),
            (std::vector<double>{1, 2, 3}));
  // No temporary file left behind.
  int files = 0;
  for (const auto& e : fs::directory_iterator(dir_)) files += e.is_regular_file();
  EXPECT_EQ(files, 1);

  // A directory we may not write to (meaningless as root, who may write anywhere).
  if (::geteuid() != 0) {
    fs::permissions(dir_, fs::perms::owner_read | fs::perms::owner_exec);
    EXPECT_THROW(safetensors::save(p, {{"w", zeros({3})}}), Error);
    fs::permissions(dir_, fs::perms::owner_all);
    EXPECT_EQ(safetensors::load(p).tensors.at("w").to_vector<double>(),
              (std::vector<double>{1, 2, 3}));
  }
  // A directory that does not exist.
  EXPECT_THROW(safetensors::save(path("no/such/dir.st"), {{"w", zeros({3})}}), Error);
}
