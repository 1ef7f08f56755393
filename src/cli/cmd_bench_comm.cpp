// hetrain bench --comm: collective bandwidth over the world's ranks (NCCL-tests conventions).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <vector>

#include "cli/commands.h"
#include "hetrain/base/error.h"
#include "hetrain/base/file_input.h"
#include "hetrain/distributed/grad_reducer.h"
#include "hetrain/distributed/mpi.h"
#include "hetrain/graph/ops.h"
#include "hetrain/insight/device_profile.h"

namespace hetrain::cli {

namespace {

using Clock = std::chrono::steady_clock;
using distributed::Communicator;

/// Seconds per call of fn (mean over iterations after one warm-up), the slowest rank's.
template <class F>
double time_collective(Communicator& c, int iters, F&& fn) {
  fn();
  c.barrier();
  const auto t0 = Clock::now();
  for (int i = 0; i < iters; ++i) fn();
  double s = std::chrono::duration<double>(Clock::now() - t0).count() / iters;
  c.all_reduce(&s, 1, Dtype::f64, distributed::ReduceOp::max);
  return s;
}

/// The device profile at `path` with `table` as its "comm" table for table's world size (an
/// older one for that size replaced). A missing or unreadable profile becomes one holding
/// only the table (hetrain bench adds the rest and keeps the table).
void store_comm_table(const std::string& path, const nlohmann::json& table) {
  nlohmann::json prof = nlohmann::json{{"version", 1}};
  if (std::ifstream(path)) {
    try {
      prof = read_json_file(path, "device profile");
      if (!prof.is_object()) fail("not a JSON object");
    } catch (const std::exception& e) {
      std::fprintf(stderr, "warning: device profile %s: %s; it will hold only the timings\n",
                   path.c_str(), e.what());
      prof = nlohmann::json{{"version", 1}};
    }
  }
  nlohmann::json comm = nlohmann::json::array();
  if (prof.contains("comm") && prof["comm"].is_array())
    for (const auto& t : prof["comm"])
      if (!t.is_object() || t.find("world_size") == t.end() ||
          t["world_size"] != table["world_size"])
        comm.push_back(t);
  comm.push_back(table);
  prof["comm"] = comm;
  insight::write_json_atomic(path, prof);
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

}  // namespace

int bench_comm(bool quick, const std::string& json_path, const std::string& profile_path) {
  std::unique_ptr<Communicator> c = distributed::make_world_communicator({.timeout_s = 120});
  const int n = c->size();
  const bool leader = c->rank() == 0;
  const int64_t max_bytes = quick ? (int64_t{4} << 20) : (int64_t{64} << 20);
  nlohmann::json rows = nlohmann::json::array();
  if (leader) {
    std::printf("collectives over %d rank(s) (%s); algbw = bytes / time, busbw as NCCL-tests\n", n,
                c->backend());
    std::printf("%-16s %12s %12s %12s %12s\n", "op", "bytes", "time us", "algbw GB/s",
                "busbw GB/s");
  }
  for (int64_t bytes = 1024; bytes <= max_bytes; bytes *= 4) {
    const int64_t count = std::max<int64_t>(n, bytes / 4 / n * n);  // f32, divisible by n
    const int iters = static_cast<int>(std::clamp<int64_t>((int64_t{64} << 20) / bytes, 3, 200)) /
                          (quick ? 4 : 1) +
                      1;
    std::vector<float> a(static_cast<size_t>(count), 1.0f), b(static_cast<size_t>(count));
    const double f = n > 1 ? static_cast<double>(n - 1) / n : 1.0;
    struct Op {
      const char* name;
      double bus_factor;
      std::function<void()> run;
    };
    Tensor w = zeros({count});
    w.eval();
    w.requires_grad_();
    std::vector<Tensor*> params = {&w};
    distributed::GradReducer reducer(params, *c, {.bucket_mb = 1e6, .first_bucket_mb = 1e6});
    const std::vector<Op> ops = {
        {"all_reduce", 2 * f,
         [&] { c->all_reduce(a.data(), count, Dtype::f32, distributed::ReduceOp::sum); }},
        {"reduce_scatter", f,
         [&] {
           c->reduce_scatter(a.data(), b.data(), count / n, Dtype::f32, distributed::ReduceOp::sum);
         }},
        {"all_gather", f, [&] { c->all_gather(a.data(), b.data(), count / n, Dtype::f32); }},
        // The trainer's deterministic reduction (all-to-all, rank-order sum, all-gather) with
        // its copies in and out of the bucket.
        {"ddp_fixed_order", 2 * f,
         [&] {
           w.set_grad(from_blob(a.data(), {count}, Dtype::f32));
           reducer.accumulate(true);
           reducer.reduce(n);
         }},
    };
    for (const Op& op : ops) {
      const double s = time_collective(*c, iters, op.run);
      const double total = static_cast<double>(count) * 4;
      const double algbw = total / s / 1e9;
      if (leader)
        std::printf("%-16s %12lld %12.1f %12.3f %12.3f\n", op.name, static_cast<long long>(total),
                    s * 1e6, algbw, algbw * op.bus_factor);
      rows.push_back({{"op", op.name},
                      {"bytes", total},
                      {"seconds", s},
                      {"algbw_gbps", algbw},
                      {"busbw_gbps", algbw * op.bus_factor}});
    }
  }
  const nlohmann::json table = {
      {"world_size", n}, {"backend", c->backend()}, {"date", utc_now()}, {"rows", rows}};
  if (leader && !json_path.empty()) {
    insight::write_json_atomic(json_path, table);
    std::printf("collective bandwidth: %s\n", json_path.c_str());
  }
  if (leader && !profile_path.empty()) {
    store_comm_table(profile_path, table);
    std::printf("device profile: %s (collective timings of %d rank(s))\n", profile_path.c_str(), n);
  }
  return 0;
}

}  // namespace hetrain::cli
