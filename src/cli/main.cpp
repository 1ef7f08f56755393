#include <exception>
#include <iostream>

#include "cli/commands.h"
#include "hetrain/base/error.h"
#include "hetrain/insight/device_profile.h"

namespace hetrain::cli {

const std::vector<Command>& commands() {
  static const std::vector<Command> cmds = {
      {"train", "train a model on this machine (presets fashion-mlp, fashion-cnn, gpt-mini)",
       cmd_train},
      {"export", "write a trained checkpoint as an ONNX model (inference form)", cmd_export},
      {"checkpoint", "inspect a checkpoint; consolidate a sharded (ZeRO) one into a plain one",
       cmd_checkpoint},
      {"run", "run an ONNX model on input files; compare with expected outputs", cmd_run},
      {"plan", "memory, time and cost of a training job; search hardware and strategy", cmd_plan},
      {"profile", "per-primitive time, FLOPs, bytes and roofline of a few training steps; trace",
       cmd_profile},
      {"bench", "measure this machine's FMA peak, GEMM rates and memory bandwidth", cmd_bench},
      {"simulate", "predict a training step on a set of devices (the scheduler, no kernels)",
       cmd_simulate},
      {"perfmodel", "show or clear the kernel-time models the scheduler learned", cmd_perfmodel},
      {"topo", "this machine's topology (hwloc) and, under mpirun, each rank's CPUs and threads",
       cmd_topo},
      {"version", "print the version, backends and CPU features", cmd_version},
  };
  return cmds;
}

const insight::PathChoiceNotes& path_choices() {
  static const insight::PathChoiceNotes notes =
      insight::apply_path_choices(insight::device_profile_path());
  return notes;
}

namespace {
void print_help() {
  std::cout << "usage: hetrain <command> [flags]\n\n"
               "Hetrain trains neural networks on the processors you have and plans the\n"
               "hardware a bigger job needs.\n\ncommands:\n";
  for (const auto& c : commands()) {
    std::string n = c.name;
    std::cout << "  " << n << std::string(n.size() < 12 ? 12 - n.size() : 1, ' ') << c.summary
              << "\n";
  }
  std::cout << "\n'hetrain <command> --help' explains a command's flags.\n";
}
}  // namespace

}  // namespace hetrain::cli

int main(int argc, char** argv) {
  using namespace hetrain::cli;
  Args args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
    print_help();
    return args.empty() ? 2 : 0;
  }
  if (args[0] == "--version") args[0] = "version";
  for (const auto& c : commands()) {
    if (args[0] == c.name) {
      try {
        path_choices();  // the f32 GEMM library and conv kernels 'hetrain bench' measured faster
        return c.run(Args(args.begin() + 1, args.end()));
      } catch (const hetrain::Error& e) {
        std::cerr << "hetrain " << c.name << ": error: " << e.what() << "\n";
        return 1;
      } catch (const std::exception& e) {
        std::cerr << "hetrain " << c.name << ": unexpected error: " << e.what() << "\n";
        return 1;
      }
    }
  }
  std::cerr << "hetrain: unknown command '" << args[0] << "'; see 'hetrain --help'\n";
  return 2;
}
