// The scheduler's performance-model file (perfmodel.json, `hetrain perfmodel --file`): parsed as
// PerfModels::load does past its same-machine check, then queried and written back.
#include <nlohmann/json.hpp>

#include "fuzz_common.h"
#include "hetrain/runtime/perf_model.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  nlohmann::json j = nlohmann::json::parse(data, data + size, nullptr, false);
  if (j.is_discarded()) return 0;  // load() sets invalid JSON aside with a warning
  hetrain::fuzz::expect_only_errors([&] {
    hetrain::runtime::PerfModels models;
    models.from_json(j);
    (void)models.to_json().dump();
  });
  return 0;
}
