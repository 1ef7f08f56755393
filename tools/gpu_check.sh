#!/usr/bin/env bash
# GPU check of the CUDA backend (issue 8), for a machine with an NVIDIA GPU. In order:
#   1. builds Hetrain with HETRAIN_CUDA=ON into build-gpu/ (hetrain and test_cuda only);
#   2. runs tests/cuda (every CUDA kernel against the CPU backend), NCCL on this GPU, the
#      scheduler tests with a real cuda:0, the PyTorch parity table pinned to cuda:0, then the
#      kernels' micro-benchmarks (bench/bench_cuda.cpp, when Google Benchmark is installed);
#   3. times training steps in bf16 of gpt-mini and of a GPT-2-124M-shaped model (12 layers,
#      768 wide, 12 heads, context 1024; byte vocabulary as Hetrain's gpt preset) with
#      `hetrain train --devices cpu,cuda:0`, then the same model under PyTorch on the same GPU
#      (eager, and torch.compile if it works);
#      after a loss-agreement check (gpt-mini fp32 on cpu against cpu,cuda:0) and ZeRO 0-3 with
#      the state on cuda:0 (NCCL, pinned offload; stages 1-3 bit for bit stage 0's losses);
#   4. prints a markdown table: step time, tokens/s, MFU against the measured bf16 GEMM rate,
#      peak GPU memory, final loss; then where the 124M step's time goes (hetrain perfmodel
#      show --sort time after a recorded run).
# Sized for under 8 minutes on one H200 (each timed run is cut off after GPU_CHECK_TIMEOUT s).
#
# Usage: tools/gpu_check.sh        Environment: GPU_CHECK_BATCH (124M model's batch, 8),
#   GPU_CHECK_STEPS (timed steps, 8), GPU_CHECK_TIMEOUT (seconds per run, 150),
#   GPU_CHECK_BUILD (build directory, build-gpu), GPU_CHECK_PREBUILT (an archive from
#   tools/gpu_pack.sh: no build here, its binaries and libraries run with the CUDA libraries
#   this machine has; for a GPU machine without the Debian build dependencies),
#   GPU_CHECK_LOGS (a directory that keeps every log; default: a temporary one),
#   GPU_CHECK_BENCH_TIMEOUT (seconds for the kernel micro-benchmarks, 120).
#   Exit status 1 if the build or a CUDA test fails (the timings still run after a test
#   failure, and say so).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${GPU_CHECK_BUILD:-build-gpu}
BATCH=${GPU_CHECK_BATCH:-8}
STEPS=${GPU_CHECK_STEPS:-8}
RUN_TIMEOUT=${GPU_CHECK_TIMEOUT:-150}
PREBUILT=${GPU_CHECK_PREBUILT:-}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
tmp=${GPU_CHECK_LOGS:-$work/logs}
mkdir -p "$tmp"
say() { printf '\n== %s\n' "$*" >&2; }
die() {
  printf 'gpu_check: %s\n' "$*" >&2
  exit 1
}
status=0

say "GPU"
command -v nvidia-smi > /dev/null 2>&1 || die "nvidia-smi not found: no NVIDIA driver here"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >&2 ||
  die "nvidia-smi found no usable GPU"

if [ -n "$PREBUILT" ]; then
  say "prebuilt binaries ($PREBUILT)"
  [ -f "$PREBUILT" ] || die "GPU_CHECK_PREBUILT=$PREBUILT is not a file (tools/gpu_pack.sh makes one)"
  tar -C "$work" -xJf "$PREBUILT" || die "cannot unpack $PREBUILT"
  # The CUDA libraries come from this machine: its toolkit, or the NVIDIA wheels PyTorch uses.
  # Only the packed binaries see the packed libraries (through wrappers), so python3 and
  # PyTorch keep this machine's own libstdc++ and friends.
  cuda_libs=$(
    for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib; do
      [ -d "$d" ] && echo "$d"
    done
    python3 -c 'import glob, nvidia; [print(d) for p in nvidia.__path__ for d in sorted(glob.glob(p + "/*/lib"))]' 2> /dev/null || true
  )
  libpath="$work/lib:$(echo "$cuda_libs" | paste -sd:)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  missing=$(LD_LIBRARY_PATH=$libpath ldd "$work"/bin/* | grep 'not found' | sort -u || true)
  [ -z "$missing" ] || die "libraries not found for the prebuilt binaries: $missing"
  mkdir -p "$work/wrap"
  for b in "$work"/bin/*; do
    printf '#!/bin/sh\nLD_LIBRARY_PATH=%s exec %s "$@"\n' "'$libpath'" "'$b'" > "$work/wrap/${b##*/}"
    chmod +x "$work/wrap/${b##*/}"
  done
  bin=$work/wrap
  HETRAIN=$bin/hetrain TEST_CUDA=$bin/test_cuda BENCH_CUDA=$bin/bench_cuda
  TEST_DIST=$bin/test_distributed TEST_RUNTIME=$bin/test_runtime TEST_PARITY=$bin/test_parity
else
  say "build ($BUILD, HETRAIN_CUDA=ON)"
  for tool in cmake ninja; do
    command -v "$tool" > /dev/null 2>&1 || die "$tool not found (tools/install_deps.sh installs the build tools)"
  done
  if ! command -v nvcc > /dev/null 2>&1 && [ ! -x /usr/local/cuda/bin/nvcc ]; then
    die "nvcc not found: install the CUDA toolkit (or put its bin/ on PATH)"
  fi
  if ! cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DHETRAIN_CUDA=ON \
    > "$tmp/configure.log" 2>&1; then
    tail -30 "$tmp/configure.log" >&2
    die "cmake configure failed (missing libraries? tools/install_deps.sh installs them)"
  fi
  t0=$(date +%s)
  targets=(hetrain test_cuda test_distributed test_runtime test_parity)
  grep -q 'build bench/bench_cuda:' "$BUILD/build.ninja" && targets+=(bench_cuda)
  if ! cmake --build "$BUILD" -j "$(nproc)" --target "${targets[@]}" > "$tmp/build.log" 2>&1; then
    grep -E -A5 'error|FAILED' "$tmp/build.log" | head -60 >&2
    die "build failed"
  fi
  echo "built in $(($(date +%s) - t0)) s" >&2
  HETRAIN=$BUILD/hetrain TEST_CUDA=$BUILD/tests/test_cuda BENCH_CUDA=$BUILD/bench/bench_cuda
  TEST_DIST=$BUILD/tests/test_distributed TEST_RUNTIME=$BUILD/tests/test_runtime
  TEST_PARITY=$BUILD/tests/test_parity
fi
"$HETRAIN" version >&2

say "CUDA kernels against the CPU backend (tests/cuda)"
if timeout 300 "$TEST_CUDA" --gtest_color=no > "$tmp/test_cuda.log" 2>&1; then
  grep -E '^\[  (PASSED|SKIPPED) ' "$tmp/test_cuda.log" >&2 || true
else
  status=1
  grep -E '^\[  FAILED|Failure|cuda .*, cpu ' "$tmp/test_cuda.log" | head -80 >&2 || true
  echo "gpu_check: CUDA tests FAILED (full log above is cut; rerun $TEST_CUDA)" >&2
fi
if grep -q 'Skipped.*no CUDA device\|no CUDA device' "$tmp/test_cuda.log"; then
  grep -m1 'no CUDA device' "$tmp/test_cuda.log" >&2
  die "the CUDA tests see no CUDA device (driver too old for CUDA 13? check $HETRAIN version)"
fi

# The NCCL communicator on this machine's GPU (one rank), and the scheduler's tests with a real
# cuda:0 among the devices.
for t in "$TEST_DIST World.Nccl*:ZeroDevice.*:ZeroOnStateDevice.*" \
  "$TEST_RUNTIME Scheduler.*:ListScheduler.*"; do
  set -f; set -- $t; set +f
  [ -x "$1" ] || continue
  say "$(basename "$1") --gtest_filter=$2"
  if timeout 120 "$1" --gtest_color=no --gtest_filter="$2" > "$tmp/$(basename "$1").log" 2>&1; then
    grep -E '^\[  (PASSED|SKIPPED) |Skipped|no GPU' "$tmp/$(basename "$1").log" >&2 || true
  else
    status=1
    grep -E '^\[  FAILED|Failure|rror' "$tmp/$(basename "$1").log" | head -40 >&2 || true
    echo "gpu_check: $(basename "$1") FAILED" >&2
  fi
done

# The PyTorch parity table (tests/parity) with every node pinned to cuda:0, forward and
# gradients; cases needing a primitive without a CUDA kernel are listed, not run.
if [ -x "$TEST_PARITY" ]; then
  say "PyTorch parity table on cuda:0 (tests/parity)"
  if HETRAIN_PARITY_DEVICE=cuda:0 HETRAIN_SOURCE_DIR=$PWD timeout 120 "$TEST_PARITY" \
    --gtest_color=no > "$tmp/test_parity.log" 2>&1; then
    grep -E '^\[  PASSED ' "$tmp/test_parity.log" >&2 || true
  else
    status=1
    grep -E '^\[  FAILED|Failure|cases;|threw' "$tmp/test_parity.log" | head -60 >&2 || true
    echo "gpu_check: parity on cuda:0 FAILED" >&2
  fi
  grep -E 'not run' "$tmp/test_parity.log" | sed 's/; worst.*; / /' >&2 || true
fi

if [ -x "$BENCH_CUDA" ]; then
  say "kernel micro-benchmarks (bench/bench_cuda.cpp)"
  timeout "${GPU_CHECK_BENCH_TIMEOUT:-120}" "$BENCH_CUDA" --benchmark_min_time=0.2 \
    --benchmark_counters_tabular=true >&2 || echo "gpu_check: bench_cuda failed or timed out" >&2
else
  echo "bench_cuda not built (Google Benchmark missing): no kernel micro-benchmarks" >&2
fi

say "training steps (bf16)"
# A corpus for the byte-level models (the default one is a Debian package that may be absent).
head -c 3000000 /dev/urandom | base64 > "$work/corpus.txt"
rows="$tmp/rows.jsonl"
: > "$rows"
# One JSON line per run: {"run", "model", "batch", "context", "layers", "width", ...result}.
record() { python3 -c 'import json,sys; d=json.loads(sys.argv[1]); d.update(json.loads(sys.argv[2])); print(json.dumps(d))' "$1" "$2" >> "$rows"; }

hetrain_run() {  # model-name layers width heads context batch [state-device [placement]]
  local name=$1 layers=$2 width=$3 heads=$4 context=$5 batch=$6 state=${7:-auto}
  local placement=${8:-heft}
  local label=hetrain stem=$name
  [ "$state" = auto ] || label="hetrain, state on $state" stem="$name-state-$state"
  [ "$placement" = heft ] || label="$label, $placement" stem="$stem-$placement"
  local meta="{\"run\": \"$label\", \"model\": \"$name\", \"layers\": $layers, \"width\": $width, \"context\": $context, \"batch\": $batch}"
  echo "$label $name ..." >&2
  local rc=0
  timeout "$RUN_TIMEOUT" "$HETRAIN" train --preset gpt-mini --layers "$layers" \
    --width "$width" --heads "$heads" --context "$context" --batch-size "$batch" \
    --steps "$((STEPS + 3))" --dropout 0 --precision bf16 --devices cpu,cuda:0 \
    --placement "$placement" --state-device "$state" --data "$work/corpus.txt" --eval-batches 1 \
    --log-every 1000000 \
    --no-progress --no-record --json-log "$tmp/$stem.jsonl" > "$tmp/$stem.out" 2> "$tmp/$stem.err" || rc=$?
  if [ "$rc" -ne 0 ] || ! grep -q '"final"' "$tmp/$stem.jsonl" 2> /dev/null; then
    local why="exit $rc"
    [ "$rc" -eq 124 ] && why="timed out after $RUN_TIMEOUT s"
    echo "  failed ($why): $(tail -2 "$tmp/$stem.err" | tr '\n' ' ')" >&2
    record "$meta" "{\"error\": \"$why\"}"
    return 0
  fi
  grep -h '^scheduler' "$tmp/$stem.err" | sed 's/^/  /' >&2 || true
  local params
  params=$(grep -o '[0-9]* parameters' "$tmp/$stem.err" | head -1 | cut -d' ' -f1)
  record "$meta" "$(grep '"final"' "$tmp/$stem.jsonl" | python3 -c '
import json, sys
r = json.loads(sys.stdin.read())
peak = sum(r.get("device_peak_memory_bytes", {}).values()) or None
print(json.dumps({"step_time_s": r["step_time_s"], "params": int(sys.argv[1] or 0),
                  "peak_gpu_bytes": peak, "loss": r.get("train_loss")}))' "$params")"
}

torch_run() {  # model-name layers width heads context batch [--compile]
  local name=$1 layers=$2 width=$3 heads=$4 context=$5 batch=$6 mode=${7:-}
  local label="pytorch eager"
  [ -n "$mode" ] && label="pytorch compile"
  local meta="{\"run\": \"$label\", \"model\": \"$name\", \"layers\": $layers, \"width\": $width, \"context\": $context, \"batch\": $batch}"
  echo "$label $name ..." >&2
  local out rc=0
  out=$(timeout "$RUN_TIMEOUT" python3 tools/gpu_check_torch.py --layers "$layers" --width "$width" \
    --heads "$heads" --context "$context" --batch "$batch" --steps "$STEPS" ${mode:+"$mode"} \
    2> "$tmp/torch.err" | tail -1) || rc=$?
  if [ "$rc" -ne 0 ] || [ -z "$out" ]; then
    echo "  failed (exit $rc): $(tail -2 "$tmp/torch.err" | tr '\n' ' ')" >&2
    record "$meta" "{\"error\": \"exit $rc\"}"
    return 0
  fi
  record "$meta" "$out"
}

have_torch=0
if python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2> /dev/null; then
  have_torch=1
else
  echo "PyTorch with CUDA not importable: the PyTorch rows are skipped" >&2
fi
gemm="null"
if [ "$have_torch" -eq 1 ]; then
  gemm=$(python3 tools/gpu_check_torch.py --gemm | python3 -c 'import json,sys; print(json.load(sys.stdin)["bf16_gemm_tflops"])') || gemm="null"
  echo "measured bf16 GEMM rate (cuBLAS through PyTorch, 8192^3): $gemm TFLOP/s" >&2
fi

# The same short fp32 run on the CPU alone and with the GPU (density placement puts the dense
# work there): the losses must agree to summation order.
say "loss agreement: gpt-mini fp32, 5 steps, cpu against cpu,cuda:0"
for devs in cpu cpu,cuda:0; do
  timeout "$RUN_TIMEOUT" "$HETRAIN" train --preset gpt-mini --steps 5 --dropout 0 --precision fp32 \
    --devices "$devs" --placement density --data "$work/corpus.txt" --eval-batches 1 \
    --log-every 1 --no-progress --no-record --json-log "$tmp/agree-$devs.jsonl" \
    > /dev/null 2> "$tmp/agree-$devs.err" || echo "  $devs failed: $(tail -2 "$tmp/agree-$devs.err")" >&2
done
python3 - "$tmp/agree-cpu.jsonl" "$tmp/agree-cpu,cuda:0.jsonl" <<'PY' || status=1
import json, sys
def losses(p):
    try:
        return [r["loss"] for r in map(json.loads, open(p)) if "loss" in r and "final" not in r]
    except OSError:
        return []
a, b = losses(sys.argv[1]), losses(sys.argv[2])
print("cpu          ", a, file=sys.stderr)
print("cpu,cuda:0   ", b, file=sys.stderr)
worst = max((abs(x - y) / abs(x) for x, y in zip(a, b)), default=None)
ok = worst is not None and len(a) == len(b) and worst <= 1e-3
print(f"largest relative difference {worst}: {'agree' if ok else 'DIFFER'}", file=sys.stderr)
sys.exit(0 if ok else 1)
PY

# ZeRO with its buffers on the GPU (NCCL collectives, one rank): stages 1-3 must give stage 0's
# losses bit for bit; offload (pinned host memory) within 1e-5 of them (the host's AdamW may
# round differently from the GPU's).
say "ZeRO on cuda:0: losses of stages 0-3 and offload, gpt-mini (2 layers, width 64) fp32, 6 steps"
for run in "0" "1" "2" "3" "1 optimizer" "2 optimizer" "3 optimizer+params"; do
  set -- $run
  timeout "$RUN_TIMEOUT" "$HETRAIN" train --preset gpt-mini --layers 2 --width 64 --heads 2 \
    --steps 6 --dropout 0 --precision fp32 --devices cpu,cuda:0 --state-device cuda:0 --zero "$1" \
    ${2:+--offload "$2"} --data "$work/corpus.txt" --eval-batches 1 --log-every 1 --no-progress \
    --no-record --json-log "$tmp/zero-$1${2:+-$2}.jsonl" > /dev/null 2> "$tmp/zero-$1${2:+-$2}.err" ||
    echo "  zero $run failed: $(tail -2 "$tmp/zero-$1${2:+-$2}.err" | tr '\n' ' ')" >&2
done
python3 - "$tmp" <<'PY' || status=1
import json, os, sys
def losses(name):
    p = os.path.join(sys.argv[1], f"zero-{name}.jsonl")
    try:
        return [r["loss"] for r in map(json.loads, open(p)) if "loss" in r and "final" not in r]
    except OSError:
        return []
base, ok = losses("0"), True
print("zero 0        ", base, file=sys.stderr)
for name, exact in [("1", True), ("2", True), ("3", True), ("1-optimizer", False),
                    ("2-optimizer", False), ("3-optimizer+params", False)]:
    got = losses(name)
    if exact:
        good = bool(base) and got == base
    else:
        good = bool(base) and len(got) == len(base) and all(
            abs(a - b) <= 1e-5 * abs(b) for a, b in zip(got, base))
    ok = ok and good
    print(f"zero {name:18s} {'equal' if good else 'DIFFER'} {got}", file=sys.stderr)
sys.exit(0 if ok else 1)
PY

hetrain_run gpt-mini 4 128 4 64 32
hetrain_run gpt2-124M-shape 12 768 12 1024 "$BATCH"
# The same with the weights kept on the host (the layout before --state-device): the optimizer
# step on the CPU and the weights copied to the GPU every step.
hetrain_run gpt2-124M-shape 12 768 12 1024 "$BATCH" cpu
# Placement by density (each node where its roofline time plus input copies is least).
hetrain_run gpt2-124M-shape 12 768 12 1024 "$BATCH" auto density
if [ "$have_torch" -eq 1 ]; then
  torch_run gpt-mini 4 128 4 64 32
  torch_run gpt2-124M-shape 12 768 12 1024 "$BATCH"
  torch_run gpt2-124M-shape 12 768 12 1024 "$BATCH" --compile
fi

say "table"
python3 - "$rows" "$gemm" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
gemm = None if sys.argv[2] in ("", "null") else float(sys.argv[2])
print(f"measured bf16 GEMM rate: {gemm:.0f} TFLOP/s" if gemm else "bf16 GEMM rate: not measured (no PyTorch)")
print()
print("| model | run | batch x context | step (ms) | tokens/s | MFU | peak GPU memory (MiB) | final loss |")
print("|---|---|---|---|---|---|---|---|")
for r in rows:
    shape = f"{r['batch']} x {r['context']}"
    if "error" in r:
        print(f"| {r['model']} | {r['run']} | {shape} | {r['error']} | | | | |")
        continue
    tokens = r["batch"] * r["context"]
    t = r["step_time_s"]
    # Training FLOPs per token: 6 N (weights, forward and backward) + 12 L d T (attention).
    flops = 6 * r["params"] + 12 * r["layers"] * r["width"] * r["context"]
    mfu = f"{100 * flops * tokens / t / (gemm * 1e12):.1f}%" if gemm and r["params"] else "n/a"
    peak = f"{r['peak_gpu_bytes'] / 2**20:.0f}" if r.get("peak_gpu_bytes") else "n/a"
    loss = f"{r['loss']:.4f}" if r.get("loss") is not None else "n/a"
    print(f"| {r['model']} | {r['run']} | {shape} | {1e3 * t:.1f} | {tokens / t:,.0f} | {mfu} | {peak} | {loss} |")
PY

# Where the 124M step's time goes: the same run with the kernel timings recorded (each node
# waits for its kernel, so the step is slower than above; the shares are what matter).
say "where the gpt2-124M-shape step goes (kernel time per primitive and device, 11 steps)"
cache="$work/perfcache"
if XDG_CACHE_HOME=$cache HOME=$work/home timeout "$RUN_TIMEOUT" "$HETRAIN" train --preset gpt-mini \
  --layers 12 --width 768 --heads 12 --context 1024 --batch-size "$BATCH" --steps "$((STEPS + 3))" \
  --dropout 0 --precision bf16 --devices cpu,cuda:0 --data "$work/corpus.txt" --eval-batches 1 \
  --log-every 1000000 --no-progress > "$tmp/breakdown.out" 2>&1; then
  XDG_CACHE_HOME=$cache "$HETRAIN" perfmodel show --sort time | head -25
  XDG_CACHE_HOME=$cache "$HETRAIN" perfmodel show | tail -1
else
  echo "  failed: $(tail -2 "$tmp/breakdown.out" | tr '\n' ' ')" >&2
fi
exit "$status"
