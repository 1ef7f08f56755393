// Run-time CPU feature detection: the binary is built for baseline x86-64 and picks wider
// code paths by what this CPU reports.
#pragma once

#include <string>

namespace hetrain {

struct CpuFeatures {
  bool avx2 = false, fma = false, f16c = false;
  bool avx512f = false, avx512bf16 = false, avx512fp16 = false;
  bool avx512bw = false, avx512dq = false, avx512vl = false;  // with avx512f: x86-64-v4
  bool amx_tile = false, amx_bf16 = false;
  std::string vendor, model;
};

const CpuFeatures& cpu_features();
/// "avx2 fma f16c" style list of what was found.
std::string cpu_features_string();

}  // namespace hetrain
