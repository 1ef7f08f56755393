#include "cli/config_flags.h"

namespace hetrain::cli {

training::TrainConfig config_from_flags(const ArgParser& p, std::span<const char* const> flags) {
  training::TrainConfig cfg = training::preset_config(p.get("preset"), p.command());
  if (p.given("config"))
    training::apply_toml_file(cfg, p.get("config"), !p.given("preset"), p.command());
  for (const char* f : flags)
    if (p.given(f))
      training::apply_setting(cfg, f, p.get(f), "flag --" + std::string(f), p.command());
  return cfg;
}

}  // namespace hetrain::cli
