#!/usr/bin/env python3
"""PyTorch CPU reference for the training-throughput benchmark (tools/bench_train.sh).

Trains the same models as Hetrain's presets (same architecture, batch size and thread
count, AdamW) on random batches of the right shape and prints samples/s, CPU seconds per step
(all threads, as Hetrain's JSON log counts them) and the process's
peak RSS growth over the training loop, measured as Hetrain measures its own
(src/memory/process_memory.cpp): the high-water mark (VmHWM, reset through
/proc/self/clear_refs before the first step) minus the RSS before the first step.
Run with the peer's PyTorch 2.x (tools/install_peer.sh): .venv-peer/bin/python
tools/bench_train_torch.py PRESET [--mode eager|compile]. With --mode compile the model runs
through torch.compile (compiled during the warm-up steps). The timed loop has no hooks: the
activation bytes autograd saves are counted in one extra step before it, on the eager model.
With --precision bf16 the forward runs under CPU autocast (bf16), as in docs/PERFORMANCE.md.
The CNN runs in channels-last memory format by default, PyTorch's faster layout for it on the CPU
(1.3x over NCHW for fashion-cnn on one thread of the AMD EPYC in docs/PERFORMANCE.md); pass
--memory-format contiguous for NCHW.
"""
import argparse
import json
import os
import re
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
from gen_train_parity import Gpt, ResNet  # noqa: E402  (same architectures, parameter names)


def make(preset):
    if preset == "fashion-mlp":
        model = nn.Sequential(nn.Flatten(), nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 256),
                              nn.ReLU(), nn.Linear(256, 10))
        x = lambda: torch.randn(128, 1, 28, 28)
        y = lambda: torch.randint(0, 10, (128,))
        return model, x, y, 128, False
    if preset == "fashion-cnn":
        model = ResNet(widths=(16, 32, 64))
        x = lambda: torch.randn(128, 1, 28, 28)
        y = lambda: torch.randint(0, 10, (128,))
        return model, x, y, 128, False
    if preset == "gpt-mini":
        model = Gpt(vocab=256, context=64, layers=4, heads=4, d=128)
        ids = lambda: torch.randint(0, 256, (32, 64))
        return model, ids, ids, 32, True
    raise SystemExit(f"unknown preset {preset}")


def use_fused_attention():
    """Runs the GPT's attention through PyTorch's fused F.scaled_dot_product_attention."""
    import gen_train_parity

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        hd = C // self.heads
        q, k, v = (t.view(B, T, self.heads, hd).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))

    gen_train_parity.Attn.forward = forward


def process_memory():
    """(VmRSS, VmHWM) in bytes from /proc/self/status."""
    with open("/proc/self/status") as f:
        s = f.read()
    return tuple(int(re.search(k + r":\s+(\d+) kB", s).group(1)) * 1024 for k in ("VmRSS", "VmHWM"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("preset")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--memory-format", choices=["channels_last", "contiguous"],
                    default="channels_last", help="layout of the CNN's activations and weights")
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                    help="bf16: forward under torch.autocast('cpu', dtype=torch.bfloat16)")
    ap.add_argument("--mode", choices=["eager", "compile"], default="eager",
                    help="compile: torch.compile(model), compiled in the warm-up steps")
    ap.add_argument("--attention", choices=["math", "sdpa"], default="math",
                    help="gpt-mini's attention as written (softmax of masked scores) or through "
                         "F.scaled_dot_product_attention (slower for this shape on the CPUs "
                         "measured, docs/PERFORMANCE.md)")
    a = ap.parse_args()
    if a.attention == "sdpa":
        use_fused_attention()
    torch.manual_seed(0)
    torch.set_num_threads(a.threads)
    model, xs, ys, batch, language = make(a.preset)
    if a.preset == "fashion-cnn" and a.memory_format == "channels_last":
        model = model.to(memory_format=torch.channels_last)
        xs_plain = xs
        xs = lambda: xs_plain().to(memory_format=torch.channels_last)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    param_ptrs = {p.data_ptr() for p in model.parameters()}
    autocast = lambda: torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.precision == "bf16")

    def loss_of(m, x, y):
        with autocast():
            logits = m(x)
            return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), y.reshape(-1))

    # Activation memory, in a step of its own: bytes of the distinct tensors autograd saves for
    # backward (parameters excluded; autocast's bf16 weight copies count, as in Hetrain).
    saved = {}

    def pack(t):
        if t.data_ptr() not in param_ptrs:
            saved[t.data_ptr()] = max(saved.get(t.data_ptr(), 0), t.untyped_storage().nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss_of(model, xs(), ys()).backward()
    saved_bytes = sum(saved.values())
    opt.zero_grad(set_to_none=True)
    run = torch.compile(model) if a.mode == "compile" else model
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset the high-water mark to the current RSS
    rss0 = process_memory()[0]
    t_start, step_s = None, []
    for step in range(a.warmup + a.steps):
        if step == a.warmup:
            t_start, c0 = time.perf_counter(), time.process_time()
        t0 = time.perf_counter()
        loss = loss_of(run, xs(), ys())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step >= a.warmup:
            step_s.append(time.perf_counter() - t0)
    dt, cpu = time.perf_counter() - t_start, time.process_time() - c0
    peak = process_memory()[1]
    step_s.sort()
    print(json.dumps({"preset": a.preset, "framework": f"pytorch {torch.__version__}",
                      "mode": a.mode, "attention": a.attention,
                      "precision": a.precision, "threads": a.threads,
                      "memory_format": a.memory_format if a.preset == "fashion-cnn" else "-", "steps": a.steps,
                      "samples_per_s": a.steps * batch / dt,
                      "cpu_s_per_step": cpu / a.steps,
                      "step_time_s": step_s[len(step_s) // 2],
                      "saved_activation_bytes": saved_bytes,
                      "peak_rss_growth_bytes": peak - rss0}))


if __name__ == "__main__":
    main()
