// Planner internals shared between estimate.cpp and search.cpp.
#pragma once

#include <map>
#include <string>
#include <tuple>

#include "hetrain/planning/plan.h"

namespace hetrain::planning::detail {

/// Why a strategy is invalid, or "" when it is valid (no exception: the search calls this
/// hundreds of thousands of times).
std::string strategy_problem(const Job& job, const Hardware& hw, int gpus, const Strategy& s);
struct StageCompute {
  double fwd = 0, bwd = 0, recompute = 0;  // seconds for one micro-batch on one stage
};
/// Stage compute times of one hardware by (tp, pp, micro-batch, recompute, sp).
using StageComputeCache = std::map<std::tuple<int, int, int64_t, int, bool>, StageCompute>;

/// evaluate() without the checks and without fit_reason (see describe_fit).
Plan evaluate_unchecked(const Job& job, const Hardware& hw, int gpus, const Strategy& s,
                        StageComputeCache* cache = nullptr);
/// Fills p.fit_reason when the plan does not fit.
void describe_fit(Plan& p);

}  // namespace hetrain::planning::detail
