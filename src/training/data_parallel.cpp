// Data-parallel helpers of the trainer.
#include "training/data_parallel.h"

#include "hetrain/base/error.h"
#include "hetrain/graph/ops.h"

namespace hetrain::training {

namespace {
void broadcast_tensor(Tensor& t, distributed::Communicator& comm) {
  const bool rg = t.requires_grad();
  const Dtype dt = t.dtype();
  if (dt != Dtype::f32 && dt != Dtype::i64)
    fail("[ddp] cannot broadcast a ", dtype_name(dt), " parameter or buffer");
  Tensor fresh;
  if (dt == Dtype::f32) {
    std::vector<float> v = t.to_vector<float>();
    comm.broadcast(v.data(), static_cast<int64_t>(v.size()), dt, 0);
    fresh = from_vector(v, t.shape());
  } else {
    std::vector<int64_t> v = t.to_vector<int64_t>();
    comm.broadcast(v.data(), static_cast<int64_t>(v.size()), dt, 0);
    fresh = from_vector(v, t.shape());
  }
  fresh.eval();
  if (rg) fresh.requires_grad_(true);
  t = fresh;
}
}  // namespace

void broadcast_model(nn::Module& model, distributed::Communicator& comm) {
  if (comm.size() == 1) return;
  comm.set_context({-1, "broadcast of rank 0's parameters and buffers"});
  for (auto& [name, p] : model.named_parameters()) broadcast_tensor(*p, comm);
  for (auto& [name, b] : model.named_buffers()) broadcast_tensor(*b, comm);
}

void check_agree(distributed::Communicator& comm, int64_t v, const char* what) {
  if (comm.size() == 1) return;
  std::vector<int64_t> all(static_cast<size_t>(comm.size()));
  comm.set_context({-1, std::string("agreement on ") + what});
  comm.all_gather(&v, all.data(), 1, Dtype::i64);
  for (int64_t x : all)
    if (x != all[0]) {
      std::string list;
      for (size_t r = 0; r < all.size(); ++r)
        list += (r ? ", " : "") + std::string("rank ") + std::to_string(r) + ": " +
                std::to_string(all[r]);
      fail("[ddp] the ranks disagree on ", what, " (", list,
           "); give every rank the same settings");
    }
}

bool parameters_identical(nn::Module& model, distributed::Communicator& comm) {
  uint64_t h = 1469598103934665603ull;
  for (auto& [name, p] : model.named_parameters()) {
    const std::vector<float> v = p->to_vector<float>();
    const auto* bytes = reinterpret_cast<const unsigned char*>(v.data());
    for (size_t i = 0; i < v.size() * sizeof(float); ++i) h = (h ^ bytes[i]) * 1099511628211ull;
  }
  std::vector<int64_t> all(static_cast<size_t>(comm.size()));
  const auto mine = static_cast<int64_t>(h);
  comm.set_context({-1, "all_gather of the parameters' hashes"});
  comm.all_gather(&mine, all.data(), 1, Dtype::i64);
  for (int64_t x : all)
    if (x != all[0]) return false;
  return true;
}

double global_mean_loss(distributed::Communicator& comm, const std::vector<double>& local) {
  std::vector<double> all(local.size() * static_cast<size_t>(comm.size()));
  comm.all_gather(local.data(), all.data(), static_cast<int64_t>(local.size()), Dtype::f64);
  double s = 0;
  for (double x : all) s += x;
  return s / static_cast<double>(all.size());
}

nlohmann::json rank_memory(distributed::Communicator& comm, const MemoryStats& stats,
                           const std::array<int64_t, kNumMemoryTags>* at_update,
                           const std::array<int64_t, kNumMemoryTags>* at_update_device) {
  constexpr size_t T = kNumMemoryTags;
  const size_t n = 4 * T + 1;
  std::vector<int64_t> mine(n, 0), all(n * static_cast<size_t>(comm.size()));
  for (size_t t = 0; t < T; ++t) {
    mine[t] = stats.peak[t];
    if (at_update) mine[T + t] = (*at_update)[t];
    mine[2 * T + t] = stats.at_peak[t];
    if (at_update_device) mine[3 * T + t] = (*at_update_device)[t];
  }
  mine[n - 1] = stats.peak_total;
  comm.set_context({-1, "all_gather of the ranks' memory statistics"});
  comm.all_gather(mine.data(), all.data(), static_cast<int64_t>(n), Dtype::i64);
  // Tags by name from v[0, T), with the model states' sum.
  auto by_tag = [](const int64_t* v, bool states) {
    nlohmann::json j = nlohmann::json::object();
    for (size_t t = 0; t < T; ++t)
      j[std::string(memory_tag_name(static_cast<MemoryTag>(t)))] = v[t];
    if (states) j["model_states"] = v[0] + v[1] + v[2];
    return j;
  };
  nlohmann::json out = nlohmann::json::array();
  for (int r = 0; r < comm.size(); ++r) {
    const int64_t* v = all.data() + static_cast<size_t>(r) * n;
    nlohmann::json peak = by_tag(v, false);
    peak["total"] = v[n - 1];
    // peak_bytes: each tag's own peak; at_peak_bytes: what was live when the total peaked.
    nlohmann::json rec = {
        {"rank", r}, {"peak_bytes", peak}, {"at_peak_bytes", by_tag(v + 2 * T, false)}};
    if (at_update) rec["at_update_bytes"] = by_tag(v + T, true);
    if (at_update_device) rec["at_update_device_bytes"] = by_tag(v + 3 * T, true);
    out.push_back(rec);
  }
  return out;
}

}  // namespace hetrain::training
