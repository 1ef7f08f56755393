// Training configs (TOML, `hetrain train --config FILE`): every key applied to a config, then the
// config validated as a run would.
#include "fuzz_common.h"
#include "hetrain/training/trainer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = hetrain::fuzz::write_input(data, size, "config.toml");
  hetrain::fuzz::expect_only_errors([&] {
    hetrain::training::TrainConfig cfg = hetrain::training::preset_config("fashion-mlp");
    hetrain::training::apply_toml_file(cfg, path);
    hetrain::training::validate(cfg);
    (void)hetrain::training::config_to_toml(cfg);
  });
  return 0;
}
