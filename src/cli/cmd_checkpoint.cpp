// hetrain checkpoint: what a checkpoint directory holds, and a sharded (ZeRO) checkpoint
// consolidated into a plain one.
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli/args.h"
#include "cli/commands.h"
#include "hetrain/base/error.h"
#include "hetrain/training/checkpoint.h"

namespace hetrain::cli {

namespace {

namespace ckpt = training::checkpoint;

int64_t elements(const safetensors::File& f) {
  int64_t n = 0;
  for (const auto& [name, t] : f.tensors) n += t.numel();
  return n;
}

nlohmann::json info_json(const std::string& dir, const ckpt::Contents& c) {
  nlohmann::json j = {{"dir", dir},
                      {"version", c.version},
                      {"step", c.step},
                      {"sharded", c.version == 3},
                      {"world_size", c.world_size},
                      {"stage", c.stage},
                      {"shards", c.shard_files},
                      {"parts", nlohmann::json::object()}};
  for (const auto& [name, f] : c.parts) {
    nlohmann::json tensors = nlohmann::json::object();
    for (const auto& [tn, t] : f.tensors)
      tensors[tn] = {{"dtype", dtype_name(t.dtype())}, {"shape", t.shape()}};
    j["parts"][name] = {{"file", c.files.at(name)},
                        {"tensors", tensors},
                        {"elements", elements(f)},
                        {"metadata", f.metadata}};
  }
  return j;
}

void print_info(const std::string& dir, const ckpt::Contents& c) {
  std::printf("checkpoint %s: step %lld, format version %d\n", dir.c_str(),
              static_cast<long long>(c.step), c.version);
  if (c.version == 3) {
    std::printf("sharded: %d shard(s) written by %d rank(s) under ZeRO stage %d\n",
                static_cast<int>(c.shard_files.size()), c.world_size, c.stage);
    for (size_t r = 0; r < c.shard_files.size(); ++r)
      std::printf("  shard %zu: %s\n", r, c.shard_files[r].c_str());
  } else {
    std::printf("plain: one file per part (one process wrote it)\n");
  }
  for (const auto& [name, f] : c.parts) {
    std::printf("part %s: %zu tensor(s), %lld element(s)%s%s\n", name.c_str(), f.tensors.size(),
                static_cast<long long>(elements(f)), c.version == 3 ? "" : ", ",
                c.version == 3 ? "" : c.files.at(name).c_str());
    for (const auto& [tn, t] : f.tensors)
      std::printf("  %-40s %-5s %s\n", tn.c_str(), std::string(dtype_name(t.dtype())).c_str(),
                  shape_str(t.shape()).c_str());
  }
}

}  // namespace

int cmd_checkpoint(const Args& args) {
  ArgParser p("checkpoint",
              "Inspect a checkpoint directory, or consolidate a sharded one.\n"
              "  info DIR                 the step, the shards (rank count, ZeRO stage) and\n"
              "                           every part's tensors; every file is checked against\n"
              "                           the index (sizes, CRC-32s, pieces covering each tensor)\n"
              "  consolidate DIR -o OUT   one plain checkpoint in OUT that a single process\n"
              "                           resumes (--resume OUT) or exports\n"
              "usage: hetrain checkpoint info|consolidate DIR [flags]");
  p.option("output", "DIR", "consolidate: the output checkpoint directory (also -o DIR)")
      .flag("json", "info: print as JSON")
      .epilog(
          "examples:\n  hetrain checkpoint info run/ckpt\n"
          "  hetrain checkpoint consolidate run/ckpt -o run/plain\n"
          "  hetrain train --preset gpt-mini --resume run/plain --steps 200");
  Args a = args;
  for (std::string& s : a)
    if (s == "-o") s = "--output";
  if (!p.parse(a)) return 0;
  const auto& pos = p.positional();
  if (pos.size() != 2 || (pos[0] != "info" && pos[0] != "consolidate"))
    fail(
        "[checkpoint] expected 'info DIR' or 'consolidate DIR -o OUT'; see 'hetrain checkpoint "
        "--help'");
  const std::string& dir = pos[1];
  if (pos[0] == "info") {
    const ckpt::Contents c = ckpt::read(dir);
    if (p.get_flag("json"))
      std::cout << info_json(dir, c).dump(2) << "\n";
    else
      print_info(dir, c);
    return 0;
  }
  if (!p.given("output")) fail("[checkpoint] consolidate needs -o OUT, the directory to write");
  const std::string out = p.get("output");
  const ckpt::Contents c = ckpt::read(dir);
  std::vector<ckpt::Part> parts;
  for (const auto& [name, f] : c.parts) {
    ckpt::Part part{name, {}, f.metadata};
    for (const auto& [tn, t] : f.tensors) part.tensors.emplace_back(tn, t);
    parts.push_back(std::move(part));
  }
  ckpt::write(out, c.step, parts);
  std::printf("consolidated %s (step %lld, %d shard(s)) into %s\n", dir.c_str(),
              static_cast<long long>(c.step), static_cast<int>(c.shard_files.size()), out.c_str());
  return 0;
}

}  // namespace hetrain::cli
