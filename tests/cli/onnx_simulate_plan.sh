#!/usr/bin/env bash
# simulate/plan --onnx on exported models.
# 1. simulate --onnx: the imported fashion-mlp simulates the same nodes per step as the preset
#    (its graph is Hetrain's ops one to one); the imported GPT (positions and causal mask from
#    Shape -> Gather -> Range, folded to constants while building) simulates on cpu,sim:0.
# 2. plan --onnx: the MLP's parameter count and FLOPs by formula; the GPT recognised as the
#    planner's transformer: its plan equal to plan --model gpt of the same sizes, also with
#    tensor and pipeline parallelism (tp 2, pp 2); a PyTorch GPT-2 block (its attention fuses,
#    but it maps activations to activations, not ids to logits) stays a data-parallel graph and
#    refuses --tp 2. (PyTorch GPTs: onnx_torch_gpt.sh.)
# Usage: onnx_simulate_plan.sh HETRAIN SOURCE_DIR
set -uo pipefail
bin=$1 src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export XDG_CACHE_HOME="$tmp/cache"
for i in $(seq 1 300); do echo "the quick brown fox jumps over the lazy dog $i"; done > "$tmp/corpus.txt"
common=(--no-progress --no-record --threads 2 --steps 2 --eval-batches 1)
"$bin" train --preset fashion-mlp --hidden 32 --batch-size 16 "${common[@]}" \
  --export-onnx "$tmp/mlp.onnx" > "$tmp/t1.log" 2>&1 || { cat "$tmp/t1.log"; exit 1; }
"$bin" train --preset gpt-mini --data "$tmp/corpus.txt" --layers 2 --width 32 --heads 2 \
  --context 16 --batch-size 4 "${common[@]}" --export-onnx "$tmp/gpt.onnx" > "$tmp/t2.log" 2>&1 ||
  { cat "$tmp/t2.log"; exit 1; }

sim=(simulate --devices cpu,sim:0 --steps 2 --threads 2 --json --explain-placement
     --explain-threshold 0)
"$bin" "${sim[@]}" --preset fashion-mlp --hidden 32 --batch-size 16 > "$tmp/s0.json" ||
  exit 1
# The preset's training settings (no clipping), the model from the file.
"$bin" "${sim[@]}" --preset fashion-mlp --onnx "$tmp/mlp.onnx" --batch-size 16 \
  > "$tmp/s1.json" 2>"$tmp/s1.log" || { cat "$tmp/s1.log"; exit 1; }
"$bin" "${sim[@]}" --onnx "$tmp/gpt.onnx" --batch-size 4 > "$tmp/s2.json" 2>"$tmp/s2.log" ||
  { cat "$tmp/s2.log"; exit 1; }
python3 - "$tmp"/s0.json "$tmp"/s1.json "$tmp"/s2.json <<'PY' || exit 1
import json, sys
s0, s1, s2 = (json.load(open(p)) for p in sys.argv[1:])
print("preset", s0["nodes_per_step"], "nodes; imported mlp", s1["nodes_per_step"],
      "nodes; imported gpt", s2["nodes_per_step"], "nodes,", s2["step_time_s"], "s")
assert s1["preset"] == "onnx:mlp.onnx" and s2["preset"] == "onnx:gpt.onnx", (s1["preset"], s2["preset"])
ops = lambda s: sorted((e["node"], e["flops"]) for e in s["explain"])
assert ops(s1) == ops(s0), f"imported mlp simulates other nodes:\n{ops(s0)}\n{ops(s1)}"
assert s1["nodes_per_step"] == s0["nodes_per_step"]
assert s2["nodes_per_step"] > 0 and s2["step_time_s"] > 0
assert sum(d["busy_s"] for d in s2["devices"]) > 0
PY

plan=(plan --hardware a100-80gb-sxm --gpus 1 --tp 1 --pp 1 --zero 0 --offload none
      --recompute none --micro-batch 8 --global-batch 64 --precision fp32 --json)
"$bin" "${plan[@]}" --onnx "$tmp/mlp.onnx" > "$tmp/p1.json" 2>"$tmp/p1.log" ||
  { cat "$tmp/p1.log"; exit 1; }
"$bin" "${plan[@]}" --onnx "$tmp/gpt.onnx" > "$tmp/p2.json" 2>"$tmp/p2.log" ||
  { cat "$tmp/p2.log"; exit 1; }
"$bin" "${plan[@]}" --model gpt --layers 2 --hidden 32 --heads 2 --seq 16 --vocab 256 \
  > "$tmp/p3.json" || exit 1
split=(plan --hardware a100-80gb-sxm --gpus 4 --tp 2 --pp 2 --zero 0 --offload none
       --recompute none --micro-batch 4 --global-batch 64 --precision fp32 --json)
"$bin" "${split[@]}" --onnx "$tmp/gpt.onnx" > "$tmp/p5.json" 2>"$tmp/p5.log" ||
  { cat "$tmp/p5.log"; exit 1; }
"$bin" "${split[@]}" --model gpt --layers 2 --hidden 32 --heads 2 --seq 16 --vocab 256 \
  > "$tmp/p6.json" || exit 1
python3 - "$tmp"/p1.json "$tmp"/p2.json "$tmp"/p3.json "$tmp"/p5.json "$tmp"/p6.json <<'PY' || exit 1
import json, sys
def plan(p):
    j = json.load(open(p))
    return j["plans"][0] if "plans" in j else j
p1, p2, p3, p5, p6 = (plan(p) for p in sys.argv[1:])
# MLP 784 -> 32 -> 10: weights and biases; 2 FLOPs per multiply-add, x3 for the backward.
params = 784 * 32 + 32 + 32 * 10 + 10
flops = 3 * 64 * 2 * (784 * 32 + 32 * 10)
print("mlp: params", p1["params"], "model flops/step", p1["model_flops_per_step"])
assert p1["params"] == params, (p1["params"], params)
assert p1["model_flops_per_step"] == flops, (p1["model_flops_per_step"], flops)
print("gpt: params", p2["params"], "vs --model gpt", p3["params"], "; model flops/step",
      p2["model_flops_per_step"], "vs", p3["model_flops_per_step"])
assert p2["params"] == p3["params"]
# A sample is one sequence of 16 tokens in both.
assert abs(p2["model_flops_per_step"] - p3["model_flops_per_step"]) <= 1e-9 * p3["model_flops_per_step"]
# Recognised as the planner's GPT: the whole plan is --model gpt's, at tp 1 / pp 1 and at
# tp 2 / pp 2 (per-device memory, step time, bubble, communication), the model's name aside.
def same(a, b):
    drop = lambda d: {k: v for k, v in d.items() if k not in ("model", "name", "preset")}
    return drop(a) == drop(b)
assert same(p2, p3), f"tp1 pp1 plans differ:\n{p2}\n{p3}"
assert same(p5, p6), f"tp2 pp2 plans differ:\n{p5}\n{p6}"
print("gpt tp 2 pp 2: step", p5["step_time_s"], "s, memory/device", p5["memory_per_gpu_bytes"]["total"],
      "bytes, strategy", p5["strategy"]["tp"], p5["strategy"]["pp"])
assert p5["strategy"]["tp"] == 2 and p5["strategy"]["pp"] == 2
PY
# A symbolic axis without a size (PyTorch's GPT-2 block, no metadata) is named; --seq sizes it.
block=$src/tests/data/torch_onnx/gpt2_block/model.onnx
out=$("$bin" plan --onnx "$block" 2>&1) && exit 1
grep -q "input 'input' axis 1 ('seq') has no fixed size; give it with --seq" <<<"$out" ||
  { echo "$out"; exit 1; }
"$bin" "${plan[@]}" --onnx "$block" --seq 6 > "$tmp/p4.json" || exit 1
# Not ids to logits, so the block is not recognised as a GPT.
out=$("$bin" "${split[@]}" --onnx "$block" --seq 6 2>&1) && { echo "$out"; exit 1; }
grep -q "planned with data parallelism only" <<<"$out" || { echo "$out"; exit 1; }
out=$("$bin" plan --onnx "$tmp/mlp.onnx" --preset gpt2-124m 2>&1) && exit 1
grep -q "give one of --preset, --model and --onnx" <<<"$out" || { echo "$out"; exit 1; }
echo "onnx_simulate_plan: ok"
