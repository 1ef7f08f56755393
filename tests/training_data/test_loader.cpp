// DataLoader: seeded permutations, drop_last, seek/resume, prefetch, errors from the worker.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <numeric>
#include <set>
#include <thread>

#include "data_test_util.h"
#include "hetrain/graph/ops.h"
#include "hetrain/training/data.h"

namespace hetrain {
namespace {

using testing::error_of;
using testing::has;

// Example i is the single value i (inputs and targets), so a batch shows which examples it holds.
// Throws for indices in bad_ (to test errors raised on the worker thread).
class IndexDataset final : public data::Dataset {
 public:
  explicit IndexDataset(int64_t n, std::set<int64_t> bad = {}) : n_(n), bad_(std::move(bad)) {}
  int64_t size() const override { return n_; }
  data::Batch make_batch(const std::vector<int64_t>& indices) const override {
    ++calls;
    for (int64_t i : indices)
      if (bad_.count(i)) fail("[test] example ", i, " is unreadable");
    const Shape s{static_cast<int64_t>(indices.size())};
    return {from_vector(indices, s), from_vector(indices, s)};
  }
  std::string describe() const override { return "index dataset"; }
  mutable std::atomic<int> calls{0};

 private:
  int64_t n_;
  std::set<int64_t> bad_;
};

std::vector<int64_t> ids(const data::Batch& b) { return b.inputs.to_vector<int64_t>(); }

std::vector<std::vector<int64_t>> take(data::DataLoader& l, int n) {
  std::vector<std::vector<int64_t>> out;
  for (int i = 0; i < n; ++i) out.push_back(ids(l.next()));
  return out;
}

TEST(DataLoader, ShuffleIsAPermutationPerEpoch) {
  auto ds = std::make_shared<IndexDataset>(103);
  data::DataLoader l(ds, 10, /*shuffle=*/true, /*seed=*/5, /*drop_last=*/false);
  EXPECT_EQ(l.batches_per_epoch(), 11);
  std::vector<std::vector<int64_t>> epochs(2);
  for (int e = 0; e < 2; ++e)
    for (int b = 0; b < 11; ++b) {
      EXPECT_EQ(l.epoch(), e);
      EXPECT_EQ(l.position(), b);
      auto v = ids(l.next());
      EXPECT_EQ(v.size(), b < 10 ? 10u : 3u);
      epochs[e].insert(epochs[e].end(), v.begin(), v.end());
    }
  EXPECT_EQ(l.epoch(), 2);
  EXPECT_EQ(l.position(), 0);
  for (const auto& order : epochs) {
    std::vector<int64_t> sorted = order;
    std::sort(sorted.begin(), sorted.end());
    std::vector<int64_t> identity(103);
    std::iota(identity.begin(), identity.end(), 0);
    EXPECT_EQ(sorted, identity);  // every index exactly once
    EXPECT_NE(order, identity);   // and shuffled
  }
  EXPECT_NE(epochs[0], epochs[1]);
  EXPECT_EQ(epochs[0], l.epoch_order(0));
  EXPECT_EQ(epochs[1], l.epoch_order(1));

  // Same seed: same order; another seed: another order.
  data::DataLoader same(ds, 10, true, 5, false, /*prefetch=*/false);
  data::DataLoader other(ds, 10, true, 6, false);
  EXPECT_EQ(same.epoch_order(1), epochs[1]);
  EXPECT_NE(other.epoch_order(0), epochs[0]);
}

// The documented algorithm, computed independently by tools/shuffle_reference.py.
TEST(DataLoader, ShuffleMatchesReference) {
  auto ds = std::make_shared<IndexDataset>(12);
  data::DataLoader l1(ds, 4, true, 1);
  data::DataLoader l42(ds, 4, true, 42);
  EXPECT_EQ(l1.epoch_order(0), (std::vector<int64_t>{3, 11, 4, 10, 7, 6, 0, 9, 1, 8, 2, 5}));
  EXPECT_EQ(l1.epoch_order(1), (std::vector<int64_t>{10, 5, 4, 0, 11, 8, 1, 9, 7, 6, 2, 3}));
  EXPECT_EQ(l42.epoch_order(7), (std::vector<int64_t>{6, 8, 11, 2, 10, 1, 3, 4, 5, 9, 7, 0}));
}

TEST(DataLoader, NoShuffleAndDropLast) {
  auto ds = std::make_shared<IndexDataset>(7);
  data::DataLoader l(ds, 3, /*shuffle=*/false, 0);
  EXPECT_EQ(l.batches_per_epoch(), 2);  // example 6 dropped
  EXPECT_EQ(take(l, 3), (std::vector<std::vector<int64_t>>{{0, 1, 2}, {3, 4, 5}, {0, 1, 2}}));
  EXPECT_TRUE(has(error_of([&] { data::DataLoader(ds, 8, true, 0); }), "no full batch of 8"));
  EXPECT_THROW(data::DataLoader(ds, 0, true, 0), Error);
}

TEST(DataLoader, SeekReproducesTheSequence) {
  auto ds = std::make_shared<IndexDataset>(50);
  for (bool prefetch : {false, true}) {
    data::DataLoader straight(ds, 8, true, 9, true,
                              prefetch);  // 6 batches per epoch
    auto all = take(straight, 20);
    // Resume at batch 9 = epoch 1 position 3, as a checkpoint would.
    data::DataLoader resumed(ds, 8, true, 9, true, prefetch);
    resumed.seek(1, 3);
    EXPECT_EQ(resumed.epoch(), 1);
    EXPECT_EQ(resumed.position(), 3);
    auto rest = take(resumed, 11);
    EXPECT_EQ(rest, std::vector<std::vector<int64_t>>(all.begin() + 9, all.end()));
    // Seeking backwards while batches are prefetched, and to the end of an epoch.
    resumed.seek(0, 6);
    EXPECT_EQ(resumed.epoch(), 1);
    EXPECT_EQ(resumed.position(), 0);
    EXPECT_EQ(ids(resumed.next()), all[6]);
    resumed.seek(0, 0);
    EXPECT_EQ(take(resumed, 2), std::vector<std::vector<int64_t>>(all.begin(), all.begin() + 2));
    EXPECT_THROW(resumed.seek(0, 7), Error);
    EXPECT_THROW(resumed.seek(-1, 0), Error);
  }
}

TEST(DataLoader, PrefetchGivesTheSameBatches) {
  auto ds = std::make_shared<IndexDataset>(37);
  data::DataLoader a(ds, 5, true, 3, false, /*prefetch=*/true);
  data::DataLoader b(ds, 5, true, 3, false, /*prefetch=*/false);
  for (int i = 0; i < 30; ++i) {
    data::Batch x = a.next(), y = b.next();
    ASSERT_EQ(ids(x), ids(y)) << "batch " << i;
    EXPECT_EQ(x.targets.to_vector<int64_t>(), y.targets.to_vector<int64_t>());
    EXPECT_EQ(a.epoch(), b.epoch());
    EXPECT_EQ(a.position(), b.position());
  }
}

TEST(DataLoader, PrefetchRunsAhead) {
  auto ds = std::make_shared<IndexDataset>(100);
  data::DataLoader l(ds, 10, false, 0);
  l.next();
  // The worker prepares the following batches without being asked.
  for (int i = 0; i < 1000 && ds->calls.load() < 3; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_GE(ds->calls.load(), 3);
}

TEST(DataLoader, WorkerErrorIsRethrownByNext) {
  // Example 13 fails: the third batch (10..14) without shuffle.
  auto ds = std::make_shared<IndexDataset>(30, std::set<int64_t>{13});
  for (bool prefetch : {true, false}) {
    data::DataLoader l(ds, 5, false, 0, true, prefetch);
    EXPECT_EQ(ids(l.next()), (std::vector<int64_t>{0, 1, 2, 3, 4}));
    l.next();
    EXPECT_TRUE(has(error_of([&] { l.next(); }), "example 13 is unreadable"));
    // State did not advance; retrying fails again; seeking past the bad batch goes on.
    EXPECT_EQ(l.position(), 2);
    EXPECT_THROW(l.next(), Error);
    l.seek(0, 3);
    EXPECT_EQ(ids(l.next()), (std::vector<int64_t>{15, 16, 17, 18, 19}));
  }
  // A loader destroyed while its worker waits (or has failed) shuts down cleanly.
  {
    data::DataLoader l(ds, 5, false, 0);
    l.next();
  }
  {
    data::DataLoader l(ds, 5, false, 0);
    l.seek(0, 2);
    EXPECT_THROW(l.next(), Error);
  }
}

TEST(DataLoader, AllBatches) {
  IndexDataset ds(11);
  auto batches = data::DataLoader::all_batches(ds, 4);
  ASSERT_EQ(batches.size(), 3u);
  EXPECT_EQ(ids(batches[0]), (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(ids(batches[2]), (std::vector<int64_t>{8, 9, 10}));
}

}  // namespace
}  // namespace hetrain
