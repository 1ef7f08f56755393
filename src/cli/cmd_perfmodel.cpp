// hetrain perfmodel: the performance models the scheduler learned on this machine.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "cli/args.h"
#include "cli/commands.h"
#include "hetrain/base/error.h"
#include "hetrain/runtime/perf_model.h"

namespace hetrain::cli {

int cmd_perfmodel(const Args& args) {
  ArgParser p("perfmodel",
              "Show or clear the performance models: kernel times per (primitive, device class,\n"
              "dtype) measured by 'hetrain train' and used by the scheduler and 'hetrain\n"
              "simulate'. History answers sizes seen (trusted with >= 3 samples whose mean is\n"
              "known to 10%: standard error / mean <= 0.1); the regression a*size^b + c answers\n"
              "sizes not seen (trusted with >= 3 trusted sizes and <= 25% RMS error, within 4x\n"
              "of them).\nusage: hetrain perfmodel show|clear [flags]");
  p.option("file", "PATH", "model file (default $XDG_CACHE_HOME/hetrain/perfmodel.json)")
      .option("sort", "KEY",
              "order of the table: name (primitive, device, dtype) or time (the kernel time "
              "recorded, most first: where the measured runs' time went)",
              "name")
      .flag("json", "print the models as JSON")
      .epilog(
          "examples:\n  hetrain perfmodel show\n  hetrain perfmodel show --sort time\n"
          "  hetrain perfmodel show --json\n  hetrain perfmodel clear");
  if (!p.parse(args)) return 0;
  if (p.positional().size() != 1 || (p.positional()[0] != "show" && p.positional()[0] != "clear"))
    fail("[perfmodel] expected 'show' or 'clear'; see 'hetrain perfmodel --help'");
  const std::string sort = p.get("sort");
  if (sort != "name" && sort != "time")
    fail("[perfmodel] --sort must be name or time, got '", sort, "'");
  const std::string path = p.given("file") ? p.get("file") : runtime::perf_model_path();
  if (p.positional()[0] == "clear") {
    std::error_code ec;
    const bool removed = std::filesystem::remove(path, ec);
    if (ec) fail("[perfmodel] cannot remove ", path, ": ", ec.message());
    std::printf("%s %s\n", removed ? "removed" : "no file at", path.c_str());
    return 0;
  }
  if (p.given("file") && !std::filesystem::exists(path))
    fail("[perfmodel] --file ", path, " does not exist");
  runtime::PerfModels models;
  const std::string warn = models.load(path);
  if (!warn.empty()) std::fprintf(stderr, "warning: %s\n", warn.c_str());
  const nlohmann::json j = models.to_json();
  if (p.get_flag("json")) {
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::printf("performance models: %s (%s)\n", path.c_str(), runtime::machine_id().c_str());
  if (j["models"].empty()) {
    std::printf("no models yet: 'hetrain train' records kernel times as it runs\n");
    return 0;
  }
  struct Row {
    std::string prim, device, dtype, fit;
    int64_t sizes = 0, trusted = 0, samples = 0;
    double seconds = 0;  // kernel time recorded: samples x their mean, over the sizes
  };
  std::vector<Row> rows;
  std::map<std::string, double> by_device;
  int device_width = 8;
  for (const auto& m : j["models"]) {
    Row row{m["prim"], m["device"], m["dtype"], "-"};
    for (const auto& h : m["history"]) {
      ++row.sizes;
      row.trusted += h["trusted"].get<bool>();
      row.samples += h["n"].get<int64_t>();
      row.seconds += static_cast<double>(h["n"].get<int64_t>()) * h["mean_s"].get<double>();
    }
    const auto& r = m["regression"];
    char fit[96];
    if (r["rel_rms"].get<double>() < 1) {
      std::snprintf(fit, sizeof fit, "%.3g*s^%.3f+%.3g (%.0f%%)%s", r["a"].get<double>(),
                    r["b"].get<double>(), r["c"].get<double>(), 100 * r["rel_rms"].get<double>(),
                    r["trusted"].get<bool>() ? "" : " untrusted");
      row.fit = fit;
    }
    by_device[row.device] += row.seconds;
    device_width = std::max(device_width, static_cast<int>(row.device.size()));
    rows.push_back(std::move(row));
  }
  if (sort == "time")
    std::stable_sort(rows.begin(), rows.end(),
                     [](const Row& a, const Row& b) { return a.seconds > b.seconds; });
  std::printf("%-22s %-*s %-5s %6s %8s %8s %10s  %-34s\n", "primitive", device_width, "device",
              "dtype", "sizes", "trusted", "samples", "kernel s",
              "regression t = a*size^b + c (rms)");
  for (const Row& r : rows)
    std::printf("%-22s %-*s %-5s %6lld %8lld %8lld %10.4f  %s\n", r.prim.c_str(), device_width,
                r.device.c_str(), r.dtype.c_str(), static_cast<long long>(r.sizes),
                static_cast<long long>(r.trusted), static_cast<long long>(r.samples), r.seconds,
                r.fit.c_str());
  std::printf("kernel time recorded, by device:");
  for (const auto& [device, seconds] : by_device)
    std::printf(" %s %.4f s;", device.c_str(), seconds);
  std::printf(" (the samples the runs so far recorded, each timed alone)\n");
  return 0;
}

}  // namespace hetrain::cli
