#include "hetrain/base/byte_size.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "hetrain/base/error.h"

namespace hetrain {

namespace {
[[noreturn]] void bad_size(const std::string& what, const std::string& text, const char* why) {
  fail(what, ": expected a size in bytes such as 2GiB, 512MiB or 1048576 (", why, "), got '", text,
       "'");
}
}  // namespace

int64_t parse_byte_size(const std::string& text, const std::string& what) {
  auto bad = [&](const char* why) { bad_size(what, text, why); };
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.'))
    ++i;
  if (i == 0) bad("it must start with a number");
  char* end = nullptr;
  const std::string num = text.substr(0, i);
  const double v = std::strtod(num.c_str(), &end);
  if (end != num.c_str() + num.size() || !std::isfinite(v)) bad("not a number");
  size_t u = i;
  while (u < text.size() && text[u] == ' ') ++u;
  const std::string unit = text.substr(u);
  struct Unit {
    const char* name;
    double scale;
  };
  static const Unit kUnits[] = {{"", 1},          {"B", 1},         {"KiB", 1024.0},
                                {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1099511627776.0},
                                {"kB", 1e3},      {"KB", 1e3},      {"MB", 1e6},
                                {"GB", 1e9},      {"TB", 1e12}};
  for (const Unit& k : kUnits) {
    if (unit != k.name) continue;
    const double bytes = std::floor(v * k.scale);
    if (bytes < 1) bad("at least 1 byte");
    if (bytes > 9.0e18) bad("too large");
    return static_cast<int64_t>(bytes);
  }
  bad_size(what, text, "units: B, KiB, MiB, GiB, TiB, kB, MB, GB, TB");
}

std::string format_bytes(int64_t bytes) {
  const double b = static_cast<double>(bytes);
  const double ab = std::fabs(b);
  char buf[64];
  if (ab < 1024)
    std::snprintf(buf, sizeof buf, "%lld B", static_cast<long long>(bytes));
  else if (ab < 1024.0 * 1024)
    std::snprintf(buf, sizeof buf, "%.1f KiB", b / 1024);
  else if (ab < 1024.0 * 1024 * 1024)
    std::snprintf(buf, sizeof buf, "%.1f MiB", b / (1024.0 * 1024));
  else
    std::snprintf(buf, sizeof buf, "%.2f GiB", b / (1024.0 * 1024 * 1024));
  return buf;
}

}  // namespace hetrain
