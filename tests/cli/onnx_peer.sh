#!/usr/bin/env bash
# A preset trained briefly, exported to ONNX two ways (train --export-onnx at the end of the run,
# hetrain export from the checkpoint: the same bytes), then checked by onnx and onnxruntime from
# the pinned venv (tools/install_onnx_peer.sh): full_check, I/O names, opset, IR, and
# onnxruntime's outputs at two batch sizes against Hetrain's own forward (rtol 1e-4, atol 1e-5).
# Finally Hetrain runs the exported file itself (hetrain run --expect): bit for bit for
# fashion-mlp and fashion-cnn. fashion-cnn also exported with --fold-bn, checked the same way.
# Usage: onnx_peer.sh HETRAIN SOURCE_DIR PRESET INPUT DIMS [train flags...]
# Exit 77 (skip) without the venv, unless CI is set: then a missing venv fails.
set -uo pipefail
bin=$1 src=$2 preset=$3 input=$4 dims=$5
shift 5
py="${HETRAIN_ONNX_VENV:-$src/.venv-onnx}/bin/python"
if ! "$py" -c "import onnx, onnxruntime" 2>/dev/null; then
  if [ -n "${CI:-}" ]; then
    echo "FAIL: no onnx/onnxruntime venv at $py (run tools/install_onnx_peer.sh); CI=$CI"
    exit 1
  fi
  echo "skipped: no onnx/onnxruntime venv at $py (bash tools/install_onnx_peer.sh makes it)"
  exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export XDG_CACHE_HOME="$tmp/cache"
"$bin" train --preset "$preset" "$@" --no-progress --no-record --threads 2 --save "$tmp/ckpt" \
  --export-onnx "$tmp/at_end.onnx" > "$tmp/train.log" 2>&1 || { cat "$tmp/train.log"; exit 1; }
grep "wrote $tmp/at_end.onnx: opset 17, IR 8" "$tmp/train.log" || { cat "$tmp/train.log"; exit 1; }
mkdir -p "$tmp/m17" "$tmp/m20"
"$bin" export "$tmp/ckpt" -o "$tmp/m17/model.onnx" --test-data 8,3 || exit 1
cmp "$tmp/at_end.onnx" "$tmp/m17/model.onnx" || { echo "train --export-onnx and export differ"; exit 1; }
"$py" "$src/tools/onnx_peer_check.py" "$tmp/m17/model.onnx" --inputs "$input" --outputs logits \
  --opset 17 --ir 8 --dims "$dims" || exit 1
# Opset 20: Gelu as one node for the GPT; the checker here is the Python one.
"$bin" export "$tmp/ckpt" -o "$tmp/m20/model.onnx" --opset 20 --test-data 4,5 || exit 1
"$py" "$src/tools/onnx_peer_check.py" "$tmp/m20/model.onnx" --inputs "$input" --outputs logits \
  --opset 20 --ir 9 --dims "$dims" || exit 1
# Hetrain runs its own export: bit for bit where the graph is Hetrain's ops one to one.
tol=(--rtol 0 --atol 0)
[ "$preset" = gpt-mini ] && tol=(--rtol 1e-4 --atol 1e-5)
for s in 0 1; do
  "$bin" run "$tmp/m17/model.onnx" --inputs "$tmp/m17/test_data_set_$s" \
    --expect "$tmp/m17/test_data_set_$s" "${tol[@]}" || exit 1
done
# --fold-bn (the ResNet): each BatchNormalization folded into its convolution; onnxruntime and
# Hetrain on the folded file against the unfolded module's outputs.
if [ "$preset" = fashion-cnn ]; then
  mkdir -p "$tmp/fold"
  "$bin" export "$tmp/ckpt" -o "$tmp/fold/model.onnx" --fold-bn --test-data 8,3 || exit 1
  "$py" - "$tmp/fold/model.onnx" <<'PY' || exit 1
import onnx, sys
ops = {n.op_type for n in onnx.load(sys.argv[1]).graph.node}
print("folded model ops:", sorted(ops))
sys.exit("BatchNormalization" in ops)
PY
  "$py" "$src/tools/onnx_peer_check.py" "$tmp/fold/model.onnx" --inputs "$input" \
    --outputs logits --opset 17 --ir 8 --dims "$dims" || exit 1
  "$bin" run "$tmp/fold/model.onnx" --inputs "$tmp/fold/test_data_set_0" \
    --expect "$tmp/fold/test_data_set_0" --rtol 1e-4 --atol 1e-5 || exit 1
fi
echo "onnx_peer $preset: ok"
