#include "hetrain/planning/comm_table.h"

#include <algorithm>
#include <cmath>

#include "hetrain/base/error.h"
#include "hetrain/base/file_input.h"

namespace hetrain::planning {

using nlohmann::json;

double CommTable::seconds(const std::string& op, double bytes) const {
  auto it = ops.find(op);
  if (it == ops.end() || it->second.empty())
    fail("[plan] the collective timings for ", world_size, " ranks have no '", op,
         "' rows (run 'mpirun -np ", world_size, " hetrain bench --comm' again)");
  const auto& pts = it->second;
  if (bytes <= pts.front().first || pts.size() == 1) return pts.front().second;
  size_t hi = 1;
  while (hi + 1 < pts.size() && pts[hi].first < bytes) ++hi;
  const auto& [x0, y0] = pts[hi - 1];
  const auto& [x1, y1] = pts[hi];
  const double t = y0 + (y1 - y0) * (bytes - x0) / (x1 - x0);
  return std::max(t, 0.0);
}

CommTable CommTable::from_json(const json& j, const std::string& where) {
  if (!j.is_object()) fail("[plan] ", where, ": expected an object");
  CommTable t;
  auto ws = j.find("world_size");
  if (ws == j.end() || !ws->is_number_integer() || ws->get<int64_t>() < 1 ||
      ws->get<int64_t>() > 1000000)
    fail("[plan] ", where, ": field 'world_size' must be an integer in [1, 1000000]");
  t.world_size = ws->get<int>();
  t.backend = json_string(j, "backend", "", "[plan] " + where);
  t.date = json_string(j, "date", "", "[plan] " + where);
  auto rows = j.find("rows");
  if (rows == j.end() || !rows->is_array() || rows->empty())
    fail("[plan] ", where, ": field 'rows' must be a non-empty array");
  for (size_t i = 0; i < rows->size(); ++i) {
    const json& r = (*rows)[i];
    const std::string at = where + " rows[" + std::to_string(i) + "]";
    if (!r.is_object() || !r.contains("op") || !r["op"].is_string())
      fail("[plan] ", at, ": expected an object with a string 'op'");
    double v[2] = {0, 0};
    const char* keys[2] = {"bytes", "seconds"};
    for (int k = 0; k < 2; ++k) {
      if (!r.contains(keys[k]) || !r[keys[k]].is_number())
        fail("[plan] ", at, ": field '", keys[k], "' must be a number");
      v[k] = r[keys[k]].get<double>();
      if (!(v[k] > 0 && v[k] < 1e15))
        fail("[plan] ", at, ": field '", keys[k], "' must be in (0, 1e15), got ", v[k]);
    }
    t.ops[r["op"].get<std::string>()].emplace_back(v[0], v[1]);
  }
  for (auto& [op, pts] : t.ops) {
    std::sort(pts.begin(), pts.end());
    for (size_t i = 1; i < pts.size(); ++i)
      if (pts[i].first == pts[i - 1].first)
        fail("[plan] ", where, ": op '", op, "' has two rows for ", pts[i].first, " bytes");
  }
  return t;
}

std::vector<CommTable> comm_tables_from_json(const json& profile, const std::string& where) {
  std::vector<CommTable> out;
  auto it = profile.find("comm");
  if (it == profile.end()) return out;
  if (!it->is_array()) fail("[plan] ", where, ": field 'comm' must be an array of tables");
  for (size_t i = 0; i < it->size(); ++i) {
    CommTable t = CommTable::from_json((*it)[i], where + " comm[" + std::to_string(i) + "]");
    if (find_comm_table(out, t.world_size))
      fail("[plan] ", where, ": two 'comm' tables for ", t.world_size, " ranks");
    out.push_back(std::move(t));
  }
  return out;
}

const CommTable* find_comm_table(const std::vector<CommTable>& tables, int world_size) {
  for (const auto& t : tables)
    if (t.world_size == world_size) return &t;
  return nullptr;
}

std::string comm_table_sizes(const std::vector<CommTable>& tables) {
  std::string s;
  for (const auto& t : tables) s += (s.empty() ? "" : ", ") + std::to_string(t.world_size);
  return s.empty() ? "none" : s;
}

DdpCommTime ddp_comm_time(const CommTable& t, const std::vector<double>& bucket_bytes) {
  DdpCommTime r;
  for (double b : bucket_bytes) {
    r.last_s = t.seconds(kDdpReduceOp, b);
    r.total_s += r.last_s;
    ++r.buckets;
  }
  return r;
}

std::vector<double> uniform_buckets(double grad_bytes, double first_mb, double bucket_mb) {
  std::vector<double> out;
  const double first = first_mb * 1048576.0, size = bucket_mb * 1048576.0;
  if (!(grad_bytes > 0) || !(first > 0) || !(size > 0)) return out;
  out.push_back(std::min(grad_bytes, first));
  double left = grad_bytes - out.back();
  // At most a million buckets: a bucket size far below the gradients' is a typo.
  while (left > 0 && out.size() < 1000000) {
    out.push_back(std::min(left, size));
    left -= out.back();
  }
  return out;
}

}  // namespace hetrain::planning
