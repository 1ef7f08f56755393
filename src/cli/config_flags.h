// Building a training configuration from a subcommand's flags (train, profile, simulate).
#pragma once

#include <span>

#include "cli/args.h"
#include "hetrain/training/trainer.h"

namespace hetrain::cli {

/// The --preset's defaults, then the --config file's keys, then each of `flags` that was
/// given on the command line (each later source wins); errors name the flag or file key and
/// start with p's subcommand ("[profile] flag --precision: ...").
training::TrainConfig config_from_flags(const ArgParser& p, std::span<const char* const> flags);

}  // namespace hetrain::cli
