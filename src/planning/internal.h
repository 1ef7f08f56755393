// Planner internals shared between estimate.cpp and search.cpp.
#pragma once

#include <string>

#include "hetrain/planning/plan.h"

namespace hetrain::planning::detail {

/// Why a strategy is invalid, or "" when it is valid (no exception: the search calls this
/// hundreds of thousands of times).
std::string strategy_problem(const Job& job, const Hardware& hw, int gpus, const Strategy& s);
/// evaluate() without the checks.
Plan evaluate_unchecked(const Job& job, const Hardware& hw, int gpus, const Strategy& s);

}  // namespace hetrain::planning::detail
