// A step's memory predicted from its graph, and the auto recompute plan chosen with it.
#include "hetrain/training/memory_plan.h"

#include <algorithm>
#include <cstdio>
#include <numeric>

#include "hetrain/base/byte_size.h"
#include "hetrain/base/error.h"
#include "hetrain/base/thread_pool.h"
#include "hetrain/graph/autodiff.h"
#include "hetrain/graph/primitive.h"
#include "training/step.h"

namespace hetrain::training {

namespace {
constexpr auto kParams = static_cast<size_t>(MemoryTag::parameters);
constexpr auto kGrads = static_cast<size_t>(MemoryTag::gradients);
constexpr auto kState = static_cast<size_t>(MemoryTag::optimizer_state);
constexpr auto kActs = static_cast<size_t>(MemoryTag::activations);

double node_flops(const Node* n) {
  std::vector<TensorMeta> in, out;
  for (const Tensor& t : n->inputs) in.push_back({t.shape(), t.dtype()});
  for (const Array& a : n->outs) out.push_back({a.shape, a.dtype});
  return n->prim->cost(in, out).flops;
}
}  // namespace

StepMemory predict_step_memory(const Tensor& loss, const RecomputePolicy& policy,
                               const StepShape& shape) {
  StepMemory m;
  {
    std::vector<Tensor> targets;
    {
      RecomputeScope rc(policy);
      targets = gradient_graph(loss, {}, shape.with);
    }
    for (size_t i = 1; i + shape.with.size() < targets.size(); ++i)
      m.parameter_bytes +=
          targets[i].numel() * static_cast<int64_t>(dtype_size(targets[i].dtype()));
    // After the eval the buffers evaluated with it are detached (BatchNorm's running
    // statistics); clipping then replaces the gradients by scaled copies (new leaves).
    const size_t grads_end = targets.size() - shape.with.size();
    std::vector<char> with(targets.size(), 0), all(targets.size(), 0);
    for (size_t i = 1; i < targets.size(); ++i) {
      with[i] = i >= grads_end;
      all[i] = 1;
    }
    m.backward = runtime::predict_eval_memory(targets, true, {with, all});
  }
  const runtime::MemoryPrediction& b = m.backward;
  const int64_t p = m.parameter_bytes;
  const int64_t state = shape.state_slots * p;
  // Steady state: the optimizer's state is live from the second step on.
  const int64_t extra = shape.state_allocated ? 0 : state;
  m.start = b.start;
  m.peak = b.peak;
  m.start[kState] += extra;
  m.peak[kState] += extra;
  m.start_total = b.start_total + extra;
  m.peak_total = b.peak_total + extra;
  auto sum = [&](const std::array<int64_t, kNumMemoryTags>& a) {
    return std::accumulate(a.begin(), a.end(), int64_t{0}) + extra;
  };
  // After the eval the gradients are retagged and the running statistics detached; clipping
  // writes scaled copies, then the gradients' nodes go (their other outputs with them).
  const int64_t after_with = sum(b.detached[0]);
  m.peak[kGrads] = std::max(m.peak[kGrads], b.end[kGrads] + p * (shape.clip ? 2 : 1));
  m.peak_total = std::max(m.peak_total, after_with + (shape.clip ? p : 0));
  const int64_t before_update = shape.clip ? sum(b.detached[1]) : after_with;
  // The update: new parameters and state, all evaluated before the old ones are let go.
  m.peak[kParams] = std::max(m.peak[kParams], b.end[kParams] + p);
  m.peak[kState] = std::max(m.peak[kState], b.end[kState] + extra + state);
  m.peak_total = std::max(m.peak_total, before_update + p + state);
  return m;
}

std::string RecomputePlan::summary() const {
  char buf[400];
  const double share = forward_flops > 0 ? 100.0 * replayed_flops / forward_flops : 0.0;
  if (replayed_units == 0)
    std::snprintf(buf, sizeof buf, "%d units, none replayed; predicted peak %s", units,
                  format_bytes(memory.peak_total).c_str());
  else
    std::snprintf(buf, sizeof buf,
                  "%d units, %d replayed in %d segment(s) (%.3g GFLOP, %.0f%% of the forward); "
                  "predicted peak %s",
                  units, replayed_units, segments, replayed_flops * 1e-9, share,
                  format_bytes(memory.peak_total).c_str());
  return buf;
}

std::string RecomputePlan::announcement(int64_t budget) const {
  std::string s = "recompute auto (" +
                  (budget > 0 ? "budget " + format_bytes(budget)
                              : std::string("no --memory-budget: the least peak")) +
                  "): " + summary() + "\n";
  if (num_threads() > 1)
    s += "recompute auto: the peak is predicted for one worker's order; with " +
         std::to_string(num_threads()) +
         " threads the executor's order, hence the peak, varies from run to run "
         "(docs/PERFORMANCE.md): keep a margin under the capacity, or use --threads 1\n";
  return s;
}

namespace {

/// The units of loss's forward and what replaying each costs and saves.
struct UnitCosts {
  ForwardUnits units;
  std::vector<double> flops, bytes;  // per unit: forward FLOPs, output bytes of its nodes
  std::vector<double> cut_bytes;     // per unit but the last: the tensor crossing its end
};

UnitCosts unit_costs(const Tensor& loss) {
  UnitCosts c;
  c.units = forward_units(graph_order({loss}));
  const size_t k = static_cast<size_t>(c.units.units());
  c.flops.assign(k, 0);
  c.bytes.assign(k, 0);
  for (size_t i = 0; i < c.units.nodes.size(); ++i) {
    const Node* n = c.units.nodes[i];
    const auto u = static_cast<size_t>(c.units.unit_of[i]);
    c.flops[u] += node_flops(n);
    if (!n->prim->is_view())
      for (const Array& a : n->outs) c.bytes[u] += static_cast<double>(a.nbytes());
  }
  for (const Node* n : c.units.cut) {
    double b = 0;
    for (const Array& a : n->outs) b += static_cast<double>(a.nbytes());
    c.cut_bytes.push_back(b);
  }
  return c;
}

struct Candidate {
  RecomputePolicy policy;
  int replayed_units = 0, segments = 0;
  double flops = 0;
};

/// Replays `order`'s first n units, each its own segment.
Candidate per_unit(const UnitCosts& c, const std::vector<int>& order, size_t n) {
  Candidate k;
  k.policy.mode = RecomputeMode::automatic;
  k.policy.explicit_units = true;
  for (size_t i = 0; i < n; ++i) {
    k.policy.replayed_units.push_back(order[i]);
    k.flops += c.flops[static_cast<size_t>(order[i])];
  }
  for (int u = 0; u + 1 < c.units.units(); ++u) k.policy.segment_ends.push_back(u);
  k.replayed_units = k.segments = static_cast<int>(n);
  return k;
}

/// Replays every unit but the last, in segments of len units.
Candidate segments_of(const UnitCosts& c, int len) {
  Candidate k;
  k.policy.mode = RecomputeMode::automatic;
  k.policy.explicit_units = true;
  const int units = c.units.units();
  for (int u = 0; u + 1 < units; ++u) {
    k.policy.replayed_units.push_back(u);
    k.flops += c.flops[static_cast<size_t>(u)];
    if ((u + 1) % len == 0 || u + 2 == units) {
      k.policy.segment_ends.push_back(u);
      ++k.segments;
    }
  }
  k.replayed_units = units - 1;
  return k;
}

}  // namespace

RecomputePlan plan_recompute(const Tensor& loss, int64_t budget, const StepShape& shape) {
  const UnitCosts c = unit_costs(loss);
  const int units = c.units.units();
  RecomputePlan best;
  best.units = units;
  best.forward_flops = std::accumulate(c.flops.begin(), c.flops.end(), 0.0);
  bool have = false;
  int64_t smallest = INT64_MAX;
  auto consider = [&](const Candidate& k) {
    const StepMemory m = predict_step_memory(loss, k.policy, shape);
    smallest = std::min(smallest, m.peak_total);
    const bool fits = budget <= 0 || m.peak_total <= budget;
    // Ties (the update's peak can hide the activations') go to fewer FLOPs, then fewer
    // activations.
    const auto acts = [](const StepMemory& x) { return x.peak[kActs]; };
    const bool tie_flops = have && k.flops == best.replayed_flops;
    bool better = !have;
    if (have && budget > 0)
      better =
          fits && (k.flops < best.replayed_flops ||
                   (tie_flops &&
                    (m.peak_total < best.memory.peak_total ||
                     (m.peak_total == best.memory.peak_total && acts(m) < acts(best.memory)))));
    else if (have)
      better = m.peak_total < best.memory.peak_total ||
               (m.peak_total == best.memory.peak_total &&
                (k.flops < best.replayed_flops || (tie_flops && acts(m) < acts(best.memory))));
    if (!have && budget > 0) better = fits;
    if (better) {
      have = true;
      best.policy = k.policy;
      best.memory = m;
      best.replayed_units = k.replayed_units;
      best.segments = k.segments;
      best.replayed_flops = k.flops;
    }
    return m.peak_total;
  };
  // Units by bytes saved per FLOP replayed (the last unit's backward comes first: never).
  std::vector<int> order(static_cast<size_t>(std::max(units - 1, 0)));
  std::iota(order.begin(), order.end(), 0);
  auto gain = [&](int u) {
    const auto i = static_cast<size_t>(u);
    return (c.bytes[i] - c.cut_bytes[i]) / std::max(c.flops[i], 1.0);
  };
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return gain(a) > gain(b); });
  // Keep everything; then the fewest units (by bisection: memory falls as more are replayed)
  // that fit; then every unit in segments of 1 .. units - 1.
  consider(per_unit(c, order, 0));
  if (!order.empty()) {
    size_t lo = 1, hi = order.size();
    const int64_t all = consider(per_unit(c, order, hi));
    if (budget > 0 && all <= budget) {
      while (lo < hi) {
        const size_t mid = (lo + hi) / 2;
        if (consider(per_unit(c, order, mid)) <= budget)
          hi = mid;
        else
          lo = mid + 1;
      }
    }
    for (int len = 2; len < units; ++len) consider(segments_of(c, len));
  }
  best.smallest_peak = smallest;
  if (budget > 0 && (!have || best.memory.peak_total > budget))
    fail("[recompute] --memory-budget ", format_bytes(budget), " (", budget,
         " bytes) is below the peak of every plan: the smallest feasible budget is ",
         format_bytes(smallest), " (", smallest, " bytes)");
  return best;
}

}  // namespace hetrain::training

// ---- the step's memory, predicted and measured ---------------------------------------------

namespace hetrain::training {

namespace {
/// cfg's model, optimizer and a synthetic batch, as a run's first step has them.
struct SyntheticRun {
  std::shared_ptr<nn::Module> model;
  std::unique_ptr<optim::Optimizer> opt;
  data::Batch batch;
  explicit SyntheticRun(const TrainConfig& cfg)
      : model(build_model(cfg)), opt(make_optimizer(cfg, *model)), batch(synthetic_batch(cfg)) {
    model->train();
    default_generator().set_state(cfg.seed + 1, 0);  // dropout, as train() seeds it
  }
};
}  // namespace

std::vector<StepMemoryCheck> check_step_memory(const TrainConfig& cfg, int64_t steps) {
  validate(cfg);
  set_num_threads(cfg.threads);
  SyntheticRun run(cfg);
  std::unique_ptr<distributed::Communicator> local = distributed::make_local_communicator();
  RecomputeState rs = recompute_state(cfg, false);
  std::vector<StepMemoryCheck> out;
  for (int64_t s = 0; s < steps; ++s) {
    StepMemoryCheck c;
    rs.before_backward = [&](const Tensor& root, const RecomputePolicy& p) {
      c.predicted = predict_step_memory(root, p, step_shape(cfg, *run.opt, *run.model));
      host_allocator().reset_peak();  // measured from here, as predicted
    };
    train_step(*run.model, *run.opt, {run.batch}, cfg, cfg.model == "gpt", nullptr, s, nullptr,
               *local, rs);
    const MemoryStats m = host_allocator().stats();
    c.measured_peak = m.peak;
    c.measured_peak_total = m.peak_total;
    out.push_back(c);
  }
  return out;
}

StepMemory dry_run(const TrainConfig& cfg, std::FILE* out) {
  validate(cfg);
  set_num_threads(cfg.threads);
  SyntheticRun run(cfg);
  Tensor loss;
  {
    amp::Autocast autocast(amp::precision_from_name(cfg.precision));
    loss = loss_of(run.model->forward(run.batch.inputs), run.batch.targets, cfg.model == "gpt");
  }
  StepShape shape = step_shape(cfg, *run.opt, *run.model);
  RecomputePolicy policy;
  policy.mode = parse_recompute(cfg.recompute, "[train] recompute");
  std::string plan_line;
  if (policy.mode == RecomputeMode::automatic) {
    const RecomputePlan plan = plan_recompute(loss, cfg.memory_budget, shape);
    policy = plan.policy;
    plan_line = "recompute auto (" +
                (cfg.memory_budget > 0 ? "budget " + format_bytes(cfg.memory_budget)
                                       : std::string("no --memory-budget: the least peak")) +
                "): " + plan.summary();
  }
  const StepMemory m = predict_step_memory(loss, policy, shape);
  if (!out) return m;
  std::fprintf(out,
               "%s, batch %lld, recompute %s, %s: one training step predicted from its graph "
               "(nothing ran; a synthetic batch, without the dataset a run keeps resident)\n",
               cfg.preset.c_str(), static_cast<long long>(cfg.batch_size), cfg.recompute.c_str(),
               cfg.precision.c_str());
  std::fprintf(out, "%-18s %14s %14s\n", "tag", "before step", "step peak");
  for (int t = 0; t < kNumMemoryTags; ++t)
    std::fprintf(out, "%-18s %14s %14s\n",
                 std::string(memory_tag_name(static_cast<MemoryTag>(t))).c_str(),
                 format_bytes(m.start[static_cast<size_t>(t)]).c_str(),
                 format_bytes(m.peak[static_cast<size_t>(t)]).c_str());
  std::fprintf(out, "%-18s %14s %14s\n", "total", format_bytes(m.start_total).c_str(),
               format_bytes(m.peak_total).c_str());
  std::fprintf(
      out, "forward + backward: %lld nodes, peak total %s, live after it %s\n",
      static_cast<long long>(m.backward.nodes), format_bytes(m.backward.peak_total).c_str(),
      format_bytes(std::accumulate(m.backward.end.begin(), m.backward.end.end(), int64_t{0}))
          .c_str());
  std::fprintf(out, "peak total %lld bytes\n", static_cast<long long>(m.peak_total));
  if (!plan_line.empty()) std::fprintf(out, "%s\n", plan_line.c_str());
  return m;
}

}  // namespace hetrain::training
