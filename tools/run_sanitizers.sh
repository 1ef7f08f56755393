#!/usr/bin/env bash
# Builds the library, the CLI and the tests with AddressSanitizer and UndefinedBehaviorSanitizer
# (CUDA and benchmarks off, -O1) in build-asan/ and runs the test suite there. Every finding
# fails: UBSan does not recover, and LeakSanitizer reports a leak as a failure.
# Usage: tools/run_sanitizers.sh [ctest arguments...]   (CI runs it from .ci/run)
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${JOBS:-$(nproc)}
launcher=()
command -v ccache > /dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG=-O1 \
  -DHETRAIN_CUDA=OFF -DHETRAIN_BUILD_BENCH=OFF -DHETRAIN_WERROR=ON \
  -DHETRAIN_SANITIZE=address,undefined "${launcher[@]}"
cmake --build build-asan -j "$jobs"
export ASAN_OPTIONS=detect_leaks=1:detect_stack_use_after_return=1:strict_string_checks=1:check_initialization_order=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
ctest --test-dir build-asan --output-on-failure -j "$jobs" --timeout 1800 "$@"
