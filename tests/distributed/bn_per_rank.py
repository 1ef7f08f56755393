#!/usr/bin/env python3
"""BatchNorm running statistics under DDP are per rank (PyTorch DDP's default): rank 0 updates
them from its own micro-batch once per step, one process with --grad-accum NP from each of its
NP micro-batches. So in the saved models every num_batches_tracked is STEPS (rank 0's) against
NP x STEPS (--grad-accum), and the running means and variances differ.
Usage: bn_per_rank.py ACCUM_MODEL DDP_MODEL NP STEPS. Exit 0 when so."""
import json
import struct
import sys


def tensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        head = json.loads(f.read(n))
        data = f.read()
    return {k: (v["dtype"], data[v["data_offsets"][0]:v["data_offsets"][1]])
            for k, v in head.items() if k != "__metadata__"}


accum, ddp = tensors(sys.argv[1]), tensors(sys.argv[2])
np_, steps = int(sys.argv[3]), int(sys.argv[4])
counts = [k for k in ddp if k.endswith("num_batches_tracked")]
if not counts:
    sys.exit("FAIL: no BatchNorm num_batches_tracked in " + sys.argv[2])
for k in counts:
    got = (struct.unpack("<q", ddp[k][1])[0], struct.unpack("<q", accum[k][1])[0])
    if got != (steps, np_ * steps):
        sys.exit(f"FAIL: {k}: rank 0 {got[0]}, --grad-accum {got[1]}; "
                 f"expected {steps} and {np_ * steps}")
stats = [k for k in ddp if k.endswith(("running_mean", "running_var"))]
same = [k for k in stats if ddp[k] == accum[k]]
if same:
    sys.exit(f"FAIL: running statistics equal to --grad-accum's (synchronised?): {same[:3]}")
print(f"BatchNorm per rank: {len(counts)} layer(s) tracked {steps} batches on rank 0 and "
      f"{np_ * steps} with --grad-accum {np_}; {len(stats)} running statistics differ")
