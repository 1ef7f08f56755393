// Measured-runs files (`hetrain plan --measured FILE`, appended by `hetrain train`), compared
// with the planner on the repository's catalog, and published-runs files (`plan --runs FILE`).
#include "fuzz_common.h"
#include "hetrain/planning/calibration.h"
#include "hetrain/planning/validate.h"

namespace planning = hetrain::planning;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const planning::Catalog catalog =
      planning::Catalog::load(std::string(HETRAIN_SOURCE_DIR) + "/data/hardware.json");
  const std::string path = hetrain::fuzz::write_input(data, size, "runs.json");
  hetrain::fuzz::expect_only_errors([&] {
    auto runs = planning::load_measured_runs(path);
    (void)planning::calibrated(catalog, planning::compare_measured(runs, catalog));
  });
  hetrain::fuzz::expect_only_errors([&] { (void)planning::load_published_runs(path); });
  return 0;
}
