#!/usr/bin/env bash
# Installs every Debian package Hetrain builds, tests and trains with. clang, its runtime
# libraries (sanitizers, libFuzzer), libomp-dev (omp.h for clang) and llvm (llvm-symbolizer for
# readable sanitizer reports) are for the sanitizer and fuzz build (tools/run_sanitizers.sh);
# clang-format and clang-tidy for the CI gates (tools/check_format.sh, tools/check_tidy.sh).
set -euo pipefail
pkgs=(build-essential cmake ninja-build pkg-config
      libdnnl-dev ocl-icd-opencl-dev libopenblas-dev zlib1g-dev nlohmann-json3-dev libtomlplusplus-dev
      libonnx-dev libprotobuf-dev protobuf-compiler libonnx-testdata python3-venv
      libgtest-dev libgmock-dev libbenchmark-dev
      openmpi-bin libopenmpi-dev libhwloc-dev
      clang libclang-rt-14-dev libomp-dev llvm clang-format clang-tidy
      chromium
      dataset-fashion-mnist fortunes)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
