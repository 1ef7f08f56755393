// Devices and the memory nodes they own.
#pragma once

#include <cstdint>
#include <string>

namespace hetrain {

enum class DeviceKind : uint8_t { cpu, cuda, sim };

struct Device {
  DeviceKind kind = DeviceKind::cpu;
  int index = 0;
  bool operator==(const Device&) const = default;
  std::string str() const;
  static Device cpu() { return {DeviceKind::cpu, 0}; }
  /// Parses "cpu", "cuda:1", "sim:0". A CUDA device must exist on this machine: otherwise
  /// an Error says there is none (or how many there are) and lists the devices found.
  static Device parse(const std::string& s);
  /// Parses the name only, without checking that the device exists.
  static Device parse_name(const std::string& s);
};

}  // namespace hetrain
