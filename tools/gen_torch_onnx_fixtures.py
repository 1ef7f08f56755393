#!/usr/bin/env python3
"""Writes tests/data/torch_onnx/{mlp,resnet,gpt2_block,gpt_explicit,gpt_sdpa}/: models exported by PyTorch's
torch.onnx (the TorchScript exporter, opset 17, dynamic batch axis), so the importer is tested on
files a real exporter wrote. Per model: model.onnx, input_0.npy and PyTorch's output_0.npy (eval
mode), cotangent_0.npy (a fixed random weighting of the output: loss = sum(output * cotangent))
and grads/<initializer>.npy, PyTorch's gradient of that loss for every parameter, i.e. one
fine-tuning step's gradients. tests/interop/test_onnx_torch.cpp compares Hetrain with them.

Run with the peer's PyTorch 2.x (tools/install_peer.sh); torch.onnx needs the onnx package,
taken from the ONNX peer venv (tools/install_onnx_peer.sh) when the torch venv lacks it:

    .venv-peer/bin/python tools/gen_torch_onnx_fixtures.py [--onnx-site .venv-onnx/lib/python3.11/site-packages]
"""
import argparse
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))

    def forward(self, x):
        return self.net(x)


class Block(nn.Module):
    """A ResNet basic block: two 3x3 conv-BN, a 1x1 conv-BN shortcut when the shape changes."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.short = None
        if stride != 1 or cin != cout:
            self.short = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                       nn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + (x if self.short is None else self.short(x)))


class ResNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, 1, 1, bias=False), nn.BatchNorm2d(8), nn.ReLU())
        self.layer1 = Block(8, 8, 1)
        self.layer2 = Block(8, 16, 2)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        x = self.layer2(self.layer1(self.stem(x)))
        return self.fc(torch.flatten(self.pool(x), 1))


class Gpt2Block(nn.Module):
    """GPT-2's block as Hugging Face writes it: pre-LN, fused QKV projection, causal softmax
    attention with the mask from the sequence length, tanh-GELU MLP of 4x width. With sdpa,
    the attention is F.scaled_dot_product_attention(is_causal=True) instead; `gelu` is the
    GELU's approximate= ("none": exact, erf)."""

    def __init__(self, width=32, heads=4, sdpa=False, gelu="tanh"):
        super().__init__()
        self.heads = heads
        self.sdpa = sdpa
        self.gelu = gelu
        self.ln_1 = nn.LayerNorm(width)
        self.c_attn = nn.Linear(width, 3 * width)
        self.c_proj = nn.Linear(width, width)
        self.ln_2 = nn.LayerNorm(width)
        self.c_fc = nn.Linear(width, 4 * width)
        self.mlp_proj = nn.Linear(4 * width, width)

    def attention(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        if self.sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.c_proj(y.transpose(1, 2).reshape(b, t, c))
        scores = q @ k.transpose(-2, -1) / math.sqrt(c // self.heads)
        mask = torch.tril(torch.ones(t, t, dtype=torch.bool, device=x.device))
        scores = scores.masked_fill(~mask, float("-inf"))
        y = torch.softmax(scores, dim=-1) @ v
        return self.c_proj(y.transpose(1, 2).reshape(b, t, c))

    def forward(self, x):
        x = x + self.attention(self.ln_1(x))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate=self.gelu))


class Gpt(nn.Module):
    """A GPT shaped as Hetrain's (and the planner's gpt_model): token and learned position
    embeddings, pre-LN blocks with biases, a final LayerNorm, the head tied to the token
    embedding; ids (batch, seq) to logits (batch, seq, vocab)."""

    def __init__(self, vocab=32, positions=8, width=16, heads=2, layers=2, **block):
        super().__init__()
        self.wte = nn.Embedding(vocab, width)
        self.wpe = nn.Embedding(positions, width)
        self.blocks = nn.ModuleList(Gpt2Block(width, heads, **block) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)

    def forward(self, ids):
        x = self.wte(ids) + self.wpe(torch.arange(ids.shape[1], device=ids.device))
        for b in self.blocks:
            x = b(x)
        return self.ln_f(x) @ self.wte.weight.t()


def randomise_norms(model, gen):
    # Statistics and affine parameters other than 0 and 1: the inference form is exercised, and
    # no two initializers are equal (the exporter would store one and alias the other).
    for m in model.modules():
        if isinstance(m, (nn.BatchNorm2d, nn.LayerNorm)):
            m.weight.copy_(torch.rand(m.weight.shape, generator=gen) + 0.5)
            m.bias.copy_(torch.randn(m.bias.shape, generator=gen) * 0.1)
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.copy_(torch.randn(m.num_features, generator=gen) * 0.1)
            m.running_var.copy_(torch.rand(m.num_features, generator=gen) + 0.5)


def save(out, name, model, x, axes):
    d = os.path.join(out, name)
    os.makedirs(os.path.join(d, "grads"), exist_ok=True)
    model.eval()
    path = os.path.join(d, "model.onnx")
    # No constant folding: initializers keep the parameters' own names (folding would store
    # transposed copies under generated names) and BatchNormalization stays a node.
    torch.onnx.export(model, (x,), path, dynamo=False, opset_version=17,
                      do_constant_folding=False, training=torch.onnx.TrainingMode.EVAL,
                      input_names=["input"], output_names=["output"],
                      dynamic_axes={"input": axes, "output": axes})
    y = model(x)
    gen = torch.Generator().manual_seed(7)
    cot = torch.randn(y.shape, generator=gen)
    model.zero_grad()
    (y * cot).sum().backward()
    np.save(os.path.join(d, "input_0.npy"), x.numpy())
    np.save(os.path.join(d, "output_0.npy"), y.detach().numpy())
    np.save(os.path.join(d, "cotangent_0.npy"), cot.numpy())
    import onnx  # noqa: PLC0415 (after torch.onnx found it)

    inits = {i.name for i in onnx.load(path).graph.initializer}
    missing = []
    for pname, p in model.named_parameters():
        if pname not in inits:
            missing.append(pname)
            continue
        np.save(os.path.join(d, "grads", pname + ".npy"), p.grad.numpy())
    if missing:
        sys.exit(f"{name}: parameters not stored under their names: {missing}")
    ops = sorted({n.op_type for n in onnx.load(path).graph.node})
    print(f"{name}: {path}, {len(inits)} initializers, ops {' '.join(ops)}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests",
                                                   "data", "torch_onnx"))
    ap.add_argument("--onnx-site", help="site-packages holding onnx, when this venv lacks it")
    ap.add_argument("--only", nargs="*", help="write these models only (default: all)")
    args = ap.parse_args()
    if args.onnx_site:
        sys.path.append(args.onnx_site)  # after this venv's own packages (its numpy wins)
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        resnet, block = ResNet(), Gpt2Block()
        randomise_norms(resnet, gen)
        randomise_norms(block, gen)
    want = lambda name: not args.only or name in args.only  # noqa: E731
    # In this order, each model from the same random state whichever are written.
    old = [("mlp", Mlp(), torch.randn(3, 1, 8, 8, generator=gen), {0: "batch"})]
    old.append(("resnet", resnet, torch.randn(2, 3, 12, 12, generator=gen), {0: "batch"}))
    old.append(("gpt2_block", block, torch.randn(2, 6, 32, generator=gen), {0: "batch", 1: "seq"}))
    for name, model, x, axes in old:
        if want(name):
            save(args.out, name, model, x, axes)
    # PyTorch's two attention spellings and two GELUs in GPTs that the import-time fusion rules
    # turn into Hetrain's causal attention and GELU (so plan --onnx splits them).
    torch.manual_seed(26)
    gen = torch.Generator().manual_seed(26)
    with torch.no_grad():
        explicit, sdpa = Gpt(gelu="tanh"), Gpt(sdpa=True, gelu="none")
        randomise_norms(explicit, gen)
        randomise_norms(sdpa, gen)
    for name, model in (("gpt_explicit", explicit), ("gpt_sdpa", sdpa)):
        ids = torch.randint(0, 32, (2, 6), generator=gen)
        if want(name):
            save(args.out, name, model, ids, {0: "batch", 1: "seq"})


if __name__ == "__main__":
    main()
