#!/usr/bin/env python3
"""Whether two safetensors files hold the same tensors, bit for bit (names, dtypes, shapes and
bytes; the metadata is not compared). Usage: tensors_equal.py A B [LABEL]. Exit 0 when equal."""
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


a, b = tensors(sys.argv[1]), tensors(sys.argv[2])
label = sys.argv[3] if len(sys.argv) > 3 else f"{sys.argv[1]} vs {sys.argv[2]}"
bad = sorted(set(a) ^ set(b)) + sorted(k for k in set(a) & set(b) if a[k] != b[k])
if bad:
    print(f"FAIL: {label}: {len(bad)} tensor(s) differ or are missing, e.g. {bad[:3]}")
    sys.exit(1)
print(f"{label}: {len(a)} tensors bitwise equal ({sum(len(v[2]) for v in a.values())} bytes)")
