#!/usr/bin/env bash
# Random inputs through Hetrain and onnxruntime for every ONNX node-test model Hetrain imports
# (test_interop's OnnxNodeSuite.RandomInputsAgreeWithOnnxruntime, inputs and references made by
# tools/onnx_random_cases.py): the onnx PyPI package's node tests (onnx 1.17) and Debian's
# libonnx-testdata (onnx 1.12) where installed, identical models once.
# Usage: onnx_node_random.sh TEST_INTEROP SOURCE_DIR. Exit 77 (skip) without the venv from
# tools/install_onnx_peer.sh, unless CI is set: then a missing venv fails.
set -uo pipefail
test_bin=$1 src=$2
py="${HETRAIN_ONNX_VENV:-$src/.venv-onnx}/bin/python"
pypi=$("$py" -c "import onnx, onnxruntime, os; print(os.path.join(os.path.dirname(onnx.__file__), 'backend/test/data/node'))" 2>/dev/null)
if [ -z "$pypi" ] || [ ! -d "$pypi" ]; then
  if [ -n "${CI:-}" ]; then
    echo "FAIL: no onnx/onnxruntime venv with the node tests at $py (run tools/install_onnx_peer.sh)"
    exit 1
  fi
  echo "skipped: no onnx/onnxruntime venv at $py (bash tools/install_onnx_peer.sh makes it)"
  exit 77
fi
dirs=$pypi
debian=/usr/share/libonnx-testdata/data/node
[ -d "$debian" ] && dirs="$dirs:$debian"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
HETRAIN_ONNX_PYTHON="$py" HETRAIN_ONNX_RANDOM_NODE_DIRS="$dirs" HETRAIN_ONNX_RANDOM_OUT="$tmp" \
  HETRAIN_SOURCE_DIR="$src" "$test_bin" --gtest_filter='OnnxNodeSuite.RandomInputsAgreeWithOnnxruntime'
