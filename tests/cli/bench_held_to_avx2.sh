#!/usr/bin/env bash
# `hetrain bench` held to AVX2 (the own vector kernels, oneDNN and OpenBLAS): the FMA peak is the
# AVX2 loop's, not the CPU's widest, and it bounds the f32 GEMM measured under the same caps. A
# measurement, so the sanitizer run leaves it out (its peak loop is not compiled for speed). On a
# CPU without AVX2 + FMA there is nothing to hold, and it says so.
# Usage: bench_held_to_avx2.sh HETRAIN
set -euo pipefail
HT=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() {
  echo "FAIL: $*"
  exit 1
}
if ! grep -qw avx2 /proc/cpuinfo || ! grep -qw fma /proc/cpuinfo; then
  echo "no AVX2 + FMA on this CPU: nothing to hold"
  exit 0
fi
XDG_CACHE_HOME="$tmp" HETRAIN_CPU_ISA=avx2 DNNL_MAX_CPU_ISA=AVX2 ONEDNN_MAX_CPU_ISA=AVX2 \
  OPENBLAS_CORETYPE=Haswell "$HT" bench --quick > "$tmp/bench.out" 2>&1 \
  || { cat "$tmp/bench.out"; fail "bench held to AVX2"; }
grep -q "^fma peak (avx2+fma, " "$tmp/bench.out" || { cat "$tmp/bench.out"; fail "avx2 peak row"; }
python3 -c 'import json, sys
p = json.load(open(sys.argv[1]))
assert p["isa"] == "avx2+fma", p["isa"]
peak = p["fma_peak_tflops"]
assert 0 < p["gemm_tflops"]["f32"] <= 1.1 * peak, (p["gemm_tflops"], peak)' \
  "$tmp/hetrain/device_profile.json" || { cat "$tmp/bench.out"; fail "peak held to AVX2"; }
echo "held to AVX2: the FMA peak is the AVX2 loop's and bounds the f32 GEMM"
