// JSON forms of plans and searches: the interface scripts depend on (`hetrain plan --json`).
#pragma once

#include <nlohmann/json.hpp>

#include "hetrain/planning/calibration.h"
#include "hetrain/planning/plan.h"

namespace hetrain::planning {

/// params, flops_per_step, memory_per_gpu_bytes{weights, gradients, optimizer, activations,
/// temporary, reserved, total, capacity, host_per_gpu}, fits, step_time_s, tokens_per_s,
/// achieved_tflops_per_gpu, mfu, train_days, gpu_hours, cost_usd, plus hardware, gpus,
/// strategy{tp, pp, dp, zero, offload, recompute, micro_batch, sequence_parallel} and the
/// time breakdown.
nlohmann::json to_json(const Plan& p);
/// plans (ranked), rejected [{hardware, reason}], explanation, alternatives, evaluated.
nlohmann::json to_json(const SearchResult& r);
nlohmann::json to_json(const CalibrationReport& r);

}  // namespace hetrain::planning
