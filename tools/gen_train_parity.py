#!/usr/bin/env python3
"""Reference data for the training-step parity test (tests/training/test_step_parity.cpp).

For each model (mlp, cnn, gpt) at a small size: PyTorch builds the same architecture with the
same parameter names as Hetrain, draws weights and a batch, computes one forward/backward, and
stores weights, batch, loss and every gradient in tests/data/train_parity.safetensors.

Run with Debian's PyTorch:  /usr/bin/python3 tools/gen_train_parity.py
"""
import json
import math
import os
import struct

import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
OUT = os.path.join(os.path.dirname(__file__), "..", "tests", "data", "train_parity.safetensors")


class Mlp(nn.Sequential):
    def __init__(self):
        super().__init__(nn.Flatten(), nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 10))


class Block(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = None
        if stride != 1 or cin != cout:
            self.shortcut = nn.Conv2d(cin, cout, 1, stride, 0, bias=False)
            self.bn_shortcut = nn.BatchNorm2d(cout)

    def forward(self, x):
        h = F.relu(self.bn1(self.conv1(x)))
        h = self.bn2(self.conv2(h))
        s = self.bn_shortcut(self.shortcut(x)) if self.shortcut is not None else x
        return F.relu(h + s)


class ResNet(nn.Module):
    def __init__(self, widths=(4, 8)):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, widths[0], 3, 1, 1, bias=False),
                                  nn.BatchNorm2d(widths[0]), nn.ReLU())
        blocks, prev = [], widths[0]
        for s, w in enumerate(widths):
            blocks.append(Block(prev, w, 2 if s > 0 else 1))
            prev = w
        self.blocks = nn.ModuleList(blocks)
        self.head = nn.Linear(prev, 10)

    def forward(self, x):
        h = self.stem(x)
        for b in self.blocks:
            h = b(h)
        return self.head(h.mean(dim=(2, 3)))


class Attn(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.qkv, self.proj, self.heads = nn.Linear(d, 3 * d), nn.Linear(d, d), heads

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        hd = C // self.heads
        q, k, v = (t.view(B, T, self.heads, hd).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hd)
        att = att.masked_fill(torch.tril(torch.ones(T, T, dtype=torch.bool)) == 0, float("-inf"))
        y = F.softmax(att, dim=-1) @ v
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


class GptBlock(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.ln1, self.attn, self.ln2 = nn.LayerNorm(d), Attn(d, heads), nn.LayerNorm(d)
        self.fc, self.fc_proj = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.fc_proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class Gpt(nn.Module):
    def __init__(self, vocab=32, context=8, layers=2, heads=2, d=16):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(context, d)
        self.blocks = nn.ModuleList([GptBlock(d, heads) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(d)

    def forward(self, ids):
        h = self.wte(ids) + self.wpe(torch.arange(ids.shape[1]))
        for b in self.blocks:
            h = b(h)
        return self.ln_f(h) @ self.wte.weight.T


def perturb_norms(model):
    # Non-trivial norm parameters so their gradients are tested too.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "ln" in name or "bn" in name or "stem.1" in name:
                p.add_(0.1 * torch.randn_like(p))


def case(prefix, model, x, y, language=False):
    perturb_norms(model)
    model.train()
    tensors = {}
    for n, t in model.state_dict().items():
        tensors[f"{prefix}.w.{n}"] = t.detach().clone()
    logits = model(x)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
    loss.backward()
    tensors[f"{prefix}.x"] = x
    tensors[f"{prefix}.y"] = y
    tensors[f"{prefix}.loss"] = loss.detach().reshape(1)
    for n, p in model.named_parameters():
        tensors[f"{prefix}.grad.{n}"] = p.grad.detach().clone()
    return tensors


DT = {torch.float32: "F32", torch.float64: "F64", torch.int64: "I64"}


def save(path, tensors, metadata):
    header, blobs, off = {"__metadata__": metadata}, [], 0
    for name in sorted(tensors):
        t = tensors[name].contiguous()
        b = t.numpy().tobytes()
        header[name] = {"dtype": DT[t.dtype], "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def main():
    t = {}
    t.update(case("mlp", Mlp(), torch.randn(4, 1, 8, 8), torch.randint(0, 10, (4,))))
    t.update(case("cnn", ResNet(), torch.randn(4, 1, 8, 8), torch.randint(0, 10, (4,))))
    ids = torch.randint(0, 32, (2, 9))
    t.update(case("gpt", Gpt(), ids[:, :-1].contiguous(), ids[:, 1:].contiguous(), True))
    save(OUT, t, {"generator": "tools/gen_train_parity.py", "torch": torch.__version__})
    print(f"wrote {OUT}: {len(t)} tensors, {os.path.getsize(OUT)} bytes")


if __name__ == "__main__":
    main()
