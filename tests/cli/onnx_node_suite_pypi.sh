#!/usr/bin/env bash
# ONNX's backend node tests as the onnx PyPI package ships them (onnx 1.17, opsets up to 22),
# run by the same GTest as Debian's libonnx-testdata copy (OnnxNodeSuite, >= 95% of the
# non-excluded tests of the listed ops). The package comes from tools/install_onnx_peer.sh's venv.
# Usage: onnx_node_suite_pypi.sh TEST_INTEROP SOURCE_DIR. Exit 77 (skip) without the venv,
# unless CI is set: then a missing venv fails.
set -uo pipefail
test_bin=$1 src=$2
py="${HETRAIN_ONNX_VENV:-$src/.venv-onnx}/bin/python"
dir=$("$py" -c "import onnx, os; print(os.path.join(os.path.dirname(onnx.__file__), 'backend/test/data/node'))" 2>/dev/null)
if [ -z "$dir" ] || [ ! -d "$dir" ]; then
  if [ -n "${CI:-}" ]; then
    echo "FAIL: no onnx package with its node tests in the venv at $py (run tools/install_onnx_peer.sh)"
    exit 1
  fi
  echo "skipped: no onnx venv at $py (bash tools/install_onnx_peer.sh makes it)"
  exit 77
fi
HETRAIN_ONNX_NODE_TESTS="$dir" exec "$test_bin" --gtest_filter='OnnxNodeSuite.*'
