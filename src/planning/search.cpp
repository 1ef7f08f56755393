// Search over hardware x device count x strategy under budget and deadline.
#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <sstream>

#include "hetrain/base/error.h"
#include "hetrain/planning/plan.h"
#include "planning/internal.h"

namespace hetrain::planning {

namespace {

std::string fmt(double v, int prec = 3) {
  std::ostringstream os;
  os.precision(prec);
  os << v;
  return os.str();
}

std::string money(double v) {
  std::ostringstream os;
  os.setf(std::ios::fixed);
  os.precision(v < 100 ? 2 : 0);
  os << "$" << v;
  return os.str();
}

std::vector<int> default_counts(int max_gpus) {
  std::vector<int> c;
  for (int p = 1; p <= max_gpus; p *= 2) {
    c.push_back(p);
    if (p >= 8 && p + p / 2 <= max_gpus) c.push_back(p + p / 2);
  }
  std::sort(c.begin(), c.end());
  return c;
}

// Lower cost first, then shorter time; unpriced plans after priced ones, by time.
bool better(const Plan& a, const Plan& b) {
  if (a.priced != b.priced) return a.priced;
  if (a.priced && std::abs(a.cost_usd - b.cost_usd) > 1e-9 * std::max(a.cost_usd, 1.0))
    return a.cost_usd < b.cost_usd;
  return a.time.step * a.steps < b.time.step * b.steps;
}

struct HardwareOutcome {
  bool any_valid = false, any_fit = false, any_deadline = false, any_budget = false;
  std::string first_problem;
  Plan least_memory;  // smallest per-device total among non-fitting plans
  double least_memory_total = std::numeric_limits<double>::infinity();
  Plan fastest;  // fastest fitting plan
  double fastest_days = std::numeric_limits<double>::infinity();
  Plan cheapest_in_deadline;
  double cheapest_cost = std::numeric_limits<double>::infinity();
  std::vector<Plan> feasible;  // the best few
  int smallest_fitting = 0;    // fewest devices with a plan that fits
};

}  // namespace

SearchResult search(const Job& job, const Catalog& catalog, const SearchOptions& opt) {
  job.model.check();
  if (job.global_batch < 1) fail("[plan] --global-batch must be at least 1");
  if (job.tokens <= 0) fail("[plan] --tokens must be positive");
  SearchResult r;
  std::vector<const Hardware*> hws;
  if (opt.hardware.empty()) {
    for (const auto& h : catalog.all()) hws.push_back(&h);
  } else {
    for (const auto& id : opt.hardware) hws.push_back(&catalog.get(id));
  }
  std::vector<int> counts = opt.gpus.empty() ? default_counts(opt.max_gpus) : opt.gpus;
  const ModelSpec& m = job.model;
  std::vector<int> tps = opt.tp ? std::vector<int>{*opt.tp} : std::vector<int>{1, 2, 4, 8};
  std::vector<int> pps =
      opt.pp ? std::vector<int>{*opt.pp} : std::vector<int>{1, 2, 4, 8, 16, 32, 64};
  std::vector<int> zeros = opt.zero ? std::vector<int>{*opt.zero} : std::vector<int>{0, 1, 2, 3};
  // Interleaved schedules: given, every plan uses it; open, each plain 1F1B plan that fits
  // with a pipeline is tried again with 2, 4 and 8 chunks per device (its recompute and
  // offload kept): the interleave only adds memory, so the first that does not fit ends it.
  const int base_vs = opt.virtual_stages.value_or(1);
  std::vector<Offload> offs = opt.offload ? std::vector<Offload>{*opt.offload}
                                          : std::vector<Offload>{Offload::none, Offload::optimizer,
                                                                 Offload::optimizer_params};
  std::vector<Recompute> rcs;
  if (opt.recompute) {
    rcs = {*opt.recompute};
  } else if (m.is_transformer()) {
    rcs = {Recompute::none, Recompute::selective, Recompute::full};
  } else {
    rcs = {Recompute::none, Recompute::full};
  }
  // A fixed count of recomputed layers applies to full recompute; left open, the fewest
  // layers that fit are found below from the memory of recomputing none and all of them.
  struct RecomputeChoice {
    Recompute rc;
    int layers;
  };
  std::vector<RecomputeChoice> rcos;
  for (Recompute rc : rcs)
    rcos.push_back({rc, rc == Recompute::full ? opt.recompute_layers.value_or(0) : 0});
  const bool open_layers = !opt.recompute_layers && m.is_transformer();
  // Memory is linear in the share of layers recomputed: the fewest of a device's layers whose
  // full recompute brings `keep` (none recomputed) within capacity, given `all` (every one).
  auto fewest_layers = [&](const Plan& keep, const Plan& all, int pp) {
    const int lps = static_cast<int>((m.tf.layers + pp - 1) / pp);
    const double saved = keep.memory.total - all.memory.total;
    if (saved <= 0) return 0;
    const double need = (keep.memory.total - keep.memory.capacity) / saved;
    const int k = static_cast<int>(std::ceil(lps * need - 1e-9));
    return k >= 1 && k < lps ? k : 0;
  };
  std::vector<int64_t> mbs = opt.micro_batch ? std::vector<int64_t>{*opt.micro_batch}
                                             : std::vector<int64_t>{1, 2, 4, 8, 16, 32};

  std::vector<Plan> all_best;
  std::map<std::string, std::vector<Plan>> runners_up;
  std::map<std::string, int> smallest_fitting;
  auto consider = [&](HardwareOutcome& o, Plan&& p, int n) {
    if (!o.any_fit || n < o.smallest_fitting) o.smallest_fitting = n;
    o.any_fit = true;
    if (p.train_days < o.fastest_days) {
      o.fastest_days = p.train_days;
      o.fastest = p;
    }
    if (opt.deadline_days && p.train_days > *opt.deadline_days) return;
    o.any_deadline = true;
    if (p.priced && p.cost_usd < o.cheapest_cost) {
      o.cheapest_cost = p.cost_usd;
      o.cheapest_in_deadline = p;
    }
    if (opt.budget_usd && (!p.priced || p.cost_usd > *opt.budget_usd)) return;
    o.any_budget = true;
    o.feasible.push_back(std::move(p));
    if (o.feasible.size() > 64) {  // keep the list short, best first
      std::partial_sort(o.feasible.begin(), o.feasible.begin() + 16, o.feasible.end(), better);
      o.feasible.resize(16);
    }
  };
  for (const Hardware* hw : hws) {
    HardwareOutcome o;
    detail::StageComputeCache cache;
    // Recomputing every layer fits (`all`, plan `pa`): also recompute only as many as needed.
    auto fewest = [&](HardwareOutcome& out, const Strategy& all, const Plan& pa, int n) {
      if (all.recompute != Recompute::full || all.recompute_layers != 0 || !open_layers) return;
      Strategy keep = all;
      keep.recompute = job.fused_attention ? Recompute::selective : Recompute::none;
      const Plan pk = detail::evaluate_unchecked(job, *hw, n, keep, &cache);
      ++r.evaluated;
      Strategy some = all;
      some.recompute_layers = pk.fits ? 0 : fewest_layers(pk, pa, all.pp);
      for (int tries = 0; some.recompute_layers > 0 && tries < 2; ++tries) {
        Plan ps = detail::evaluate_unchecked(job, *hw, n, some, &cache);
        ++r.evaluated;
        if (ps.fits) {
          consider(out, std::move(ps), n);
          return;
        }
        if (++some.recompute_layers >= (m.tf.layers + all.pp - 1) / all.pp) return;
      }
    };
    auto interleave = [&](HardwareOutcome& out, const Strategy& base, int n) {
      if (opt.virtual_stages || base.pp == 1) return;
      for (int v : {2, 4, 8}) {
        Strategy sv = base;
        sv.virtual_stages = v;
        if (!detail::strategy_problem(job, *hw, n, sv).empty()) return;
        Plan pv = detail::evaluate_unchecked(job, *hw, n, sv, &cache);
        ++r.evaluated;
        if (!pv.fits) return;
        fewest(out, sv, pv, n);
        consider(out, std::move(pv), n);
      }
    };
    for (int n : counts) {
      // Whole nodes, unless the count was given.
      if (opt.gpus.empty() && n > hw->gpus_per_node && n % hw->gpus_per_node != 0) continue;
      for (int tp : tps) {
        if (!opt.tp && (tp > hw->gpus_per_node || tp > n)) continue;
        for (int pp : pps) {
          if (!opt.pp && tp * pp > n) break;
          for (int z : zeros) {
            int dp = n % (tp * pp) == 0 ? n / (tp * pp) : 0;
            for (int64_t mb : mbs) {
              // Recompute and offload only ever add time: once a variant fits, the variants
              // after it (more recompute, more offload) are dominated and skipped.
              bool fitted_without_offload_or_recompute = false;
              bool evaluated_here = false, fitted_here = false;
              for (const RecomputeChoice& rco : rcos) {
                const Recompute rc = rco.rc;
                if (fitted_without_offload_or_recompute) break;
                for (Offload off : offs) {
                  // With one data-parallel rank ZeRO shards nothing; keep the stages that
                  // enable an offload (ZeRO-Offload / ZeRO-Infinity on a single device).
                  if (!opt.zero && dp == 1 && z > 0 && !(z == 1 && off == Offload::optimizer) &&
                      !(z == 3 && off == Offload::optimizer_params))
                    continue;
                  Strategy s;
                  s.tp = tp, s.pp = pp, s.zero = z, s.offload = off, s.recompute = rc;
                  s.micro_batch = mb, s.virtual_stages = base_vs, s.recompute_layers = rco.layers;
                  s.sequence_parallel = opt.sequence_parallel, s.overlap_dp = opt.overlap_dp;
                  std::string problem = detail::strategy_problem(job, *hw, n, s);
                  if (!problem.empty()) {
                    if (o.first_problem.empty()) o.first_problem = problem;
                    continue;
                  }
                  o.any_valid = true;
                  evaluated_here = true;
                  Plan p = detail::evaluate_unchecked(job, *hw, n, s, &cache);
                  ++r.evaluated;
                  if (!p.fits) {
                    if (p.memory.total < o.least_memory_total) {
                      o.least_memory_total = p.memory.total;
                      o.least_memory = p;
                      detail::describe_fit(o.least_memory);
                    }
                    continue;
                  }
                  fitted_here = true;
                  if (&rco == &rcos.front() && off == offs.front())
                    fitted_without_offload_or_recompute = true;
                  fewest(o, s, p, n);
                  interleave(o, s, n);
                  consider(o, std::move(p), n);
                  break;  // a fitting plan: more offload for this recompute is dominated
                }
              }
              // Memory grows with the micro-batch: if nothing fits now, nothing larger will.
              if (evaluated_here && !fitted_here) break;
            }
          }
        }
      }
    }
    std::sort(o.feasible.begin(), o.feasible.end(), better);
    smallest_fitting[hw->id] = o.any_fit ? o.smallest_fitting : 0;
    if (!o.feasible.empty()) {
      all_best.push_back(o.feasible.front());
      runners_up[hw->id] = std::move(o.feasible);
      continue;
    }
    Rejection rej{hw->id, ""};
    int max_count = counts.empty() ? 0 : counts.back();
    if (!o.any_valid) {
      rej.reason = "no valid strategy: " + o.first_problem;
    } else if (!o.any_fit) {
      const Plan& q = o.least_memory;
      rej.reason = "does not fit at up to " + std::to_string(max_count) +
                   " devices: the leanest plan (" + std::to_string(q.gpus) + " x, " +
                   q.strategy.describe() + ") " + q.fit_reason;
    } else if (!o.any_deadline) {
      rej.reason = "over deadline: the fastest plan that fits takes " + fmt(o.fastest_days) +
                   " days (" + std::to_string(o.fastest.gpus) + " devices, " +
                   o.fastest.strategy.describe() + ") > " + fmt(*opt.deadline_days) + " days";
    } else if (!o.any_budget) {
      if (o.cheapest_cost == std::numeric_limits<double>::infinity())
        rej.reason = "no price in the catalog (pass --price USD per device-hour)";
      else
        rej.reason = "over budget: the cheapest plan within the deadline costs " +
                     money(o.cheapest_cost) + " (" + std::to_string(o.cheapest_in_deadline.gpus) +
                     " devices, " + fmt(o.cheapest_in_deadline.train_days) + " days) > " +
                     money(*opt.budget_usd);
    }
    r.rejected.push_back(rej);
  }
  std::sort(all_best.begin(), all_best.end(), better);
  r.plans = all_best;
  if (r.plans.size() > opt.top) r.plans.resize(opt.top);

  // The next best plans on the winning hardware (other strategies or device counts).
  if (!r.plans.empty()) {
    auto& list = runners_up[r.plans.front().hardware];
    for (size_t i = 1; i < list.size() && r.alternatives.size() < 5; ++i)
      r.alternatives.push_back(list[i]);
  }

  // ---- explanation ----
  auto& ex = r.explanation;
  double P = static_cast<double>(m.params());
  double fwd = m.forward_flops_per_sample();
  double samples = job.tokens / m.tokens_per_sample();
  ex.push_back("scale: " + m.name + " has " + fmt(P / 1e9, 4) + "B parameters; " +
               fmt(job.tokens, 3) + " tokens = " + fmt(samples, 3) + " samples; training FLOPs " +
               fmt(3 * fwd * samples, 3) + " (6*N*tokens = " + fmt(6 * P * job.tokens, 3) +
               "; the difference is attention and the LM head)");
  double wb = job.precision == Precision::fp32 ? 4 : 2,
         K = job.precision == Precision::fp32 ? 8 : 12;
  double states = (2 * wb + K) * P;
  std::string act = "n/a";
  if (m.is_transformer()) {
    double a1 = transformer_layer_activation_bytes(m.tf, 1, 1, false, Recompute::none) *
                m.tf.layers * (wb / 2);
    double a2 = transformer_layer_activation_bytes(m.tf, 1, 1, false, Recompute::full) *
                m.tf.layers * (wb / 2);
    act = fmt(a1 / 1e9) + " GB per sample without recompute, " + fmt(a2 / 1e9) +
          " GB with full recompute";
  } else {
    act = fmt(convnet_activation_bytes(m.conv, 1, Recompute::none) * (wb / 2) / 1e9) +
          " GB per sample";
  }
  ex.push_back("memory: model states " + fmt(2 * wb + K) + " bytes/param (" +
               to_string(job.precision) + " weights and gradients + Adam, ZeRO's K = " + fmt(K) +
               ") = " + fmt(states / 1e9, 4) + " GB in all; activations " + act);
  std::string fits_line = "hardware that fits:";
  for (const Hardware* hw : hws) {
    double per = states / (hw->mem_gb * 1e9);
    int n = smallest_fitting[hw->id];
    fits_line += " " + hw->id + " " +
                 (n ? "from " + std::to_string(n) + " devices" : std::string("at no count")) +
                 " (model states alone fill " + fmt(std::ceil(per), 4) + " without offload)";
    if (hw != hws.back()) fits_line += ";";
  }
  ex.push_back(fits_line);
  ex.push_back(opt.budget_usd ? "budget: " + money(*opt.budget_usd)
                              : "budget: none given (ranked by cost anyway)");
  ex.push_back(opt.deadline_days ? "deadline: " + fmt(*opt.deadline_days) + " days"
                                 : "deadline: none given (the cheapest plan may be slow)");
  for (const auto& rej : r.rejected) ex.push_back("rejected " + rej.hardware + ": " + rej.reason);
  if (!r.plans.empty()) {
    const Plan& w = r.plans.front();
    std::string line = "choice: " + std::to_string(w.gpus) + " x " + w.hardware + " (" +
                       w.strategy.describe() + "): " + fmt(w.train_days) + " days, " +
                       (w.priced ? money(w.cost_usd) : std::string("unpriced"));
    if (r.plans.size() > 1) {
      const Plan& n2 = r.plans[1];
      line += "; next best " + std::to_string(n2.gpus) + " x " + n2.hardware + " at " +
              (n2.priced ? money(n2.cost_usd) : std::string("unpriced")) + ", " +
              fmt(n2.train_days) + " days";
    }
    ex.push_back(line);
  } else {
    ex.push_back("choice: none; no hardware meets every constraint");
  }
  return r;
}

namespace {

int changed_dimensions(const Strategy& a, const Strategy& b) {
  return (a.tp != b.tp) + (a.pp != b.pp) + (a.zero != b.zero) + (a.offload != b.offload) +
         (a.recompute != b.recompute) + (a.micro_batch != b.micro_batch) +
         (a.virtual_stages != b.virtual_stages) + (a.recompute_layers != b.recompute_layers);
}

template <class T>
void add_unique(std::vector<T>& v, T x) {
  if (std::find(v.begin(), v.end(), x) == v.end()) v.push_back(x);
}

}  // namespace

std::string strategy_changes(const Strategy& from, const Strategy& to) {
  std::ostringstream os;
  auto item = [&](const char* name, const std::string& a, const std::string& b) {
    if (a == b) return;
    os << (os.tellp() > 0 ? ", " : "") << name << " " << a << " -> " << b;
  };
  item("tp", std::to_string(from.tp), std::to_string(to.tp));
  item("pp", std::to_string(from.pp), std::to_string(to.pp));
  item("zero", std::to_string(from.zero), std::to_string(to.zero));
  item("offload", to_string(from.offload), to_string(to.offload));
  item("recompute", to_string(from.recompute), to_string(to.recompute));
  item("micro-batch", std::to_string(from.micro_batch), std::to_string(to.micro_batch));
  item("virtual-stages", std::to_string(from.virtual_stages), std::to_string(to.virtual_stages));
  item("recompute-layers", std::to_string(from.recompute_layers),
       std::to_string(to.recompute_layers));
  return os.str();
}

std::optional<Plan> nearest_fitting(const Job& job, const Hardware& hw, int gpus,
                                    const Strategy& s) {
  std::vector<int> tps{s.tp}, pps{s.pp};
  for (int t = 1; t <= std::min(gpus, std::max(hw.gpus_per_node, s.tp)); t *= 2) add_unique(tps, t);
  for (int q = 1; q <= std::min(gpus, 128); q *= 2) add_unique(pps, q);
  std::vector<int64_t> mbs{s.micro_batch};
  for (int64_t b = 1; b <= 32; b *= 2) add_unique(mbs, b);
  std::optional<Plan> best;
  int best_d = 1 << 30;
  detail::StageComputeCache cache;
  for (int tp : tps)
    for (int pp : pps)
      for (int z = 0; z <= 3; ++z)
        for (Offload off : {Offload::none, Offload::optimizer, Offload::optimizer_params})
          for (Recompute rc : {Recompute::none, Recompute::selective, Recompute::full})
            for (int64_t mb : mbs)
              for (int vs : {s.virtual_stages, 1}) {
                Strategy c = s;
                c.tp = tp, c.pp = pp, c.zero = z, c.offload = off, c.recompute = rc;
                c.micro_batch = mb, c.virtual_stages = vs;
                c.recompute_layers = rc == Recompute::full ? s.recompute_layers : 0;
                const int d = changed_dimensions(s, c);
                if (d > best_d || !detail::strategy_problem(job, hw, gpus, c).empty()) continue;
                Plan p = detail::evaluate_unchecked(job, hw, gpus, c, &cache);
                if (!p.fits) continue;
                if (d < best_d || p.train_days < best->train_days) best = std::move(p), best_d = d;
              }
  return best;
}

}  // namespace hetrain::planning
