// Collective timings measured on this machine by `mpirun -np N hetrain bench --comm`, kept in
// the device profile (its "comm" array, one table per world size), and what the planner and
// `hetrain simulate --ranks N` charge a data-parallel step for them.
//
//   CommTable t = CommTable::from_json(profile["comm"][0], "device profile comm[0]");
//   double s = t.seconds("ddp_fixed_order", 4 << 20);  // one 4 MiB bucket's reduction
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace hetrain::planning {

/// The collective the trainer reduces each gradient bucket with (all-to-all of shards,
/// rank-order sum, all-gather: distributed/grad_reducer.h), as bench --comm names it.
inline constexpr const char* kDdpReduceOp = "ddp_fixed_order";

struct CommTable {
  int world_size = 0;
  std::string backend, date;
  /// Per collective: (bytes, seconds per call) in increasing bytes.
  std::map<std::string, std::vector<std::pair<double, double>>> ops;

  /// Seconds of one call of `op` on `bytes`: linear between the measured sizes; below the
  /// smallest its time (the latency floor); above the largest, the last two sizes' line
  /// extended (their bandwidth). Throws Error when the table has no such op.
  double seconds(const std::string& op, double bytes) const;

  /// {"world_size", "backend", "date", "rows": [{"op", "bytes", "seconds", ...}]}, as bench
  /// --comm writes it. Throws Error naming `where` and the field for a bad table.
  static CommTable from_json(const nlohmann::json& j, const std::string& where);
};

/// Reads a device profile's optional "comm" array (nothing when absent).
std::vector<CommTable> comm_tables_from_json(const nlohmann::json& profile,
                                             const std::string& where);

/// The table measured on `world_size` ranks, or nullptr.
const CommTable* find_comm_table(const std::vector<CommTable>& tables, int world_size);

/// "2, 4" (the world sizes tables exist for) or "none".
std::string comm_table_sizes(const std::vector<CommTable>& tables);

/// A data-parallel step's gradient reduction from measured timings: every bucket reduced by
/// kDdpReduceOp. On CPU ranks the collectives' copies and sums run on the cores backward
/// uses (the trainer polls them from the executor), so overlap hides waiting, not work:
/// the whole time is charged to the step.
struct DdpCommTime {
  double total_s = 0;  // sum over the buckets
  double last_s = 0;   // the last bucket's (it can only start once backward has ended)
  int buckets = 0;
};
DdpCommTime ddp_comm_time(const CommTable& t, const std::vector<double>& bucket_bytes);

/// The trainer's bucket sizes for `grad_bytes` of f32 gradients when no parameter is larger
/// than a bucket: first_mb MiB, then bucket_mb MiB each, the rest last.
std::vector<double> uniform_buckets(double grad_bytes, double first_mb, double bucket_mb);

}  // namespace hetrain::planning
