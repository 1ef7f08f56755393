#!/usr/bin/env bash
# Packs a CUDA build made here for a GPU machine that lacks the build's Debian libraries
# (oneDNN, OpenBLAS, Open MPI, protobuf, ONNX...): the binaries gpu_check.sh runs, and every
# shared library they load except the C library and the CUDA/driver libraries, which must come
# from the GPU machine (they match its driver). One compressed archive, so it fits a transfer.
#
# Usage: tools/gpu_pack.sh [BUILD] [ARCHIVE]     (defaults: build-gpu, gpu-carry/pack.tar.xz)
# On the GPU machine: GPU_CHECK_PREBUILT=ARCHIVE tools/gpu_check.sh unpacks and runs it.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build-gpu}
ARCHIVE=${2:-gpu-carry/pack.tar.xz}
die() {
  printf 'gpu_pack: %s\n' "$*" >&2
  exit 1
}
[ -f "$BUILD/CMakeCache.txt" ] || die "$BUILD is not a CMake build directory"
grep -q '^HETRAIN_CUDA:STRING=ON' "$BUILD/CMakeCache.txt" ||
  die "$BUILD was not configured with -DHETRAIN_CUDA=ON"
bins=()
for b in hetrain tests/test_cuda tests/test_distributed tests/test_runtime tests/test_parity \
  bench/bench_cuda; do
  [ -x "$BUILD/$b" ] && bins+=("$BUILD/$b")
done
[ -x "$BUILD/hetrain" ] && [ -x "$BUILD/tests/test_cuda" ] ||
  die "$BUILD lacks hetrain or tests/test_cuda (build those targets first)"
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib"
cp "${bins[@]}" "$stage/bin/"
# Libraries the GPU machine must supply itself: glibc's, the driver's, the CUDA toolkit's.
keep_out='^(libc|libm|libdl|librt|libpthread|ld-linux-x86-64|linux-vdso|libcuda|libcudart|libcublas|libcublasLt|libnccl|libnvidia-)[.-]'
for b in "${bins[@]}"; do
  ldd "$b" | awk '/=> \//{print $1, $3}'
done | sort -u | while read -r name path; do
  if ! [[ $name =~ $keep_out ]]; then cp -L "$path" "$stage/lib/$name"; fi
done
mkdir -p "$(dirname "$ARCHIVE")"
tar -C "$stage" -cJf "$ARCHIVE" bin lib
echo "gpu_pack: $(ls "$stage/bin" | wc -l) binaries, $(ls "$stage/lib" | wc -l) libraries," \
  "$(du -h "$ARCHIVE" | cut -f1) in $ARCHIVE" >&2
