#include "hetrain/base/cpu_features.h"

#include <cpuid.h>

#include <cstring>
#include <fstream>

namespace hetrain {

namespace {
CpuFeatures detect() {
  CpuFeatures f;
  unsigned a, b, c, d;
  if (__get_cpuid(0, &a, &b, &c, &d)) {
    char v[13] = {};
    std::memcpy(v, &b, 4);
    std::memcpy(v + 4, &d, 4);
    std::memcpy(v + 8, &c, 4);
    f.vendor = v;
  }
  __builtin_cpu_init();
  f.avx2 = __builtin_cpu_supports("avx2");
  f.fma = __builtin_cpu_supports("fma");
  f.avx512f = __builtin_cpu_supports("avx512f");
  f.avx512bw = __builtin_cpu_supports("avx512bw");
  f.avx512dq = __builtin_cpu_supports("avx512dq");
  f.avx512vl = __builtin_cpu_supports("avx512vl");
  if (__get_cpuid(1, &a, &b, &c, &d)) f.f16c = (c >> 29) & 1u;
  // OS support for AVX-512/AMX state is implied by the kernel exposing the flags; cpuid
  // leaf 7 gives the feature bits.
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
    f.avx512fp16 = (d >> 23) & 1u;
    f.amx_bf16 = (d >> 22) & 1u;
    f.amx_tile = (d >> 24) & 1u;
  }
  if (__get_cpuid_count(7, 1, &a, &b, &c, &d)) f.avx512bf16 = (a >> 5) & 1u;
  if (!f.avx512f) f.avx512bf16 = f.avx512fp16 = false;
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      auto p = line.find(':');
      if (p != std::string::npos) f.model = line.substr(p + 2);
      break;
    }
  }
  return f;
}
}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures f = detect();
  return f;
}

std::string cpu_features_string() {
  const auto& f = cpu_features();
  std::string s;
  auto add = [&](bool on, const char* name) {
    if (!on) return;
    if (!s.empty()) s.push_back(' ');
    s.append(name);
  };
  add(f.avx2, "avx2");
  add(f.fma, "fma");
  add(f.f16c, "f16c");
  add(f.avx512f, "avx512f");
  add(f.avx512bw, "avx512bw");
  add(f.avx512dq, "avx512dq");
  add(f.avx512vl, "avx512vl");
  add(f.avx512bf16, "avx512_bf16");
  add(f.avx512fp16, "avx512_fp16");
  add(f.amx_tile, "amx_tile");
  add(f.amx_bf16, "amx_bf16");
  return s.empty() ? "baseline x86-64" : s;
}

}  // namespace hetrain
