#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>

#include "cli/args.h"
#include "cli/commands.h"
#include "hetrain/base/error.h"
#include "hetrain/base/file_input.h"
#include "hetrain/base/thread_pool.h"
#include "hetrain/insight/device_profile.h"

namespace hetrain::cli {

int cmd_bench(const Args& args) {
  ArgParser p("bench",
              "Measure this machine's ceilings: the FMA peak (register-only loop), GEMM rates\n"
              "per dtype through hetrain::matmul and memory bandwidth (STREAM triad). Writes\n"
              "the device profile that 'hetrain plan' uses as hardware 'local' to\n"
              "$XDG_CACHE_HOME/hetrain/device_profile.json (default ~/.cache/hetrain).");
  p.option("json", "FILE", "also write the device profile to FILE")
      .option("threads", "N", "worker threads (0: every core)", "0")
      .flag("quick", "a short run (about 2 s): fewer repetitions, GEMM at n=1024 only")
      .flag("no-store", "do not write the profile to the cache directory")
      .flag("comm",
            "instead: collective bandwidth (all-reduce, reduce-scatter, all-gather and the "
            "trainer's fixed-order reduction) over the ranks of mpirun, 1 KiB to 64 MiB "
            "(--quick: to 4 MiB), stored in the device profile as the timings of this many "
            "ranks (plan --hardware local --gpus N and simulate --ranks N use them); --json "
            "FILE also writes the table")
      .epilog(
          "examples:\n  hetrain bench\n  hetrain bench --quick --json profile.json\n"
          "  mpirun -np 2 hetrain bench --comm --json comm.json");
  if (!p.parse(args)) return 0;
  if (!p.positional().empty())
    fail("[bench] unexpected argument '", p.positional()[0], "'; see 'hetrain bench --help'");

  // Every output is checked before any measurement.
  const bool store = !p.get_flag("no-store");
  const std::string cache = store ? insight::device_profile_path() : "";
  if (store) insight::check_writable(cache, "device profile");
  if (p.get_flag("comm")) {
    if (p.given("json")) insight::check_writable(p.get("json"), "--json file");
    return bench_comm(p.get_flag("quick"), p.given("json") ? p.get("json") : "", cache);
  }
  if (p.given("json")) insight::check_writable(p.get("json"), "--json file");
  int threads = 0;
  try {
    threads = std::stoi(p.get("threads"));
  } catch (const std::exception&) {
    fail("[bench] --threads must be an integer, got '", p.get("threads"), "'");
  }
  if (threads < 0) fail("[bench] --threads must be >= 0");
  set_num_threads(threads);
  if (store) {
    insight::DeviceProfile old;
    std::string why;
    if (std::ifstream(cache) && !insight::load_device_profile(cache, 0, &old, &why))
      std::fprintf(stderr, "warning: %s; it will be replaced\n", why.c_str());
  }

  // The collective timings of an earlier 'bench --comm' stay in the profile.
  nlohmann::json comm;
  if (store && std::ifstream(cache)) {
    try {
      const nlohmann::json old = read_json_file(cache, "device profile");
      if (old.is_object() && old.contains("comm")) comm = old["comm"];
    } catch (const std::exception&) {  // a corrupt profile (warned about above) is replaced
    }
  }
  insight::DeviceProfile prof = insight::measure_device({.quick = p.get_flag("quick")});
  std::printf("%s, %s, %.1f GiB memory, %s\n", prof.name.c_str(), prof.isa.c_str(),
              prof.mem_bytes / (1024.0 * 1024.0 * 1024.0), prof.date.c_str());
  int width = 32;  // the longest measurement's name: the columns line up
  for (const auto& r : prof.rows) width = std::max(width, static_cast<int>(r.what.size()));
  std::printf("%-*s %10s %-8s %10s  %s\n", width, "measurement", "rate", "unit", "best ms", "path");
  for (const auto& r : prof.rows)
    std::printf("%-*s %10.1f %-8s %10.2f  %s\n", width, r.what.c_str(), r.value, r.unit.c_str(),
                r.seconds * 1e3, r.path.c_str());
  std::printf("roofline ridge point: %.1f FLOP/byte (FMA peak / triad, both per CPU second)\n",
              prof.ridge_flop_per_byte());
  std::printf("f32 GEMM reaches %.0f%% of the FMA peak per CPU second (%.0f%% per wall second)\n",
              100.0 * prof.gemm_f32_cpu_gflops / prof.fma_peak_gflops,
              100.0 * prof.gemm_f32_tflops * 1e3 / prof.fma_peak_gflops);
  if (const double c = prof.gemm_ceiling_gflops(Dtype::bf16); c > 0)
    std::printf("bf16 GEMM reaches %.0f%% of the %s peak per wall second (%s)\n",
                100.0 * prof.gemm_bf16_tflops * 1e3 / c,
                c == prof.fma_peak_gflops ? prof.isa.c_str() : prof.bf16_isa.c_str(),
                prof.gemm_bf16_impl.empty() ? "converted to f32" : prof.gemm_bf16_impl.c_str());
  const auto j = prof.to_json();
  if (store) {
    nlohmann::json stored = j;
    if (!comm.is_null()) stored["comm"] = comm;
    insight::write_json_atomic(cache, stored);
    std::printf("device profile: %s\n", cache.c_str());
  }
  if (p.given("json")) {
    insight::write_json_atomic(p.get("json"), j);
    std::printf("device profile: %s\n", p.get("json").c_str());
  }
  return 0;
}

}  // namespace hetrain::cli
