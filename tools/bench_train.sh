#!/usr/bin/env bash
# Training throughput of the three presets: Hetrain against PyTorch CPU (same model, batch,
# thread count, AdamW), one after the other in the same run; both time STEPS steps after 5
# warm-up steps. Usage: [THREADS=N] [ROUNDS=R] [PRESETS="a b"] tools/bench_train.sh [STEPS]
# (threads default: nproc; rounds 1; presets all three).
# With ROUNDS > 1 the pair is run R times per preset (Hetrain first in odd rounds, PyTorch first
# in even ones), the presets in turn, and a summary gives the median, lowest and highest ratio of
# each: on a VM whose speed drifts by tens of percent within minutes, the median of adjacent
# pairs is the ratio to quote.
# Memory, measured the same way in both processes: growth of the resident set over the training
# loop (high-water mark, reset before the first step, minus the RSS then; "RSS+"). Hetrain's
# allocator peak (live tensors, all tags) is shown beside it. "cpu ms": CPU time per timed step
# of the whole process (all threads); its ratio (PyTorch / Hetrain) is the steadier comparison
# on a loaded machine, where wall-clock rates depend on the share of the cores each process got.
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-30}
threads=${THREADS:-$(nproc)}
rounds=${ROUNDS:-1}
presets=${PRESETS:-fashion-mlp fashion-cnn gpt-mini}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# One side of a pair for $preset: sets h (Hetrain's final record) or t (PyTorch's).
run_hetrain() {
  # As the PyTorch script: 5 warm-up steps, then STEPS timed ones (per-step records of the log).
  ./build/hetrain train --preset "$preset" --steps $((steps + 5)) --threads "$threads" --no-progress \
    --log-every 1 --eval-batches 1 --no-record --json-log "$tmp/$preset.jsonl" > /dev/null 2>&1
  h=$(python3 - "$tmp/$preset.jsonl" <<'PY'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
final = next(r for r in recs if r.get("final"))
steps = [r for r in recs if not r.get("final") and r["step"] > 5]
batch = final["samples_per_s"] * final["wall_s"] / final["steps"]
final["samples_per_s"] = len(steps) * batch / sum(batch / r["samples_per_s"] for r in steps)
final["cpu_s_per_step"] = sum(r["cpu_s"] for r in steps) / len(steps)
print(json.dumps(final))
PY
)
}
# The peer: PyTorch 2.x from tools/install_peer.sh (PEER_PYTHON overrides), eager and
# torch.compile one after the other; the faster is quoted ("mode" says which).
peer=${PEER_PYTHON:-.venv-peer/bin/python}
[ -x "$peer" ] || { echo "no peer at $peer: run tools/install_peer.sh first" >&2; exit 1; }
run_torch() {
  local e c
  e=$("$peer" tools/bench_train_torch.py "$preset" --steps "$steps" --threads "$threads" --mode eager)
  c=$("$peer" tools/bench_train_torch.py "$preset" --steps "$steps" --threads "$threads" \
    --mode compile --warmup 10 2>/dev/null) || c=$e
  t=$(python3 -c 'import json, sys
e, c = (json.loads(a) for a in sys.argv[1:])
print(json.dumps(c if c["samples_per_s"] > e["samples_per_s"] else e))' "$e" "$c")
}
# This VM's FMA peak and memory bandwidth drift by tens of percent within minutes, and the ratio
# with them (Hetrain's step is the more memory-bound): both are printed before and after the
# pairs, from `hetrain bench --quick` with its profile kept out of the user's cache.
machine() {
  XDG_CACHE_HOME="$tmp/cache" ./build/hetrain bench --quick --threads "$threads" 2>/dev/null |
    awk 'function before(unit) { for (i = 2; i <= NF; ++i) if ($i == unit) return $(i - 1) }
         /^fma peak/ {f = before("GFLOP/s")} /^triad 3 x 128/ {t = before("GB/s")}
         END {printf "FMA peak %s GFLOP/s, triad %s GB/s", f, t}'
}
echo "threads $threads, load average before: $(cut -d' ' -f1-3 /proc/loadavg); $(machine)"
printf "%-12s %11s %11s %-7s %6s %9s %9s %6s %13s %13s %13s %6s\n" preset "hetrain s/s" \
  "pytorch s/s" mode ratio "h cpu ms" "pt cpu ms" ratio "hetrain alloc" "hetrain RSS+" "pytorch RSS+" ratio
for round in $(seq "$rounds"); do
for preset in $presets; do
  # Even rounds run PyTorch first: on a VM whose speed drifts, a fixed order would give one
  # side the later (faster or slower) minute of every pair.
  if [ $((round % 2)) -eq 0 ]; then run_torch; run_hetrain; else run_hetrain; run_torch; fi
  python3 - "$preset" "$h" "$t" "$tmp/ratios.jsonl" <<'PY'
import json, sys
p, h, t = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
hs, ts = h["samples_per_s"], t["samples_per_s"]
mib = lambda b: f"{b / 2**20:.1f} MiB"
hr, tr = h.get("peak_rss_growth_bytes", -1), t["peak_rss_growth_bytes"]
hc, tc = 1e3 * h["cpu_s_per_step"], 1e3 * t["cpu_s_per_step"]
print(f"{p:<12} {hs:11.1f} {ts:11.1f} {t.get('mode', '-'):<7} {hs/ts:6.2f} {hc:9.1f} {tc:9.1f} {tc/hc:6.2f} "
      f"{mib(h['peak_memory_bytes']['total']):>13} {mib(hr) if hr >= 0 else 'n/a':>13} "
      f"{mib(tr):>13} {hr / tr if hr >= 0 and tr > 0 else 0:6.2f}")
print(json.dumps({"preset": p, "ratio": hs / ts, "cpu_ratio": tc / hc}),
      file=open(sys.argv[4], "a"))
PY
done
done
if [ "$rounds" -gt 1 ]; then
  python3 - "$tmp/ratios.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print(f"{'preset':<12} {'rounds':>6} {'median ratio':>12} {'range':>13} {'median cpu ratio':>16}")
for p in dict.fromkeys(r["preset"] for r in rows):
    r = [x["ratio"] for x in rows if x["preset"] == p]
    c = [x["cpu_ratio"] for x in rows if x["preset"] == p]
    print(f"{p:<12} {len(r):>6} {statistics.median(r):12.2f} {min(r):6.2f}-{max(r):<6.2f} "
          f"{statistics.median(c):16.2f}")
PY
fi
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg); $(machine)"
