// The hardware catalog (`hetrain plan --catalog FILE`) and the device profile `hetrain bench`
// writes (read as a catalog entry, `local`). A catalog that loads is also planned on, so that
// figures the loader lets through are checked against the estimator's arithmetic.
#include "fuzz_common.h"
#include "hetrain/planning/catalog.h"
#include "hetrain/planning/plan.h"

namespace planning = hetrain::planning;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = hetrain::fuzz::write_input(data, size, "hardware.json");
  hetrain::fuzz::expect_only_errors([&] {
    planning::Catalog cat = planning::Catalog::load(path);
    planning::Job job;
    job.model = planning::preset("gpt2-124m");
    job.global_batch = 64;
    job.tokens = 1e9;
    planning::Strategy s;
    s.micro_batch = 8;
    for (const auto& h : cat.all())
      for (int gpus : {1, 8, 64}) (void)planning::evaluate(job, h, gpus, s);
  });
  std::string warning;
  planning::Catalog cat;
  hetrain::fuzz::expect_only_errors([&] { (void)cat.load_device_profile(path, &warning); });
  return 0;
}
