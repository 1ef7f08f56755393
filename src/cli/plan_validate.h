// `hetrain plan --validate`: the planner against published training runs.
#pragma once

#include <string>

#include "hetrain/planning/catalog.h"

namespace hetrain::cli {

/// Predicts every run of `path` with the catalog's efficiency model, prints predicted vs
/// reported with the error and the summary per split, then refits the efficiency model on the
/// train runs and prints it beside the catalog's. Returns the exit status.
int plan_validate(const planning::Catalog& catalog, const std::string& path, bool json_out);

}  // namespace hetrain::cli
