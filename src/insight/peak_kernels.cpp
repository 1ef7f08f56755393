// Register-only loops that run one compute unit of this CPU at its peak: the f32 FMA units at
// each vector width, and the bf16 units (AVX512-BF16 dot products, AMX tiles). hetrain bench
// measures the ceilings of the paths that GEMMs and convolutions take with them.
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>

#include "hetrain/base/cpu_features.h"
#include "hetrain/insight/device_profile.h"

namespace hetrain::insight {

namespace {

// kChains independent accumulators: more than FMA latency x ports (4 x 2), so the loop is
// bound by throughput. Each chain computes acc = acc * m + a.
constexpr int kChains = 12;
constexpr float kMul = 0.999999f, kAdd = 1e-7f;

// One loop per vector width: intrinsics of a wider unit cannot be inlined into a function
// built for a narrower one, so the three are spelled out (they differ only in the type).
__attribute__((target("avx512f"))) float fma_loop_avx512(int64_t iters) {
  __m512 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_ps(static_cast<float>(c) * 1e-3f);
  const __m512 m = _mm512_set1_ps(kMul), a = _mm512_set1_ps(kAdd);
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 12
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_fmadd_ps(acc[c], m, a);
  }
  __m512 s = acc[0];
  for (int c = 1; c < kChains; ++c) s = _mm512_add_ps(s, acc[c]);
  return _mm512_cvtss_f32(s);
}

__attribute__((target("avx2,fma"))) float fma_loop_avx2(int64_t iters) {
  __m256 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm256_set1_ps(static_cast<float>(c) * 1e-3f);
  const __m256 m = _mm256_set1_ps(kMul), a = _mm256_set1_ps(kAdd);
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 12
    for (int c = 0; c < kChains; ++c) acc[c] = _mm256_fmadd_ps(acc[c], m, a);
  }
  __m256 s = acc[0];
  for (int c = 1; c < kChains; ++c) s = _mm256_add_ps(s, acc[c]);
  return _mm256_cvtss_f32(s);
}

// Baseline x86-64: SSE multiply + add (two flops, two instructions).
float fma_loop_sse(int64_t iters) {
  __m128 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm_set1_ps(static_cast<float>(c) * 1e-3f);
  const __m128 m = _mm_set1_ps(kMul), a = _mm_set1_ps(kAdd);
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 12
    for (int c = 0; c < kChains; ++c) acc[c] = _mm_add_ps(_mm_mul_ps(acc[c], m), a);
  }
  __m128 s = acc[0];
  for (int c = 1; c < kChains; ++c) s = _mm_add_ps(s, acc[c]);
  return _mm_cvtss_f32(s);
}

// bf16 operands of the bf16 loops: 0.0625 (0x3d80), so each product is 2^-8 and every partial
// sum is exact in f32 for the iteration counts used.
constexpr uint16_t kBf16Operand = 0x3d80;

// AVX512-BF16: vdpbf16ps adds two bf16 products into each of 16 f32 lanes (64 flops).
__attribute__((target("avx512f,avx512bf16"))) float dpbf16_loop(int64_t iters) {
  __m512 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_setzero_ps();
  const __m512bh x = (__m512bh)_mm512_set1_epi16(static_cast<short>(kBf16Operand));
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 12
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_dpbf16_ps(acc[c], x, x);
  }
  __m512 s = acc[0];
  for (int c = 1; c < kChains; ++c) s = _mm512_add_ps(s, acc[c]);
  return _mm512_cvtss_f32(s);
}

// AMX: four 16x16 f32 accumulator tiles (0-3), each updated from two of the 16x32 bf16 operand
// tiles (4, 5 and 6, 7) per iteration, the 2x2 blocking oneDNN's kernels use. One tdpbf16ps is
// 16 x 16 x 32 products.
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

__attribute__((target("amx-tile,amx-bf16"))) float amx_loop(int64_t iters) {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) cfg.rows[t] = 16, cfg.colsb[t] = 64;
  alignas(64) uint16_t operand[16 * 32];
  for (uint16_t& v : operand) v = kBf16Operand;
  alignas(64) float out[16 * 16];
  _tile_loadconfig(&cfg);
  _tile_loadd(4, operand, 64);
  _tile_loadd(5, operand, 64);
  _tile_loadd(6, operand, 64);
  _tile_loadd(7, operand, 64);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t i = 0; i < iters; ++i) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, out, 64);
  _tile_release();
  return out[0];
}

// Linux grants the AMX tile state to a process only on request (arch_prctl
// ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA); oneDNN makes the same request.
bool amx_permitted() {
  static const bool ok = [] {
    constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return ok;
}

// What each loop returns after `iters` iterations, for tests that check the loop did its work.
// FMA chain c: x_n = m^n x_0 + a (1 - m^n) / (1 - m), x_0 = c * 1e-3; lane 0 of their sum.
double fma_loop_result(int64_t iters) {
  const double m = kMul, a = kAdd, mn = std::pow(m, static_cast<double>(iters));
  double sum = 0;
  for (int c = 0; c < kChains; ++c) sum += mn * c * 1e-3 + a * (1 - mn) / (1 - m);
  return sum;
}
constexpr double kBf16Product = 1.0 / 256;  // kBf16Operand squared
// Lane 0 of the summed accumulators: two products per chain per iteration.
double dpbf16_loop_result(int64_t iters) {
  return static_cast<double>(iters) * kChains * 2 * kBf16Product;
}
// One element of tile 0: 32 products per iteration.
double amx_loop_result(int64_t iters) { return static_cast<double>(iters) * 32 * kBf16Product; }

}  // namespace

std::vector<PeakKernel> peak_kernels() {
  const CpuFeatures& f = cpu_features();
  std::vector<PeakKernel> out;
  // f32 first, widest first: fma_kernel() takes the first.
  if (f.avx512f)
    out.push_back({fma_loop_avx512, kChains * 16 * 2.0, "avx512f", false, fma_loop_result});
  if (f.avx2 && f.fma)
    out.push_back({fma_loop_avx2, kChains * 8 * 2.0, "avx2+fma", false, fma_loop_result});
  out.push_back({fma_loop_sse, kChains * 4 * 2.0, "sse", false, fma_loop_result});
  if (f.amx_tile && f.amx_bf16 && amx_permitted())
    out.push_back({amx_loop, 4 * 16 * 16 * 32 * 2.0, "amx-bf16", true, amx_loop_result});
  if (f.avx512bf16)
    out.push_back({dpbf16_loop, kChains * 16 * 2 * 2.0, "avx512-bf16", true, dpbf16_loop_result});
  return out;
}

PeakKernel fma_kernel() { return peak_kernels().front(); }

std::optional<PeakKernel> bf16_kernel() {
  for (const PeakKernel& k : peak_kernels())
    if (k.bf16) return k;
  return std::nullopt;
}

}  // namespace hetrain::insight
