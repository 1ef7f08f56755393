// Input files read whole: the one way Hetrain reads a data file a user names or keeps (hardware
// catalog, measured-runs, published-runs and perf-model files, device profiles).
//
//   nlohmann::json j = hetrain::read_json_file(path, "[plan] hardware catalog");
//
// Only regular files (symbolic links followed) are read: a directory, a device or a FIFO (which
// would block) is refused. Every error is an Error "<what> '<path>': <why>".
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace hetrain {

/// The file's bytes.
std::string read_input_file(const std::string& path, const std::string& what);

/// read_input_file parsed as JSON. Invalid JSON, and numbers past a double's range (1e400, which
/// nlohmann::json reports as out_of_range rather than parse_error), are errors naming the file.
nlohmann::json read_json_file(const std::string& path, const std::string& what);

/// o[key] as a string: `dflt` where o has no such key (or is not an object), an Error
/// "<where>: '<key>' must be a string, got <json>" where the value is of another type.
/// nlohmann's own `value()` would throw its type_error, which names no field.
std::string json_string(const nlohmann::json& o, const char* key, const std::string& dflt,
                        const std::string& where);

/// Whether o is an object whose "version" is the number v (a string "1" is not).
bool json_version_is(const nlohmann::json& o, int v);

}  // namespace hetrain
