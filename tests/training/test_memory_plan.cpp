// The memory model against the allocator: for each preset (small shapes) and each recompute
// mode, a step's peak by tag predicted from its graph before it runs is within 5% of what the
// host allocator measures over that step, the kernels' scratch included (one thread: the
// executor's order is the model's).
// And the recompute modes do what they claim on the predicted and measured activations.
#include <gtest/gtest.h>

#include <cmath>

#include "hetrain/base/byte_size.h"
#include "hetrain/training/memory_plan.h"
#include "hetrain/training/trainer.h"

namespace hetrain::training {
namespace {

TrainConfig small(const std::string& preset, const std::string& mode) {
  TrainConfig c = preset_config(preset);
  c.threads = 1;
  c.recompute = mode;
  c.steps = 3;
  if (preset == "gpt-mini") {
    c.layers = 3, c.width = 32, c.heads = 2, c.context = 16, c.batch_size = 8, c.dropout = 0.1;
  } else if (preset == "fashion-cnn") {
    c.widths = {4, 8}, c.batch_size = 16;
  } else {
    c.hidden = {64, 32}, c.batch_size = 32;
  }
  return c;
}

struct Case {
  std::string preset, mode;
};

class MemoryModel : public ::testing::TestWithParam<Case> {};

TEST_P(MemoryModel, PredictedPeakByTagWithinFivePercentOfMeasured) {
  const Case& k = GetParam();
  const auto checks = check_step_memory(small(k.preset, k.mode), 3);
  ASSERT_EQ(checks.size(), 3u);
  // Steps 2 and 3: the optimizer state exists (steady state).
  for (size_t s = 1; s < checks.size(); ++s) {
    const StepMemoryCheck& c = checks[s];
    for (int t = 0; t < kNumMemoryTags; ++t) {
      const auto i = static_cast<size_t>(t);
      const double want = static_cast<double>(c.measured_peak[i]);
      const double got = static_cast<double>(c.predicted.peak[i]);
      EXPECT_LE(std::fabs(got - want), 0.05 * want)
          << k.preset << " " << k.mode << " step " << s + 1 << " "
          << memory_tag_name(static_cast<MemoryTag>(t)) << ": predicted " << got << ", measured "
          << want;
    }
    // The convolutions and attention take scratch (a convolution's unfolded input, attention's
    // blocks), so the comparison above covers the kernels' own allocations.
    if (k.preset != "fashion-mlp") {
      EXPECT_GT(c.measured_peak[static_cast<size_t>(MemoryTag::workspace)], 0) << k.preset;
    }
    // The total, the kernels' scratch included: within 5%.
    const double total = static_cast<double>(c.measured_peak_total);
    const double got = static_cast<double>(c.predicted.peak_total);
    EXPECT_LE(std::fabs(got - total), 0.05 * total)
        << k.preset << " " << k.mode << " step " << s + 1 << " total: predicted " << got
        << ", measured " << total;
    // What the step itself adds to the activations (the data and batch excluded) as well.
    const auto a = static_cast<size_t>(MemoryTag::activations);
    const double add_want = static_cast<double>(c.measured_peak[a] - c.predicted.start[a]);
    const double add_got = static_cast<double>(c.predicted.peak[a] - c.predicted.start[a]);
    EXPECT_LE(std::fabs(add_got - add_want), 0.05 * add_want)
        << k.preset << " " << k.mode << " step " << s + 1
        << " activations the step adds: predicted " << add_got << ", measured " << add_want;
  }
}

INSTANTIATE_TEST_SUITE_P(PresetsAndModes, MemoryModel,
                         ::testing::ValuesIn(std::vector<Case>{{"fashion-mlp", "none"},
                                                               {"fashion-mlp", "selective"},
                                                               {"fashion-mlp", "full"},
                                                               {"fashion-mlp", "auto"},
                                                               {"fashion-cnn", "none"},
                                                               {"fashion-cnn", "selective"},
                                                               {"fashion-cnn", "full"},
                                                               {"fashion-cnn", "auto"},
                                                               {"gpt-mini", "none"},
                                                               {"gpt-mini", "selective"},
                                                               {"gpt-mini", "full"},
                                                               {"gpt-mini", "auto"}}),
                         [](const ::testing::TestParamInfo<Case>& i) {
                           std::string n = i.param.preset + "_" + i.param.mode;
                           for (char& ch : n)
                             if (ch == '-') ch = '_';
                           return n;
                         });

int64_t measured_activations(const std::string& mode, int layers) {
  TrainConfig c = small("gpt-mini", mode);
  c.layers = layers;
  return check_step_memory(c, 2)[1].measured_peak[static_cast<size_t>(MemoryTag::activations)];
}

// A deep, narrow GPT with full and auto recompute: the step's peak is where the update starts,
// after clipping has replaced the gradients, so the gradients' nodes and the outputs they held
// (each layer norm's input gradient, held with its weight's gradient) are gone by then.
TEST(MemoryModel, DeepNarrowGptTotalAtTheUpdate) {
  for (const char* mode : {"full", "auto"}) {
    TrainConfig c = small("gpt-mini", mode);
    c.layers = 24, c.width = 32, c.heads = 2, c.context = 32, c.batch_size = 8;
    const StepMemoryCheck r = check_step_memory(c, 2)[1];
    const double got = static_cast<double>(r.predicted.peak_total);
    const double want = static_cast<double>(r.measured_peak_total);
    EXPECT_LE(std::fabs(got - want), 0.01 * want)
        << mode << ": predicted " << got << ", measured " << want;
  }
}

TEST(Recompute, FullAndSelectiveKeepLessThanNone) {
  const int64_t none = measured_activations("none", 4), sel = measured_activations("selective", 4),
                full = measured_activations("full", 4);
  EXPECT_LT(sel, none);
  EXPECT_LT(full, sel);
}

TEST(Recompute, AutoFitsHalfTheNonePeakAndRefusesTheImpossible) {
  TrainConfig c = small("gpt-mini", "none");
  c.layers = 4;
  const int64_t none = dry_run(c, nullptr).peak_total;
  c.recompute = "auto";
  const int64_t least = dry_run(c, nullptr).peak_total;  // no budget: the least peak
  EXPECT_LT(least, none);
  c.memory_budget = (none + least) / 2;
  const StepMemory fit = dry_run(c, nullptr);
  EXPECT_LE(fit.peak_total, c.memory_budget);
  // A budget under every plan's peak is refused up front, naming the smallest feasible one.
  c.memory_budget = least - 1;
  try {
    dry_run(c, nullptr);
    FAIL() << "an impossible budget was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the smallest feasible budget is " + format_bytes(least) +
                                         " (" + std::to_string(least) + " bytes)"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace hetrain::training
