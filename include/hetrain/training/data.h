// Datasets and a prefetching, seeded, resumable loader.
//
//   using namespace hetrain;
//   auto train = data::load_fashion_mnist(data::kFashionMnistDir, "train");
//   data::DataLoader loader(train, /*batch_size=*/128, /*shuffle=*/true, /*seed=*/1);
//   for (int64_t step = 0; step < 1000; ++step) {
//     data::Batch b = loader.next();  // inputs f32 (128, 1, 28, 28), targets i64 (128)
//     ...
//   }
//   // checkpoint: loader.epoch(), loader.position(); on resume: loader.seek(epoch, position)
//
// Every reader validates what it reads and throws hetrain::Error naming the file and the problem
// ("[data] /x/train-images-idx3-ubyte.gz: truncated: header says 60000x28x28 images (47040016
// bytes), file holds 1000016 bytes after gunzip").
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "hetrain/graph/tensor.h"

namespace hetrain::data {

/// One batch: leaves holding data (no graph behind them).
struct Batch {
  Tensor inputs;
  Tensor targets;
};

class Dataset {
 public:
  virtual ~Dataset() = default;
  /// Number of examples.
  virtual int64_t size() const = 0;
  /// The examples at indices, stacked along a new first axis. Thread-safe; throws for an index
  /// outside [0, size()).
  virtual Batch make_batch(const std::vector<int64_t>& indices) const = 0;
  /// One line, e.g. "fashion-mnist train: 60000 images 28x28, 10 classes".
  virtual std::string describe() const = 0;
};

// ---- images (IDX) ------------------------------------------------------------------------

/// IDX (MNIST/Fashion-MNIST) images and labels, gzip or raw (detected by the gzip magic). inputs:
/// f32 (B, 1, H, W), each pixel p computed in f32 as (p / 255 - mean) / std exactly as
/// torchvision's ToTensor + Normalize do; targets: i64 (B). Labels must lie in [0, num_classes).
std::shared_ptr<Dataset> load_idx(const std::string& images_path, const std::string& labels_path,
                                  double mean = 0.2860, double std = 0.3530,
                                  int64_t num_classes = 10);

/// dir/{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]; split "train" or "test". A missing
/// directory or file gives an error that names it and says that the Debian package
/// dataset-fashion-mnist provides the data (at /usr/share/datasets/fashion-mnist).
std::shared_ptr<Dataset> load_fashion_mnist(const std::string& dir, const std::string& split);

inline constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";

// ---- text and tokens ---------------------------------------------------------------------

/// Byte-level language-model corpus, split into training and held-out validation bytes.
struct TextCorpus {
  std::vector<uint8_t> train, val;
  std::string source;  // "/usr/share/games/fortunes (27 files, 1234567 bytes)"
};

/// Reads a text file, or every regular file in a directory (sorted by name; skips files that are
/// not text, such as fortune's .dat index files, and links to files already read), and holds out
/// the last val_fraction of the bytes for validation.
TextCorpus load_text_corpus(const std::string& path, double val_fraction = 0.1);

inline constexpr const char* kFortunesDir = "/usr/share/games/fortunes";

/// Language-model windows over a byte stream: example i is bytes[i*T, i*T + T] (T + 1 bytes);
/// inputs i64 (B, T) are its first T bytes, targets i64 (B, T) its last T. Vocabulary 256.
std::shared_ptr<Dataset> make_text_dataset(std::vector<uint8_t> bytes, int64_t context);

/// Token shard file: magic "HTOK" (4 bytes), u32 version (1), u64 count, then count uint16 tokens;
/// all little-endian. Throws on a wrong magic or version, a count that disagrees with the file
/// size, and any token id >= vocab (naming the file, the token's index and its byte offset).
std::vector<uint16_t> load_token_shard(const std::string& path, int64_t vocab);
/// Writes a shard atomically (temporary file, fsync, rename).
void save_token_shard(const std::string& path, const std::vector<uint16_t>& tokens);
/// Windows over tokens, as make_text_dataset.
std::shared_ptr<Dataset> make_token_dataset(std::vector<uint16_t> tokens, int64_t context);

/// Unigram (order-0) entropy in nats of a stream: the loss of a model that knows only symbol
/// frequencies, to report a language model's loss against.
double unigram_entropy(const std::vector<uint8_t>& bytes);
double unigram_entropy(const std::vector<uint16_t>& tokens);

// ---- loader ------------------------------------------------------------------------------

/// Batches over a dataset, epoch after epoch. With shuffle, epoch e visits the examples in a
/// permutation made by Fisher-Yates from a PCG32 stream seeded by (seed, e), so runs are identical
/// on every machine (tools/shuffle_reference.py reproduces it in Python). With drop_last the final
/// partial batch of an epoch is skipped. With prefetch a background thread prepares the next
/// batches while the caller trains; an exception there is rethrown by next(). State (epoch,
/// position) can be read and restored exactly: a resumed run sees the same batches as an
/// uninterrupted one.
class DataLoader {
 public:
  DataLoader(std::shared_ptr<const Dataset> ds, int64_t batch_size, bool shuffle, uint64_t seed,
             bool drop_last = true, bool prefetch = true);
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  /// The batch at (epoch(), position()); then advances, wrapping into the next epoch.
  Batch next();
  /// Data parallelism and gradient accumulation: each batch's examples [offset, offset +
  /// count) (this rank's slice of the global batch), made as `micro` equal micro-batches, each
  /// its own contiguous batch. Throws unless count is a multiple of micro and the slice lies in
  /// the batch. The default is the whole batch as one.
  void set_shard(int64_t offset, int64_t count, int64_t micro);
  /// The micro-batches of the batch at (epoch(), position()); then advances as next() does.
  std::vector<Batch> next_micro();
  /// Epoch of the next batch.
  int64_t epoch() const { return epoch_; }
  /// Index of the next batch within its epoch, in [0, batches_per_epoch()).
  int64_t position() const { return position_; }
  /// Makes (epoch, position) the next batch; position may equal batches_per_epoch() (the start of
  /// the following epoch).
  void seek(int64_t epoch, int64_t position);
  int64_t batches_per_epoch() const { return batches_per_epoch_; }
  int64_t batch_size() const { return batch_size_; }
  const Dataset& dataset() const { return *ds_; }

  /// Every batch of one pass in order, without shuffling, the last one partial (evaluation).
  static std::vector<Batch> all_batches(const Dataset& ds, int64_t batch_size);
  /// The order in which epoch `epoch` visits the examples (the identity without shuffle).
  std::vector<int64_t> epoch_order(int64_t epoch) const;

 private:
  struct Slot {
    int64_t epoch, position;
    std::vector<Batch> batches;
    std::exception_ptr error;
  };
  std::vector<Batch> produce(int64_t epoch, int64_t position);
  void start_worker();
  void stop_worker();
  void worker_loop(int64_t epoch, int64_t position);

  std::shared_ptr<const Dataset> ds_;
  int64_t batch_size_;
  bool shuffle_;
  uint64_t seed_;
  bool prefetch_;
  int64_t batches_per_epoch_;
  int64_t epoch_ = 0, position_ = 0;
  int64_t shard_offset_ = 0, shard_count_ = 0, micro_ = 1;  // set_shard

  // Permutation cache; used by one thread at a time (the worker while it runs, else next()).
  int64_t order_epoch_ = -1;
  std::vector<int64_t> order_;

  // Prefetch: the worker fills queue_ with consecutive batches starting at the loader state.
  std::thread worker_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Slot> queue_;
  bool stop_ = false;
};

}  // namespace hetrain::data
