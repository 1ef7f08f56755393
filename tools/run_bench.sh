#!/usr/bin/env bash
# Runs bench/bench_core (Hetrain) and tools/bench_torch.py (PyTorch CPU) in one go and prints
# one table: rates by wall clock and per CPU second (x cores), ratios and the issue's targets.
#
#   tools/run_bench.sh                   # BUILD=build REPS=3 OUT=$BUILD/bench-results
#   REPS=1 FILTER='Gemm|Fma' tools/run_bench.sh
#
# Needs a build configured with -DHETRAIN_BUILD_BENCH=ON and /usr/bin/python3 with torch.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
REPS=${REPS:-3}
OUT=${OUT:-$BUILD/bench-results}
FILTER=${FILTER:-.}
mkdir -p "$OUT"
{
  echo "cpu: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cpus"
  echo "flags: $(grep -m1 -o -w -E 'avx2|fma|avx512f|avx512_bf16|amx_bf16|amx_tile' /proc/cpuinfo | sort -u | tr '\n' ' ')"
  echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
} | tee "$OUT/machine.txt"
"$BUILD/bench/bench_core" --benchmark_filter="$FILTER" --benchmark_repetitions="$REPS" \
  --benchmark_out="$OUT/hetrain.json" --benchmark_out_format=json >/dev/null
/usr/bin/python3 tools/bench_torch.py --reps "$REPS" --json "$OUT/torch.json" >/dev/null
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT/machine.txt"
/usr/bin/python3 - "$OUT/hetrain.json" "$OUT/torch.json" <<'PY' | tee "$OUT/table.md"
import json, sys

h = json.load(open(sys.argv[1]))["benchmarks"]
t = {r["name"]: r for r in json.load(open(sys.argv[2]))}

def best(prefix, key, lower=False):
    """Best value of a counter over the repetitions of the runs whose name starts with prefix."""
    v = [b[key] for b in h if b.get("run_type") == "iteration" and b["name"].startswith(prefix)
         and key in b and not b.get("error_occurred")]
    if not v:
        return None
    return min(v) if lower else max(v)

def f(x, d=1):
    return "—" if x is None else f"{x:.{d}f}"

def pct(a, b):
    return "—" if a is None or b is None or b == 0 else f"{100 * a / b:.0f}%"

peak1 = (best("BM_FmaPeak/1/", "GFLOPS"), best("BM_FmaPeak/1/", "GFLOPS_cpu"))
peak = (best("BM_FmaPeak/0/", "GFLOPS"), best("BM_FmaPeak/0/", "GFLOPS_cpu"))
triad = (best("BM_Triad", "GBps"), best("BM_Triad", "GBps_cpu"))
read = (best("BM_ReadBandwidth", "GBps"), best("BM_ReadBandwidth", "GBps_cpu"))
print("| ceiling | wall | per CPU s x cores |")
print("|---|---|---|")
print(f"| FMA peak, 1 thread (GFLOP/s) | {f(peak1[0])} | {f(peak1[1])} |")
print(f"| FMA peak, all threads (GFLOP/s) | {f(peak[0])} | {f(peak[1])} |")
print(f"| triad 3x64 MiB (GB/s) | {f(triad[0], 2)} | {f(triad[1], 2)} |")
print(f"| read 64 MiB (GB/s) | {f(read[0], 2)} | {f(read[1], 2)} |")
print()
print("| GEMM n | dtype | Hetrain wall | Hetrain cpu | PyTorch wall | PyTorch cpu | Hetrain/PyTorch (cpu) | Hetrain % of FMA peak (cpu) |")
print("|---|---|---|---|---|---|---|---|")
for dt, flag in (("f32", 0), ("bf16", 1)):
    for n in (256, 1024, 2048, 4096):
        p = f"BM_Gemm/n:{n}/bf16:{flag}/"
        hw, hc = best(p, "GFLOPS"), best(p, "GFLOPS_cpu")
        r = t.get(f"gemm/{dt}/{n}", {})
        tw, tc = r.get("wall"), r.get("cpu")
        note = "" if tw is not None else f" ({r.get('unit', 'not run')})"
        print(f"| {n} | {dt} | {f(hw)} | {f(hc)} | {f(tw)}{note} | {f(tc)} | "
              f"{'—' if tc is None or hc is None else f'{hc / tc:.2f}'} | {pct(hc, peak[1])} |")
print()
print("| 64 MiB f32 op (GB/s) | Hetrain wall | Hetrain cpu | PyTorch wall | PyTorch cpu | PyTorch out= cpu | Hetrain % of bandwidth (cpu) |")
print("|---|---|---|---|---|---|---|")
for i, op in enumerate(("add", "mul", "exp", "sum")):
    p = f"BM_Elementwise/{i}/"
    hw, hc = best(p, "GBps"), best(p, "GBps_cpu")
    r = t.get(f"elementwise/{op}", {})
    ro = t.get(f"elementwise/{op}_out", {})
    ceiling = read[1] if op == "sum" else triad[1]
    print(f"| {op} | {f(hw, 2)} | {f(hc, 2)} | {f(r.get('wall'), 2)} | {f(r.get('cpu'), 2)} | "
          f"{f(ro.get('cpu'), 2)} | {pct(hc, ceiling)} of {'read' if op == 'sum' else 'triad'} |")
print()
print("| sgemm backend, n=2048 | GFLOP/s wall | GFLOP/s cpu |")
print("|---|---|---|")
for b in ("0", "1"):
    p = f"BM_SgemmBackend/n:2048/openblas:{b}/"
    lab = next((x.get("label", "") for x in h if x["name"].startswith(p)), "")
    print(f"| {lab} | {f(best(p, 'GFLOPS'))} | {f(best(p, 'GFLOPS_cpu'))} |")
print()
print("| per node (10k-node chain) | µs wall | µs cpu |")
print("|---|---|---|")
for k in ("us_per_node", "build_us", "eval_us"):
    print(f"| {k} | {f(best('BM_NodeOverhead', k, True), 2)} | {f(best('BM_NodeOverhead', k + '_cpu', True), 2)} |")
print()
g = best("BM_Gemm/n:2048/bf16:0/", "GFLOPS_cpu")
e = [best(f"BM_Elementwise/{i}/", "GBps_cpu") for i in range(3)]
node = best("BM_NodeOverhead", "us_per_node_cpu", True)
print(f"targets (cpu-time rates): f32 GEMM 2048 >= 70% of FMA peak: {pct(g, peak[1])}; "
      f"elementwise >= 60% of triad: add {pct(e[0], triad[1])}, mul {pct(e[1], triad[1])}, "
      f"exp {pct(e[2], triad[1])}; node overhead < 2 us: {f(node, 2)} us")
PY
