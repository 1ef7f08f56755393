// The subcommands of the hetrain binary. Each lives in its own cmd_*.cpp.
#pragma once

#include <string>
#include <vector>

#include "hetrain/insight/device_profile.h"

namespace hetrain::cli {

using Args = std::vector<std::string>;

struct Command {
  const char* name;
  const char* summary;
  int (*run)(const Args& args);
};

int cmd_version(const Args& args);
int cmd_topo(const Args& args);
/// `hetrain bench --comm`: collective bandwidth over the ranks of an mpirun (or one process);
/// rank 0 writes the table to json_path (if not empty) and stores it in the device profile at
/// profile_path (if not empty) as its "comm" table for this world size.
int bench_comm(bool quick, const std::string& json_path, const std::string& profile_path);
int cmd_train(const Args& args);
int cmd_plan(const Args& args);
int cmd_bench(const Args& args);
int cmd_profile(const Args& args);
int cmd_simulate(const Args& args);
int cmd_perfmodel(const Args& args);
int cmd_export(const Args& args);
int cmd_run(const Args& args);
int cmd_checkpoint(const Args& args);

/// Every subcommand, in the order `hetrain --help` lists them.
const std::vector<Command>& commands();

/// The f32 GEMM library and convolution kernels this machine's device profile found faster,
/// taken on the first call (main() calls it before every command); returns the timings behind
/// each choice, or why the built-in rule stays (insight::apply_path_choices).
const insight::PathChoiceNotes& path_choices();

}  // namespace hetrain::cli
