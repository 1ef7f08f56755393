#!/usr/bin/env bash
# Creates .venv-onnx with the pinned Python packages the ONNX tests compare Hetrain against:
# onnx (the checker, full_check) and onnxruntime (the reference runtime, CPU). Idempotent: a
# venv whose packages already import at the pinned versions is kept.
#   bash tools/install_onnx_peer.sh [VENV_DIR]     (default: .venv-onnx in the repository)
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${1:-.venv-onnx}"
pins=(numpy==2.1.3 protobuf==5.28.3 onnx==1.17.0 onnxruntime==1.20.1)
check='import numpy, onnx, onnxruntime, sys
want = dict(p.split("==") for p in sys.argv[1:])
have = {"numpy": numpy.__version__, "onnx": onnx.__version__, "onnxruntime": onnxruntime.__version__}
sys.exit(any(want[k] != v for k, v in have.items()))'
if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "$check" "${pins[@]}" 2>/dev/null; then
  echo "install_onnx_peer: $venv is ready (${pins[*]})"
  exit 0
fi
python3 -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-input "${pins[@]}"
"$venv/bin/python" -c "$check" "${pins[@]}"
echo "install_onnx_peer: installed ${pins[*]} into $venv"
