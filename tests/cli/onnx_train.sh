#!/usr/bin/env bash
# train/profile --onnx: an exported model imported back trains as Hetrain's own would.
# 1. One step at a learning rate too small to move an f32 weight evaluates exactly as the run
#    that exported it (the imported graph is bit for bit the module).
# 2. Fine-tuning it lowers the test loss; 3. profile --onnx profiles its steps;
# 4. a model whose input is not images or byte ids is refused, naming the input.
# Usage: onnx_train.sh HETRAIN
set -uo pipefail
bin=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export XDG_CACHE_HOME="$tmp/cache"
common=(--no-progress --no-record --threads 2 --batch-size 32 --json)
"$bin" train --preset fashion-mlp --hidden 32 --steps 30 "${common[@]}" \
  --export-onnx "$tmp/m.onnx" > "$tmp/a.json" 2>/dev/null || exit 1
"$bin" train --onnx "$tmp/m.onnx" --steps 1 --lr 1e-30 "${common[@]}" > "$tmp/b.json" 2>"$tmp/b.log" \
  || { cat "$tmp/b.log"; exit 1; }
grep "training onnx:m.onnx" "$tmp/b.log" || exit 1
a=$(grep -E '"test_(accuracy|loss)"' "$tmp/a.json"); b=$(grep -E '"test_(accuracy|loss)"' "$tmp/b.json")
echo "exported run: $a"; echo "imported run: $b"
[ -n "$a" ] && [ "$a" = "$b" ] || { echo "imported model evaluates differently"; exit 1; }
"$bin" train --onnx "$tmp/m.onnx" --steps 150 "${common[@]}" > "$tmp/c.json" 2>/dev/null || exit 1
python3 - "$tmp/a.json" "$tmp/c.json" <<'PY' || exit 1
import json, sys
a, c = (json.load(open(p))["test_loss"] for p in sys.argv[1:])
print(f"test loss {a:.4f} before fine-tuning, {c:.4f} after")
sys.exit(0 if c < a else 1)
PY
"$bin" profile --onnx "$tmp/m.onnx" --steps 2 --warmup-steps 1 --batch-size 16 --threads 2 \
  --no-progress > "$tmp/p.txt" 2>&1 || { cat "$tmp/p.txt"; exit 1; }
grep -E "^profile of onnx:m.onnx" "$tmp/p.txt" && grep -E "^matmul " "$tmp/p.txt" || { cat "$tmp/p.txt"; exit 1; }
# A model of another kind: ONNX's own Abs node test, input (3, 4, 5).
abs=/usr/share/libonnx-testdata/data/node/test_abs/model.onnx
if [ -f "$abs" ]; then
  out=$("$bin" train --onnx "$abs" --steps 1 2>&1)
  echo "$out"
  grep -q "input 'x' must be images (N, 1, 28, 28) f32" <<<"$out" || exit 1
fi
echo "onnx_train: ok"
