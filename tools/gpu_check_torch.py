#!/usr/bin/env python3
"""PyTorch side of tools/gpu_check.sh: the same GPT as Hetrain's gpt preset (byte vocabulary,
learned positions, pre-norm blocks, tanh GELU, tied output embedding, AdamW) trained on random
batches on one CUDA GPU under bf16 autocast, eager or torch.compile. Prints one JSON line:
median step time after warm-up, parameters, peak allocated GPU memory.

  python3 tools/gpu_check_torch.py --layers 12 --width 768 --heads 12 --context 1024 --batch 8
  python3 tools/gpu_check_torch.py --gemm      # measured bf16 GEMM rate (TFLOP/s), for MFU
"""
import argparse
import json
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Attn(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads, self.qkv, self.proj = heads, nn.Linear(d, 3 * d), nn.Linear(d, d)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.ln1, self.attn, self.ln2 = nn.LayerNorm(d), Attn(d, heads), nn.LayerNorm(d)
        self.fc, self.fc_proj = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.fc_proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class Gpt(nn.Module):
    def __init__(self, vocab, context, layers, heads, d):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(context, d)
        self.blocks = nn.ModuleList([Block(d, heads) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(d)

    def forward(self, ids):
        h = self.wte(ids) + self.wpe(torch.arange(ids.shape[1], device=ids.device))
        for b in self.blocks:
            h = b(h)
        return self.ln_f(h) @ self.wte.weight.T


def gemm_tflops(n=8192, reps=20):
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        a @ b
    torch.cuda.synchronize()
    return 2 * n ** 3 * reps / (time.perf_counter() - t0) / 1e12


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--gemm", action="store_true")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("PyTorch sees no CUDA device")
    if a.gemm:
        print(json.dumps({"bf16_gemm_tflops": gemm_tflops()}))
        return
    torch.manual_seed(0)
    model = Gpt(256, a.context, a.layers, a.heads, a.width).cuda()
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    step_fn = model
    if a.compile:
        step_fn = torch.compile(model)
    ids = lambda: torch.randint(0, 256, (a.batch, a.context), device="cuda")
    torch.cuda.reset_peak_memory_stats()
    times = []
    for step in range(a.warmup + a.steps):
        x, y = ids(), ids()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = step_fn(x)
        loss = F.cross_entropy(logits.float().reshape(-1, 256), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        torch.cuda.synchronize()
        if step >= a.warmup:
            times.append(time.perf_counter() - t0)
    times.sort()
    print(json.dumps({"framework": f"pytorch {torch.__version__}" + (" compile" if a.compile else " eager"),
                      "params": params, "step_time_s": times[len(times) // 2],
                      "peak_gpu_bytes": torch.cuda.max_memory_allocated(), "loss": loss.item()}))


if __name__ == "__main__":
    main()
