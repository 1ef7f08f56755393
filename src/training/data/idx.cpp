// IDX image sets (MNIST, Fashion-MNIST): http://yann.lecun.com/exdb/mnist/ describes the format. A
// file is a 4-byte magic (0, 0, element type, number of dimensions), that many big-endian u32
// sizes, then the elements. Only unsigned bytes (type 0x08) are used by these sets.
#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "hetrain/base/error.h"
#include "hetrain/memory/allocator.h"
#include "hetrain/training/data.h"
#include "training/data/file_io.h"

namespace hetrain::data {

namespace {

constexpr const char* kFashionPackageHint =
    "the Debian package dataset-fashion-mnist provides it (apt install "
    "dataset-fashion-mnist; "
    "it installs /usr/share/datasets/fashion-mnist)";

uint32_t read_be32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

struct IdxFile {
  std::vector<uint8_t> bytes;  // the whole (inflated) file
  std::vector<int64_t> dims;
  size_t data_offset = 0;
  const uint8_t* data() const { return bytes.data() + data_offset; }
};

IdxFile read_idx(const std::string& path, int expected_ndim, const char* what) {
  IdxFile f;
  f.bytes = detail::read_file(path);
  const bool gz = detail::is_gzip(f.bytes);
  if (gz) f.bytes = detail::gunzip(f.bytes, path);
  const auto& b = f.bytes;
  if (b.size() < 4)
    fail("[data] ", path, ": not an IDX ", what, " file: ", b.size(),
         " bytes, too short for the 4-byte magic");
  const uint32_t magic = read_be32(b.data());
  const uint32_t expected_magic = 0x800u | static_cast<uint32_t>(expected_ndim);
  char hex[16], want[16];
  std::snprintf(hex, sizeof hex, "0x%08x", magic);
  std::snprintf(want, sizeof want, "0x%08x", expected_magic);
  if (b[0] != 0 || b[1] != 0)
    fail("[data] ", path, ": wrong magic ", hex, ", not an IDX file (", what, " files start with ",
         want, ")");
  if (b[2] != 0x08)
    fail("[data] ", path, ": wrong magic ", hex, ": element type 0x", std::hex, int{b[2]}, std::dec,
         " is not unsigned byte (0x08); expected ", want, " for ", what);
  if (b[3] != expected_ndim)
    fail("[data] ", path, ": wrong magic ", hex, ": ", int{b[3]}, " dimension",
         b[3] == 1 ? "" : "s", ", but an IDX ", what, " file has ", expected_ndim, " (magic ", want,
         ")");
  const size_t header = 4 + 4 * static_cast<size_t>(expected_ndim);
  if (b.size() < header)
    fail("[data] ", path, ": truncated: ", b.size(), " bytes, shorter than the ", header,
         "-byte IDX header");
  // The product of up to three 32-bit sizes can pass 2^64: checked, or a header whose product
  // wraps to the file's size would pass as valid (and fail later as an absurd allocation).
  size_t expected = 1;
  bool overflow = false;
  for (int d = 0; d < expected_ndim; ++d) {
    const uint32_t n = read_be32(b.data() + 4 + 4 * d);
    f.dims.push_back(n);
    overflow = overflow || __builtin_mul_overflow(expected, size_t{n}, &expected);
  }
  f.data_offset = header;
  const size_t have = b.size() - header;
  std::string dims;
  for (size_t d = 0; d < f.dims.size(); ++d) dims += (d ? "x" : "") + std::to_string(f.dims[d]);
  if (overflow)
    fail("[data] ", path, ": corrupt header: it says ", dims, " ", what,
         ", more than 2^64 bytes (the file holds ", b.size(), " bytes", gz ? " after gunzip" : "",
         ")");
  if (have != expected) {
    fail("[data] ", path, ": ", have < expected ? "truncated" : "size mismatch", ": header says ",
         dims, " ", what, " (", expected + header, " bytes), file holds ", b.size(), " bytes",
         gz ? " after gunzip" : "");
  }
  return f;
}

class ImageDataset final : public Dataset {
 public:
  ImageDataset(std::string name, IdxFile images, IdxFile labels, double mean, double std,
               int64_t num_classes)
      : name_(std::move(name)),
        images_(std::move(images)),
        labels_(std::move(labels)),
        num_classes_(num_classes) {
    n_ = images_.dims[0];
    h_ = images_.dims[1];
    w_ = images_.dims[2];
    // torchvision's ToTensor then Normalize, in f32: (p / 255 - mean) / std.
    const float m = static_cast<float>(mean), s = static_cast<float>(std);
    for (int p = 0; p < 256; ++p) lut_[p] = (static_cast<float>(p) / 255.0f - m) / s;
  }

  int64_t size() const override { return n_; }

  Batch make_batch(const std::vector<int64_t>& indices) const override {
    const int64_t bsz = static_cast<int64_t>(indices.size());
    const int64_t pix = h_ * w_;
    Array x, y;
    x.shape = {bsz, 1, h_, w_};
    x.dtype = Dtype::f32;
    y.shape = {bsz};
    y.dtype = Dtype::i64;
    x.tag = y.tag = MemoryTagScope::current();
    x.allocate();
    y.allocate();
    float* xp = x.data<float>();
    int64_t* yp = y.data<int64_t>();
    const uint8_t* img = images_.data();
    const uint8_t* lab = labels_.data();
    for (int64_t b = 0; b < bsz; ++b) {
      const int64_t i = indices[b];
      if (i < 0 || i >= n_) fail("[data] ", name_, ": index ", i, " out of range [0, ", n_, ")");
      const uint8_t* src = img + i * pix;
      float* dst = xp + b * pix;
      for (int64_t k = 0; k < pix; ++k) dst[k] = lut_[src[k]];
      yp[b] = lab[i];
    }
    return {make_leaf(std::move(x)), make_leaf(std::move(y))};
  }

  std::string describe() const override {
    return hetrain::detail::concat(name_, ": ", n_, " images ", h_, "x", w_, ", ", num_classes_,
                                   " classes");
  }

 private:
  std::string name_;
  IdxFile images_, labels_;
  int64_t num_classes_;
  int64_t n_, h_, w_;
  std::array<float, 256> lut_;
};

std::shared_ptr<Dataset> load_idx_named(const std::string& name, const std::string& images_path,
                                        const std::string& labels_path, double mean, double std,
                                        int64_t num_classes) {
  if (!(std > 0) || !std::isfinite(mean))
    fail("[data] load_idx: need a finite mean and std > 0, got mean ", mean, " std ", std);
  if (num_classes < 1 || num_classes > 256)
    fail("[data] load_idx: num_classes must be in [1, 256], got ", num_classes);
  IdxFile images = read_idx(images_path, 3, "images");
  IdxFile labels = read_idx(labels_path, 1, "labels");
  if (images.dims[0] != labels.dims[0])
    fail("[data] count mismatch: ", images_path, " holds ", images.dims[0], " images but ",
         labels_path, " holds ", labels.dims[0], " labels");
  const uint8_t* lab = labels.data();
  for (int64_t i = 0; i < labels.dims[0]; ++i)
    if (lab[i] >= num_classes)
      fail("[data] ", labels_path, ": label out of range at index ", i, ": ", int{lab[i]},
           " (labels must be in [0, ", num_classes, "))");
  return std::make_shared<ImageDataset>(name, std::move(images), std::move(labels), mean, std,
                                        num_classes);
}

}  // namespace

std::shared_ptr<Dataset> load_idx(const std::string& images_path, const std::string& labels_path,
                                  double mean, double std, int64_t num_classes) {
  return load_idx_named(std::filesystem::path(images_path).filename().string(), images_path,
                        labels_path, mean, std, num_classes);
}

std::shared_ptr<Dataset> load_fashion_mnist(const std::string& dir, const std::string& split) {
  namespace fs = std::filesystem;
  std::string prefix;
  if (split == "train")
    prefix = "train";
  else if (split == "test")
    prefix = "t10k";
  else
    fail("[data] Fashion-MNIST split must be \"train\" or \"test\", got \"", split, "\"");
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    fail("[data] Fashion-MNIST directory ", dir,
         fs::exists(dir, ec) ? " is not a directory" : " does not exist", "; ",
         kFashionPackageHint);
  auto find = [&](const std::string& stem) {
    for (const char* ext : {".gz", ""}) {
      const fs::path p = fs::path(dir) / (stem + ext);
      if (fs::exists(p, ec)) return p.string();
    }
    fail("[data] Fashion-MNIST directory ", dir, " has no ", stem, "[.gz]; ", kFashionPackageHint);
  };
  const std::string images = find(prefix + "-images-idx3-ubyte");
  const std::string labels = find(prefix + "-labels-idx1-ubyte");
  return load_idx_named("fashion-mnist " + split, images, labels, 0.2860, 0.3530, 10);
}

}  // namespace hetrain::data
