// Runtime internals shared by the executor, the device set and the plan cache.
#pragma once

#include <string>

#include "hetrain/memory/device.h"

namespace hetrain::runtime {

/// Index of d in the configured devices, or -1.
int device_index(Device d);
/// "cpu, sim:0, ..." for error messages.
std::string configured_devices();
/// Drops cached placements (the device set changed).
void clear_plan_cache();

}  // namespace hetrain::runtime
