#!/usr/bin/env python3
"""Reference data for the GradScaler test (tests/training/test_amp.cpp).

Drives PyTorch's own torch.amp.GradScaler("cpu") through scripted sequences of clean and
overflowing steps: a small model computes a loss, the scaler scales it, backward() runs, and on
an "inf" or "nan" step one gradient element is overwritten with that value before
scaler.step() and scaler.update(). After every step it records the scale (float32, as a hex
float so the comparison is exact), the growth tracker and whether the optimizer stepped.

The Debian PyTorch (1.13) has no CPU GradScaler (its _amp_update_scale_ is CUDA-only and the
scaler disables itself without CUDA), so this needs PyTorch >= 2.3 (torch.amp.GradScaler("cpu")),
e.g. `python3 -m pip install torch`. Writes tests/data/grad_scaler_reference.json.

    python3 tools/gen_grad_scaler_reference.py
"""
import json
import os

import torch

OUT = os.path.join(os.path.dirname(__file__), "..", "tests", "data", "grad_scaler_reference.json")

# Each case: scaler options and a script of (event, repeat) segments. Long runs of clean
# steps are recorded only at their last step (the 2000-step growth interval would otherwise
# make the file large); everything else step by step.
CASES = [
    {
        "name": "pytorch_defaults",
        "options": {"init_scale": 65536.0, "growth_factor": 2.0, "backoff_factor": 0.5,
                    "growth_interval": 2000},
        "script": [["clean", 1999], ["clean", 1], ["clean", 1], ["inf", 1], ["nan", 1],
                   ["clean", 1999], ["clean", 1], ["inf", 3], ["clean", 2000], ["clean", 5]],
    },
    {
        # Factors that are not powers of two: the products are rounded to float32 exactly as
        # PyTorch's kernel does (double product, stored as float).
        "name": "odd_factors",
        "options": {"init_scale": 1000.5, "growth_factor": 1.7, "backoff_factor": 0.3,
                    "growth_interval": 3},
        "script": [["clean", 7], ["inf", 1], ["clean", 2], ["nan", 2], ["clean", 4],
                   ["inf", 5], ["clean", 9]],
    },
    {
        # Growth that would overflow float32 leaves the scale unchanged (and resets the tracker).
        "name": "growth_overflow",
        "options": {"init_scale": 2.0 ** 126, "growth_factor": 4.0, "backoff_factor": 0.5,
                    "growth_interval": 1},
        "script": [["clean", 3], ["inf", 1], ["clean", 2]],
    },
]


def run_case(case):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", **case["options"])
    # Small inputs and loss keep every clean gradient finite even at a scale of 2**127.
    x = 0.01 * torch.randn(8, 4)
    # Counts the optimizer steps the scaler lets through.
    taken = [0]
    inner_step = opt.step

    def counting_step(*args, **kwargs):
        taken[0] += 1
        return inner_step(*args, **kwargs)

    opt.step = counting_step
    records = []
    step = 0
    for event, repeat in case["script"]:
        for i in range(repeat):
            opt.zero_grad()
            loss = model(x).square().mean() * 1e-4
            scaler.scale(loss).backward()
            if event == "inf":
                model.weight.grad[1, 2] = float("inf")
            elif event == "nan":
                model.bias.grad[0] = float("nan")
            before = taken[0]
            scaler.step(opt)
            scaler.update()
            stepped = taken[0] > before
            step += 1
            if repeat <= 50 or i == repeat - 1:
                records.append({
                    "step": step,
                    "event": event,
                    "scale": float(scaler.get_scale()).hex(),
                    "growth_tracker": int(scaler._get_growth_tracker()),
                    "stepped": stepped,
                })
    return {"name": case["name"], "options": case["options"], "script": case["script"],
            "records": records}


def main():
    doc = {
        "generator": "tools/gen_grad_scaler_reference.py",
        "torch_version": torch.__version__,
        "note": "scale after scaler.update() of each recorded step, as a hex float (float32)",
        "cases": [run_case(c) for c in CASES],
    }
    with open(OUT, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print("wrote", os.path.normpath(OUT))


if __name__ == "__main__":
    main()
