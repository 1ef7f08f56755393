#!/usr/bin/env bash
# PyTorch-exported GPTs (tests/data/torch_onnx/gpt_explicit, gpt_sdpa; written by
# tools/gen_torch_onnx_fixtures.py): their attention and GELU fuse at import, so
# 1. plan --onnx recognises each as the planner's GPT: the plan equals plan --model gpt of the
#    same sizes at tp 1 / pp 1 and at tp 2 / pp 2 (fails when the attention does not fuse);
# 2. onnxruntime (pinned venv, CPU, optimizations off) on random ids at batch 3 / seq 8 and
#    batch 1 / seq 5 agrees with hetrain run (rtol 1e-4, atol 1e-5).
# Usage: onnx_torch_gpt.sh HETRAIN SOURCE_DIR
# Step 2 exits 77 (skip) without the venv, unless CI is set: then a missing venv fails.
set -uo pipefail
bin=$1 src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
plan=(plan --hardware a100-80gb-sxm --zero 0 --offload none --recompute none --global-batch 64
      --precision fp32 --json)
for m in gpt_explicit gpt_sdpa; do
  model=$src/tests/data/torch_onnx/$m/model.onnx
  for s in "1 1 1 8" "4 2 2 4"; do
    read -r gpus tp pp micro <<<"$s"
    p=("${plan[@]}" --gpus "$gpus" --tp "$tp" --pp "$pp" --micro-batch "$micro")
    "$bin" "${p[@]}" --onnx "$model" --seq 8 > "$tmp/a.json" 2>"$tmp/a.log" ||
      { cat "$tmp/a.log"; exit 1; }
    "$bin" "${p[@]}" --model gpt --layers 2 --hidden 16 --heads 2 --seq 8 --vocab 32 \
      > "$tmp/b.json" || exit 1
    python3 - "$tmp/a.json" "$tmp/b.json" "$m tp $tp pp $pp" <<'PY' || exit 1
import json, sys
def plan(p):
    j = json.load(open(p))
    return j["plans"][0] if "plans" in j else j
a, b = plan(sys.argv[1]), plan(sys.argv[2])
drop = lambda d: {k: v for k, v in d.items() if k not in ("model", "name", "preset")}
print(sys.argv[3], ": params", a["params"], "step", a["step_time_s"], "s")
assert drop(a) == drop(b), f"{sys.argv[3]}: plans differ:\n{a}\n{b}"
PY
  done
done

py="${HETRAIN_ONNX_VENV:-$src/.venv-onnx}/bin/python"
if ! "$py" -c "import onnx, onnxruntime" 2>/dev/null; then
  if [ -n "${CI:-}" ]; then
    echo "FAIL: no onnx/onnxruntime venv at $py (run tools/install_onnx_peer.sh); CI=$CI"
    exit 1
  fi
  echo "skipped: no onnx/onnxruntime venv at $py (bash tools/install_onnx_peer.sh makes it)"
  exit 77
fi
for m in gpt_explicit gpt_sdpa; do
  model=$src/tests/data/torch_onnx/$m/model.onnx
  for s in "3 8" "1 5"; do
    read -r b t <<<"$s"
    d=$tmp/$m-$b-$t
    mkdir -p "$d"
    "$py" - "$model" "$d" "$b" "$t" <<'PY' || exit 1
import sys
import numpy as np
import onnxruntime as ort
model, d, b, t = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
ids = np.random.default_rng(26 + b * t).integers(0, 32, size=(b, t), dtype=np.int64)
so = ort.SessionOptions()
so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
so.intra_op_num_threads = 1
sess = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
(y,) = sess.run(None, {sess.get_inputs()[0].name: ids})
np.save(f"{d}/input_0.npy", ids)
np.save(f"{d}/output_0.npy", y)
print(model.split("/")[-2], "onnxruntime", y.shape)
PY
    "$bin" run "$model" --inputs "$d" --expect "$d" --rtol 1e-4 --atol 1e-5 || exit 1
  done
done
echo "onnx_torch_gpt: ok"
