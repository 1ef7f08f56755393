#!/usr/bin/env python3
"""PyTorch CPU reference for bench/bench_core.cpp: the same GEMM sizes and dtypes, the same
elementwise ops and reduction on 64 MiB f32 tensors, with PyTorch's best settings
(torch.set_num_threads(nproc), warm-up, torch.inference_mode()).

    /usr/bin/python3 tools/bench_torch.py [--reps 3] [--json out.json]

Prints one JSON object per line: {"name", "wall", "cpu", "unit"} where wall is the best
rate over --reps repetitions by wall clock and cpu the rate per CPU second of this process
times the core count (what bench_core reports as *_cpu; see docs/PERFORMANCE.md).
"""
import argparse
import json
import os
import time

import torch

NPROC = os.cpu_count() or 1
MIB64 = 64 << 20


def measure(fn, work, min_time=0.5, max_iters=1000):
    """Runs fn() repeatedly for about min_time; returns (work per wall s, work per cpu s * cores)."""
    iters, w, c = 0, 0.0, 0.0
    while iters < max_iters and (w < min_time or iters == 0):
        w0, c0 = time.perf_counter(), time.process_time()
        fn()
        w += time.perf_counter() - w0
        c += time.process_time() - c0
        iters += 1
    return work * iters / w, work * iters / c * NPROC


def best(fn, work, reps, **kw):
    rates = [measure(fn, work, **kw) for _ in range(reps)]
    return max(r[0] for r in rates), max(r[1] for r in rates)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--max-seconds", type=float, default=60,
                    help="skip a GEMM whose one iteration is predicted to take longer")
    args = ap.parse_args()
    torch.set_num_threads(NPROC)
    results = []

    def emit(name, wall, cpu, unit):
        r = {"name": name, "wall": wall, "cpu": cpu, "unit": unit}
        results.append(r)
        print(json.dumps(r), flush=True)

    print(json.dumps({"torch": torch.__version__, "threads": torch.get_num_threads(),
                      "config": torch.__config__.parallel_info().splitlines()[:4]}), flush=True)
    with torch.inference_mode():
        g = torch.Generator().manual_seed(0)
        for dt, dname in ((torch.float32, "f32"), (torch.bfloat16, "bf16")):
            rate = None
            for n in (256, 1024, 2048, 4096):
                a = torch.randn(n, n, generator=g).to(dt)
                b = torch.randn(n, n, generator=g).to(dt)
                flops = 2.0 * n ** 3
                if rate is not None and flops / rate > args.max_seconds:
                    emit(f"gemm/{dname}/{n}", None, None,
                         f"skipped: predicted {flops / rate:.0f} s per GEMM")
                    continue
                torch.mm(a, b)  # warm-up
                reps = args.reps if n < 4096 else 1
                wall, cpu = best(lambda: torch.mm(a, b), flops * 1e-9, reps,
                                 min_time=0.5 if n < 4096 else 0.0)
                rate = wall * 1e9
                emit(f"gemm/{dname}/{n}", wall, cpu, "GFLOPS")
        n = MIB64 // 4
        x = torch.rand(n, generator=g) * 2 - 1
        y = torch.rand(n, generator=g) * 2 - 1
        out = torch.empty_like(x)
        # Both forms: a fresh output (as Hetrain's ops, whose allocator caches the block)
        # and out= (no allocation at all).
        cases = [
            ("add", lambda: torch.add(x, y), 3),
            ("add_out", lambda: torch.add(x, y, out=out), 3),
            ("mul", lambda: torch.mul(x, y), 3),
            ("exp", lambda: torch.exp(x), 2),
            ("sum", lambda: torch.sum(x), 1),
        ]
        for name, fn, operands in cases:
            fn()
            wall, cpu = best(fn, operands * MIB64 * 1e-9, args.reps)
            emit(f"elementwise/{name}", wall, cpu, "GBps")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
