#!/usr/bin/env bash
# Fresh Debian 12: install every dependency, build Hetrain, and train the fashion-mlp preset
# on Fashion-MNIST with a live progress bar and the final test accuracy.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/install_deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build build -j "$(nproc)" --target hetrain
./build/hetrain train --preset fashion-mlp "$@"
