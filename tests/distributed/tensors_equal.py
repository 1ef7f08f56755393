#!/usr/bin/env python3
"""Whether two safetensors files hold the same tensors, bit for bit (names, dtypes, shapes and
bytes; the metadata is not compared). Usage: tensors_equal.py [--except SUFFIX,...] A B [LABEL]:
tensors whose names end with one of the suffixes are left out (e.g. BatchNorm's running
statistics, which DDP keeps per rank). Exit 0 when equal."""
import json
import struct
import sys


def tensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        head = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, v in head.items():
        if name == "__metadata__":
            continue
        b, e = v["data_offsets"]
        out[name] = (v["dtype"], tuple(v["shape"]), data[b:e])
    return out


args = sys.argv[1:]
skip = ()
if args and args[0] == "--except":
    skip = tuple(args[1].split(","))
    args = args[2:]
a, b = ({k: v for k, v in tensors(p).items() if not (skip and k.endswith(skip))} for p in args[:2])
label = args[2] if len(args) > 2 else f"{args[0]} vs {args[1]}"
bad = sorted(set(a) ^ set(b)) + sorted(k for k in set(a) & set(b) if a[k] != b[k])
if bad:
    print(f"FAIL: {label}: {len(bad)} tensor(s) differ or are missing, e.g. {bad[:3]}")
    sys.exit(1)
left_out = f", {len(skip)} suffix(es) left out" if skip else ""
print(f"{label}: {len(a)} tensors bitwise equal{left_out} ({sum(len(v[2]) for v in a.values())} bytes)")
