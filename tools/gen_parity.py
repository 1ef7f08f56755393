#!/usr/bin/python3
"""Generates tests/data/parity.safetensors: PyTorch reference data for tests/parity.

Run with Debian's PyTorch (package python3-torch, 1.13):

    /usr/bin/python3 tools/gen_parity.py

For each case the file holds, under names "caseNNN.*":
  in0, in1, ...    the inputs, contiguous, before the case's layout views are applied
  out0, ...        the forward outputs (dtype and shape as PyTorch gives them)
  cot0, ...        a fixed random cotangent for each floating-point output
  grad0, ...       the gradient of sum(out * cot) with respect to each differentiable input
                   (in the order of the "grads" list), i.e. with respect to the stored inputs
and the metadata entry "caseNNN" -> JSON {"op", "attrs", "dtype", "layout", "n_in", "n_out",
"grads", "ref"}. "layout" gives, per input, a list of views applied before the op, so the op
sees non-contiguous inputs: ["transpose", a, b], ["permute", dims], ["slice", axis, start,
stop, step], ["expand", shape]. "ref" says how the reference was computed: "native" (PyTorch
in the case dtype) or "f32" (PyTorch lacks the CPU kernel for that dtype: computed in f32 from
the same rounded inputs, then rounded once).

Tolerances (|got - want| <= atol + rtol * |want|) live in tests/parity/test_parity.cpp:
f64 1e-10, f32 1e-5, f16 2e-3, bf16 2e-2 (atol and rtol alike); integers and bools exact.

Adding an op: one entry in OPS (the PyTorch reference), one or more add(...) lines in the
section of its family, and one entry in the registry of tests/parity/test_parity.cpp.
The file is written by hand (8-byte header length, JSON header, data) since the safetensors
package is not installed for this interpreter.
"""
import json
import os
import struct
import sys

import torch
import torch.nn.functional as F

torch.use_deterministic_algorithms(True)

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data",
                   "parity.safetensors")

DT = {"f64": torch.float64, "f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16,
      "i32": torch.int32, "i64": torch.int64, "bool": torch.bool}
ST_NAME = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16",
           torch.bfloat16: "BF16", torch.int32: "I32", torch.int64: "I64", torch.bool: "BOOL"}
FLOATS = ["f64", "f32", "f16", "bf16"]


# ---- the PyTorch reference of every op; each takes (inputs, attrs) ------------------------
def _axes(x, attrs):
    axes = attrs.get("axes", [])
    return tuple(axes) if axes else tuple(range(x.dim()))


def _slice(x, axis, start, stop, step):
    idx = [slice(None)] * x.dim()
    idx[axis] = slice(start, stop, step)
    return x[tuple(idx)]


OPS = {
    # elementwise unary
    "neg": lambda i, a: torch.neg(i[0]),
    "abs": lambda i, a: torch.abs(i[0]),
    "exp": lambda i, a: torch.exp(i[0]),
    "log": lambda i, a: torch.log(i[0]),
    "sqrt": lambda i, a: torch.sqrt(i[0]),
    "rsqrt": lambda i, a: torch.rsqrt(i[0]),
    "square": lambda i, a: torch.square(i[0]),
    "tanh": lambda i, a: torch.tanh(i[0]),
    "sigmoid": lambda i, a: torch.sigmoid(i[0]),
    "relu": lambda i, a: torch.relu(i[0]),
    "gelu": lambda i, a: F.gelu(i[0], approximate=a["approximate"]),
    "silu": lambda i, a: F.silu(i[0]),
    # elementwise binary
    "add": lambda i, a: torch.add(i[0], i[1]),
    "sub": lambda i, a: torch.sub(i[0], i[1]),
    "mul": lambda i, a: torch.mul(i[0], i[1]),
    "div": lambda i, a: torch.div(i[0], i[1]),
    "pow": lambda i, a: torch.pow(i[0], i[1]),
    "pow_scalar": lambda i, a: torch.pow(i[0], a["exponent"]),
    "maximum": lambda i, a: torch.maximum(i[0], i[1]),
    "minimum": lambda i, a: torch.minimum(i[0], i[1]),
    "equal": lambda i, a: torch.eq(i[0], i[1]),
    "not_equal": lambda i, a: torch.ne(i[0], i[1]),
    "less": lambda i, a: torch.lt(i[0], i[1]),
    "less_equal": lambda i, a: torch.le(i[0], i[1]),
    "greater": lambda i, a: torch.gt(i[0], i[1]),
    "greater_equal": lambda i, a: torch.ge(i[0], i[1]),
    "where": lambda i, a: torch.where(i[0], i[1], i[2]),
    # reductions (max/min: amax/amin, whose gradient splits ties evenly)
    "sum": lambda i, a: torch.sum(i[0], _axes(i[0], a), keepdim=a["keepdims"]),
    "mean": lambda i, a: torch.mean(i[0], _axes(i[0], a), keepdim=a["keepdims"]),
    "max": lambda i, a: torch.amax(i[0], _axes(i[0], a), keepdim=a["keepdims"]),
    "min": lambda i, a: torch.amin(i[0], _axes(i[0], a), keepdim=a["keepdims"]),
    "argmax": lambda i, a: torch.argmax(i[0], a["axis"], keepdim=a["keepdims"]),
    "var": lambda i, a: torch.var(i[0], _axes(i[0], a), correction=a["correction"],
                                  keepdim=a["keepdims"]),
    # linear algebra
    "matmul": lambda i, a: torch.matmul(i[0], i[1]),
    "linear": lambda i, a: F.linear(i[0], i[1], i[2] if len(i) > 2 else None),
    # views and copies
    "reshape": lambda i, a: torch.reshape(i[0], a["shape"]),
    "flatten": lambda i, a: torch.flatten(i[0], a["start"], a["end"]),
    "squeeze": lambda i, a: torch.squeeze(i[0], a["axis"]),
    "unsqueeze": lambda i, a: torch.unsqueeze(i[0], a["axis"]),
    "permute": lambda i, a: i[0].permute(*a["dims"]),
    "transpose": lambda i, a: torch.transpose(i[0], a["a"], a["b"]),
    "slice": lambda i, a: _slice(i[0], a["axis"], a["start"], a["stop"], a["step"]),
    "broadcast_to": lambda i, a: torch.broadcast_to(i[0], a["shape"]),
    "expand": lambda i, a: i[0].expand(*a["shape"]),
    "copy": lambda i, a: i[0].clone(),
    "cast": lambda i, a: i[0].to(DT[a["to"]]),
    # joining
    "concat": lambda i, a: torch.cat(i, a["axis"]),
    "split": lambda i, a: list(torch.split(i[0], a["sizes"], a["axis"])),
}


def apply_layout(x, views):
    for v in views or []:
        if v[0] == "transpose":
            x = x.transpose(v[1], v[2])
        elif v[0] == "permute":
            x = x.permute(*v[1])
        elif v[0] == "slice":
            x = _slice(x, *v[1:])
        elif v[0] == "expand":
            x = x.expand(*v[1])
        else:
            raise ValueError(v)
    return x


# ---- input specs ------------------------------------------------------------------------
def randn(*shape, dtype=None):
    return ("randn", list(shape), dtype)


def pos(*shape, dtype=None):  # in [0.5, 2): for log, sqrt, pow bases, divisors
    return ("pos", list(shape), dtype)


def ties(*shape, dtype=None):  # small integers as floats: ties for max/min/compare
    return ("ties", list(shape), dtype)


def ints(*shape, dtype="i64"):
    return ("ints", list(shape), dtype)


def mask(*shape):
    return ("mask", list(shape), "bool")


def make_input(spec, dt, gen):
    kind, shape, own = spec[:3]
    d = DT[own or dt]
    if kind == "randn":
        v = torch.randn(shape, generator=gen, dtype=torch.float64)
    elif kind == "pos":
        v = torch.rand(shape, generator=gen, dtype=torch.float64) * 1.5 + 0.5
    elif kind == "scaled":  # wide range: saturation, fractions of both signs
        v = torch.randn(shape, generator=gen, dtype=torch.float64) * 5
    elif kind == "ties":
        v = torch.randint(-3, 4, shape, generator=gen).to(torch.float64)
    elif kind == "ints":
        v = torch.randint(-50, 50, shape, generator=gen)
    elif kind == "posints":  # integer divisors
        v = torch.randint(1, 10, shape, generator=gen)
    elif kind == "index":
        v = torch.randint(0, spec[3], shape, generator=gen)
    elif kind == "targets":  # class ids in [0, C), the first one set to ignore_index
        v = torch.randint(0, spec[3], shape, generator=gen)
        v.view(-1)[0] = spec[4] if len(spec) > 4 else -100
    elif kind == "mask":
        v = torch.rand(shape, generator=gen) < 0.5
    return v.to(d)


# ---- the cases --------------------------------------------------------------------------
CASES = []


def add(op, inputs, dtypes=("f64", "f32", "f16", "bf16"), attrs=None, layout=None, check=None):
    for dt in dtypes:
        CASES.append(dict(op=op, inputs=inputs, dtype=dt, attrs=attrs or {}, check=check,
                          layout=(layout or []) + [None] * (len(inputs) - len(layout or [])),
                          force_f32=dt in ("f16", "bf16") and op in F32_REFERENCE))


# Ops whose PyTorch 1.13 CPU kernel in f16/bf16 is no reference: Debian's build (BLAS_INFO=generic)
# multiplies bf16 matrices without f32 accumulation. For (2, 32, 96) @ (96, 48) its max error
# against f64 is 0.73 (|y| <= 35), against 0.12 (half an ulp) for f32 rounded to bf16. These
# are computed in f32 from the rounded inputs and rounded once, like the ops with no kernel.
F32_REFERENCE = {"matmul", "linear"}


T01 = [["transpose", 0, 1]]
STEP = [["slice", 1, 0, None, 2]]  # every other column

# elementwise unary: plain, transposed, strided, scalar, 3-D permuted.
for op, spec in [("neg", randn), ("abs", randn), ("exp", randn), ("log", pos), ("sqrt", pos),
                 ("rsqrt", pos), ("square", randn), ("tanh", randn), ("sigmoid", randn),
                 ("relu", randn), ("silu", randn)]:
    add(op, [spec(4, 5)])
    add(op, [spec(5, 3)], layout=[T01])
    add(op, [spec(3, 8)], dtypes=("f32", "bf16"), layout=[STEP])
    add(op, [spec()], dtypes=("f64",))
    add(op, [spec(2, 3, 4)], dtypes=("f64",), layout=[[["permute", [2, 0, 1]]]])
add("abs", [ties(4, 5)])  # exact zeros: gradient 0 at 0
for op in ("log", "sqrt", "rsqrt"):  # zeros and negatives: inf and NaN where PyTorch has them
    add(op, [ties(3, 4)], dtypes=("f64", "f32"))
for op in ("sigmoid", "tanh", "silu", "exp"):  # saturation
    add(op, [("scaled", [3, 4], None)], dtypes=("f64", "f32", "bf16"))
add("gelu", [("scaled", [3, 4], None)], dtypes=("f64", "f32"), attrs={"approximate": "none"})
add("relu", [ties(4, 5)])
for op in ("neg", "abs", "square", "relu"):
    add(op, [ints(3, 4)], dtypes=("i32", "i64"))
for approx in ("none", "tanh"):
    add("gelu", [randn(4, 5)], attrs={"approximate": approx})
    add("gelu", [randn(5, 3)], dtypes=("f32",), attrs={"approximate": approx}, layout=[T01])

# elementwise binary: broadcasting edge cases.
BCAST = [((3, 4), (3, 4)), ((3, 4), ()), ((), (3, 4)), ((3, 1), (1, 4)), ((2, 3, 4), (4,)),
         ((2, 1, 4), (3, 1)), ((1,), (5,)), ((0, 3), (1, 3))]
for op, sa, sb in [("add", randn, randn), ("sub", randn, randn), ("mul", randn, randn),
                   ("div", randn, pos), ("pow", pos, randn), ("maximum", randn, randn),
                   ("minimum", randn, randn)]:
    for shape_a, shape_b in BCAST:
        add(op, [sa(*shape_a), sb(*shape_b)], dtypes=("f64", "f32"))
    add(op, [sa(3, 4), sb(3, 4)], dtypes=("f16", "bf16"))
    add(op, [sa(2, 3, 4), sb(3, 1)], dtypes=("f16", "bf16"))
    add(op, [sa(4, 3), sb(3, 4)], dtypes=("f32",), layout=[T01, None])  # a transposed
    add(op, [sa(3, 8), sb(4, 3)], dtypes=("f32",), layout=[STEP, T01])  # both strided
    add(op, [sa(3, 1), sb(1, 4)], dtypes=("f32",), layout=[[["expand", [3, 4]]], None])
for op in ("maximum", "minimum"):  # ties split the gradient evenly
    add(op, [ties(4, 5), ties(4, 5)], dtypes=("f64", "f32"))
for op in ("add", "sub", "mul", "maximum", "minimum"):
    add(op, [ints(3, 4), ints(4)], dtypes=("i32", "i64"))
add("div", [ints(3, 4), ("posints", [4], "i64")], dtypes=("i64",))  # true division -> f32
add("add", [randn(3, 4), ints(4, dtype="i32")], dtypes=("f32",))  # promotion f32 + i32
add("mul", [randn(3, 4), randn(4, dtype="f32")], dtypes=("bf16",))  # promotion bf16 * f32
add("add", [randn(3, 4), randn(3, 4, dtype="f32")], dtypes=("f64",))  # f64 + f32
for e in (0.5, 3.0, -1.5, 2.0):
    add("pow_scalar", [pos(3, 4)], dtypes=("f64", "f32", "bf16"), attrs={"exponent": e})
for e in (3.0, 2.0, 1.0):  # negative bases with integral exponents
    add("pow_scalar", [randn(3, 4)], dtypes=("f64", "f32"), attrs={"exponent": e})

# comparisons and where.
for op in ("equal", "not_equal", "less", "less_equal", "greater", "greater_equal"):
    add(op, [ties(3, 4), ties(3, 4)], dtypes=("f32", "bf16"))
    add(op, [ties(2, 3, 4), ties(4)], dtypes=("f64",))
    add(op, [ints(3, 4), ints(3, 1)], dtypes=("i64",))
    add(op, [ties(4, 3), ties(3, 4)], dtypes=("f32",), layout=[T01, None])
add("where", [mask(3, 4), randn(3, 4), randn(3, 4)])
add("where", [mask(3, 1), randn(1, 4), randn()], dtypes=("f64", "f32"))
add("where", [mask(4), randn(2, 3, 4), randn(3, 1)], dtypes=("f32",))
add("where", [mask(4, 3), randn(3, 4), randn(4, 3)], dtypes=("f32",), layout=[T01, None, T01])
add("where", [mask(3, 4), ints(3, 4), ints(4)], dtypes=("i64",))

# reductions over single / multiple / negative / all axes, with and without keepdims.
RED = [([1], False), ([0, 2], False), ([-1], True), ([], False), ([0, -1], True)]
for op, spec in [("sum", randn), ("mean", randn), ("max", ties), ("min", ties)]:
    for axes, keep in RED:
        add(op, [spec(3, 4, 5)], dtypes=("f64", "f32"), attrs={"axes": axes, "keepdims": keep})
    add(op, [spec(3, 4, 5)], dtypes=("f16", "bf16"), attrs={"axes": [1], "keepdims": False})
    add(op, [spec(4, 6)], dtypes=("f32",), attrs={"axes": [0], "keepdims": False}, layout=[T01])
    add(op, [spec(4, 6)], dtypes=("f32",), attrs={"axes": [-1], "keepdims": True},
        layout=[STEP])
for op in ("sum", "max", "min"):
    add(op, [ints(3, 4)], dtypes=("i32", "i64"), attrs={"axes": [1], "keepdims": False})
add("max", [randn(3, 4, 5)], dtypes=("f64",), attrs={"axes": [0, 2], "keepdims": False})
for axis, keep in [(0, False), (-1, True), (1, False)]:
    add("argmax", [randn(3, 4, 5)], dtypes=("f64", "f32", "bf16"),
        attrs={"axis": axis, "keepdims": keep})
add("argmax", [ties(4, 6)], dtypes=("f32",), attrs={"axis": 1, "keepdims": False})  # first max
add("argmax", [ties(4, 6)], dtypes=("f32",), attrs={"axis": 1, "keepdims": False}, layout=[T01])
add("argmax", [ints(3, 5)], dtypes=("i64",), attrs={"axis": 0, "keepdims": False})
for axes, corr, keep in [([1], 1, False), ([0, 2], 0, True), ([-1], 1, True), ([], 1, False)]:
    add("var", [randn(3, 4, 5)], dtypes=("f64", "f32"),
        attrs={"axes": axes, "correction": corr, "keepdims": keep})
add("var", [randn(3, 8)], dtypes=("f16", "bf16"),
    attrs={"axes": [1], "correction": 1, "keepdims": False})
add("var", [randn(6, 4)], dtypes=("f32",),
    attrs={"axes": [1], "correction": 1, "keepdims": False}, layout=[T01])

# matmul: 2-D, batched, broadcast batch, transposed operands, 1-D operands.
MM = [((3, 4), (4, 5)), ((2, 3, 4), (2, 4, 5)), ((2, 1, 3, 4), (3, 4, 5)), ((4,), (4, 5)),
      ((3, 4), (4,)), ((4,), (4,)), ((2, 3, 4), (4,)), ((5,), (2, 5, 3)), ((3, 4), (2, 4, 2))]
for sa, sb in MM:
    add("matmul", [randn(*sa), randn(*sb)], dtypes=("f64", "f32"))
add("matmul", [randn(3, 8), randn(8, 5)], dtypes=("f16", "bf16"))
add("matmul", [randn(2, 3, 8), randn(8, 5)], dtypes=("f16", "bf16"))
add("matmul", [randn(4, 3), randn(4, 5)], dtypes=("f64", "f32", "bf16"), layout=[T01, None])
add("matmul", [randn(3, 4), randn(5, 4)], dtypes=("f64", "f32", "bf16"), layout=[None, T01])
add("matmul", [randn(4, 3), randn(5, 4)], dtypes=("f64", "f32"), layout=[T01, T01])
add("matmul", [randn(2, 4, 3), randn(2, 5, 4)], dtypes=("f32",),
    layout=[[["transpose", 1, 2]], [["transpose", -1, -2]]])
add("matmul", [randn(3, 8), randn(4, 5)], dtypes=("f32",), layout=[STEP, None])
add("matmul", [randn(3, 4), randn(4, 5)], dtypes=("f32",), layout=[[["permute", [0, 1]]], None])
add("matmul", [randn(4, 2, 3), randn(3, 5)], dtypes=("f32",), layout=[[["permute", [1, 0, 2]]],
                                                                       None])
add("linear", [randn(2, 3, 4), randn(5, 4), randn(5)], dtypes=("f64", "f32", "bf16"))
add("linear", [randn(3, 4), randn(5, 4)], dtypes=("f32",))

# views and copies (the layout views add non-contiguous inputs to each).
add("reshape", [randn(3, 4)], dtypes=("f64",), attrs={"shape": [2, -1, 2]})
add("reshape", [randn(3, 4)], dtypes=("f32",), attrs={"shape": [12]}, layout=[T01])  # copies
add("reshape", [randn(2, 3, 4)], dtypes=("f32", "bf16"), attrs={"shape": [6, 4]})
add("flatten", [randn(2, 3, 4)], dtypes=("f64",), attrs={"start": 1, "end": -1})
add("squeeze", [randn(3, 1, 4)], dtypes=("f64",), attrs={"axis": 1})
add("unsqueeze", [randn(3, 4)], dtypes=("f64",), attrs={"axis": -1})
add("permute", [randn(2, 3, 4)], dtypes=("f64", "f32"), attrs={"dims": [2, 0, 1]})
add("permute", [randn(2, 3, 4)], dtypes=("f32",), attrs={"dims": [1, 2, 0]}, layout=[T01])
add("transpose", [randn(2, 3, 4)], dtypes=("f64", "i64"), attrs={"a": 0, "b": -1})
for axis, start, stop, step in [(1, 1, 4, 1), (0, 0, 5, 2), (1, -3, None, 2), (-1, 1, 100, 3),
                                (0, 2, 2, 1)]:
    add("slice", [randn(5, 6)], dtypes=("f64",),
        attrs={"axis": axis, "start": start, "stop": stop, "step": step})
add("slice", [randn(5, 6)], dtypes=("f32",), attrs={"axis": 0, "start": 1, "stop": 5, "step": 2},
    layout=[T01])
add("broadcast_to", [randn(3, 1)], dtypes=("f64", "f32"), attrs={"shape": [2, 3, 4]})
add("broadcast_to", [randn()], dtypes=("f64",), attrs={"shape": [2, 3]})
add("broadcast_to", [randn(1, 4)], dtypes=("f32",), attrs={"shape": [3, 4, 4]}, layout=[T01])
add("expand", [randn(3, 1)], dtypes=("f64", "bf16"), attrs={"shape": [2, -1, 4]})
add("copy", [randn(4, 3)], dtypes=("f32", "i32"), layout=[T01])
for frm, to in [("f32", "bf16"), ("f32", "f16"), ("f64", "f32"), ("bf16", "f32"), ("f16", "f64"),
                ("f32", "f64"), ("f32", "i32"), ("f64", "i64"), ("i64", "f32"), ("i32", "f64"),
                ("bool", "f32"), ("f32", "bool"), ("i64", "i32"), ("i32", "bool")]:
    spec = mask(3, 4) if frm == "bool" else (ints(3, 4, dtype=frm) if frm[0] == "i" else
                                             ("randn", [3, 4], None))
    if to == "bool" and frm[0] == "f":
        spec = ties(3, 4)  # exact zeros
    if frm[0] == "f" and to[0] == "i":
        spec = ("scaled", [3, 4], None)  # fractions of both signs: truncation toward zero
    add("cast", [spec], dtypes=(frm,), attrs={"to": to})
add("cast", [randn(4, 3)], dtypes=("f32",), attrs={"to": "bf16"}, layout=[T01])

# joining.
add("concat", [randn(2, 3), randn(4, 3), randn(1, 3)], dtypes=("f64", "f32", "bf16"),
    attrs={"axis": 0})
add("concat", [randn(2, 3), randn(2, 1)], dtypes=("f64",), attrs={"axis": -1})
add("concat", [randn(3, 2), randn(2, 4)], dtypes=("f32",), attrs={"axis": 1}, layout=[T01, None])
add("concat", [randn(2, 3), randn(2, 3, dtype="f64")], dtypes=("f32",), attrs={"axis": 0})
add("concat", [ints(2, 3), ints(1, 3)], dtypes=("i64",), attrs={"axis": 0})
add("split", [randn(6, 4)], dtypes=("f64", "f32", "bf16"), attrs={"sizes": [1, 3, 2], "axis": 0})
add("split", [randn(3, 5)], dtypes=("f64",), attrs={"sizes": [2, 0, 3], "axis": -1})
add("split", [randn(5, 4)], dtypes=("f32",), attrs={"sizes": [2, 2], "axis": 0}, layout=[T01])

# larger shapes: the threaded (elementwise grain 16384, reduction blocks) and blocked GEMM paths.
add("matmul", [randn(48, 80), randn(80, 40)], dtypes=("f32",))
add("matmul", [randn(2, 32, 96), randn(96, 48)], dtypes=("bf16",))
add("matmul", [randn(3, 0), randn(0, 4)], dtypes=("f64", "f32"))  # K = 0: zeros
add("add", [randn(130, 130), randn(130, 1)], dtypes=("bf16",))
add("exp", [randn(17000)], dtypes=("bf16",))
add("sum", [randn(24, 300)], dtypes=("f32",), attrs={"axes": [1], "keepdims": False})
add("sum", [randn(200, 100)], dtypes=("bf16",), attrs={"axes": [], "keepdims": False})
add("max", [randn(40, 500)], dtypes=("bf16",), attrs={"axes": [-1], "keepdims": True})


# ---- families that land with later branches: enable by adding the name to FAMILIES ---------
# (their registry entries in tests/parity/test_parity.cpp come with them).
FAMILIES = {"core", "nn", "conv"}


def rms_norm_ref(x, shape, w, eps):
    xf = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    dims = tuple(range(-len(shape), 0))
    y = xf * torch.rsqrt(torch.mean(xf * xf, dims, keepdim=True) + eps)
    y = y.to(x.dtype)
    return y * w if w is not None else y


def sdpa_ref(q, k, v, causal, scale):
    # torch 1.13 has no F.scaled_dot_product_attention: the reference composition from the
    # PyTorch 2 documentation (the causal mask is aligned top-left: query i sees keys 0..i).
    scale = scale if scale is not None else 1.0 / q.shape[-1] ** 0.5
    s = torch.matmul(q, k.transpose(-1, -2)) * scale
    if causal:
        keep = torch.ones(s.shape[-2], s.shape[-1], dtype=torch.bool).tril(diagonal=0)
        s = s.masked_fill(~keep, float("-inf"))
    return torch.matmul(torch.softmax(s, -1), v)


OPS.update({
    "softmax": lambda i, a: torch.softmax(i[0], a["axis"]),
    "log_softmax": lambda i, a: torch.log_softmax(i[0], a["axis"]),
    "layer_norm": lambda i, a: F.layer_norm(i[0], a["normalized_shape"],
                                            i[1] if len(i) > 1 else None,
                                            i[2] if len(i) > 2 else None, a["eps"]),
    "rms_norm": lambda i, a: rms_norm_ref(i[0], a["normalized_shape"],
                                          i[1] if len(i) > 1 else None, a["eps"]),
    "embedding": lambda i, a: F.embedding(i[1], i[0]),
    "index_select": lambda i, a: torch.index_select(i[0], a["axis"], i[1]),
    "gather": lambda i, a: torch.gather(i[0], a["axis"], i[1]),
    "cross_entropy": lambda i, a: F.cross_entropy(i[0], i[1], ignore_index=a["ignore_index"],
                                                  reduction=a["reduction"]),
    "conv2d": lambda i, a: F.conv2d(i[0], i[1], i[2] if len(i) > 2 else None, a["stride"],
                                    a["padding"]),
    "max_pool2d": lambda i, a: F.max_pool2d(i[0], a["kernel"], a["stride"] or None,
                                            a["padding"]),
    "avg_pool2d": lambda i, a: F.avg_pool2d(i[0], a["kernel"], a["stride"] or None,
                                            a["padding"]),
    "dropout": lambda i, a: F.dropout(i[0], a["p"], training=True),
    "sdpa": lambda i, a: sdpa_ref(i[0], i[1], i[2], a["causal"], a.get("scale")),
})


def index(*shape, hi, dtype="i64"):  # integer indices in [0, hi)
    return ("index", list(shape), dtype, hi)


if "nn" in FAMILIES:
    for axis in (-1, 0):
        for op in ("softmax", "log_softmax"):
            add(op, [randn(3, 5)], attrs={"axis": axis})
    for op in ("softmax", "log_softmax"):
        add(op, [randn(2, 3, 4)], dtypes=("f64",), attrs={"axis": 1})
        add(op, [randn(5, 3)], dtypes=("f32",), attrs={"axis": -1}, layout=[T01])
    ln = {"normalized_shape": [4], "eps": 1e-5}
    add("layer_norm", [randn(2, 3, 4), randn(4), randn(4)], attrs=ln)
    add("layer_norm", [randn(2, 3, 4)], dtypes=("f64", "f32"), attrs=ln)
    add("layer_norm", [randn(2, 3, 4), randn(3, 4), randn(3, 4)], dtypes=("f64", "f32"),
        attrs={"normalized_shape": [3, 4], "eps": 1e-5})
    add("layer_norm", [randn(4, 3), randn(4), randn(4)], dtypes=("f32",), attrs=ln, layout=[T01])
    rn = {"normalized_shape": [4], "eps": 1e-6}
    add("rms_norm", [randn(2, 3, 4), randn(4)], attrs=rn)
    add("rms_norm", [randn(2, 3, 4)], dtypes=("f64", "f32"), attrs=rn)
    add("rms_norm", [randn(4, 3), randn(4)], dtypes=("f32",), attrs=rn, layout=[T01])
    add("embedding", [randn(10, 4), index(2, 3, hi=10)])
    add("embedding", [randn(10, 4), index(5, hi=10, dtype="i32")], dtypes=("f32",))
    add("index_select", [randn(5, 4), index(6, hi=5)], dtypes=("f64", "f32", "bf16"),
        attrs={"axis": 0})
    add("index_select", [randn(5, 4), index(3, hi=4)], dtypes=("f64",), attrs={"axis": -1})
    add("gather", [randn(3, 4), index(3, 2, hi=4)], dtypes=("f64", "f32", "bf16"),
        attrs={"axis": 1})
    add("gather", [randn(3, 4), index(2, 4, hi=3)], dtypes=("f64",), attrs={"axis": 0})
    for red in ("mean", "sum", "none"):
        ce = {"ignore_index": -100, "reduction": red}
        add("cross_entropy", [randn(4, 5), ("targets", [4], "i64", 5)], dtypes=("f64", "f32"),
            attrs=ce)
        add("cross_entropy", [randn(2, 5, 3), ("targets", [2, 3], "i64", 5)],
            dtypes=("f64",), attrs=ce)
    add("cross_entropy", [randn(4, 5), ("targets", [4], "i64", 5)], dtypes=("bf16",),
        attrs={"ignore_index": -100, "reduction": "mean"})
    add("cross_entropy", [randn(4, 5), ("targets", [4], "i64", 5, 2)], dtypes=("f32",),
        attrs={"ignore_index": 2, "reduction": "mean"})
    # dropout: statistics and scaling only (tests/parity checks, not PyTorch's mask).
    for p in (0.1, 0.5):
        add("dropout", [randn(2000)], dtypes=("f32",), attrs={"p": p, "seed": 3},
            check="dropout")
    add("dropout", [randn(400)], dtypes=("bf16",), attrs={"p": 0.3, "seed": 4}, check="dropout")

if "conv" in FAMILIES:
    for stride, pad in [([1, 1], [0, 0]), ([2, 2], [1, 1]), ([1, 2], [2, 0])]:
        add("conv2d", [randn(2, 3, 6, 5), randn(4, 3, 3, 3), randn(4)], dtypes=("f64", "f32"),
            attrs={"stride": stride, "padding": pad})
    add("conv2d", [randn(1, 2, 5, 5), randn(3, 2, 1, 1)], dtypes=("f32", "bf16"),
        attrs={"stride": [1, 1], "padding": [0, 0]})
    add("conv2d", [randn(2, 3, 5, 6), randn(4, 3, 3, 3)], dtypes=("f32",),
        attrs={"stride": [1, 1], "padding": [1, 1]}, layout=[[["transpose", 2, 3]], None])
    for op in ("max_pool2d", "avg_pool2d"):
        for kernel, stride, pad in [([2, 2], [], [0, 0]), ([3, 3], [2, 2], [1, 1]),
                                    ([2, 3], [1, 2], [0, 1])]:
            add(op, [randn(2, 3, 7, 6)], dtypes=("f64", "f32"),
                attrs={"kernel": kernel, "stride": stride, "padding": pad})
        add(op, [randn(1, 2, 6, 6)], dtypes=("bf16",),
            attrs={"kernel": [2, 2], "stride": [], "padding": [0, 0]})
    for causal in (False, True):
        add("sdpa", [randn(2, 5, 4), randn(2, 5, 4), randn(2, 5, 3)], dtypes=("f64", "f32"),
            attrs={"causal": causal})
        add("sdpa", [randn(1, 2, 3, 4), randn(1, 2, 6, 4), randn(1, 2, 6, 4)],
            dtypes=("f64", "f32"), attrs={"causal": causal})
    add("sdpa", [randn(2, 4, 8), randn(2, 4, 8), randn(2, 4, 8)], dtypes=("bf16",),
        attrs={"causal": True})
    add("sdpa", [randn(2, 5, 4), randn(2, 5, 4), randn(2, 5, 3)], dtypes=("f32",),
        attrs={"causal": False, "scale": 0.3})
    add("sdpa", [randn(2, 4, 5), randn(2, 5, 4), randn(2, 5, 3)], dtypes=("f32",),
        attrs={"causal": True}, layout=[[["transpose", 1, 2]], None, None])


# ---- reference computation --------------------------------------------------------------
def run_case(case, idx):
    gen = torch.Generator().manual_seed(1000 + idx)
    torch.manual_seed(1000 + idx)  # ops that draw from the global generator (dropout)
    dt = case["dtype"]
    specs = case["inputs"]
    inputs = []
    for s in specs:
        inputs.append(make_input(s, dt, gen))
    fn = OPS[case["op"]]
    diff = [k for k, t in enumerate(inputs) if t.is_floating_point()]

    def forward(xs):
        views = [apply_layout(x, v) for x, v in zip(xs, case["layout"])]
        out = fn(views, case["attrs"])
        return out if isinstance(out, list) else [out]

    def reference(compute_dtype):
        xs = []
        for k, t in enumerate(inputs):
            x = t.to(compute_dtype) if compute_dtype is not None and t.is_floating_point() else t
            x = x.detach().clone()
            if k in diff:
                x.requires_grad_(True)
            xs.append(x)
        outs = forward(xs)
        return xs, outs

    ref = "native"
    try:
        if case["force_f32"]:
            raise RuntimeError("not implemented for: forced f32 reference")
        xs, outs = reference(None)
        native_dtypes = [o.dtype for o in outs]
        cots = [torch.randn(o.shape, generator=torch.Generator().manual_seed(7000 + idx),
                            dtype=torch.float64).to(o.dtype) if o.is_floating_point() else None
                for o in outs]
        pairs = [(o, c) for o, c in zip(outs, cots) if c is not None and o.requires_grad]
        grads = []
        if diff and pairs:
            grads = torch.autograd.grad([p[0] for p in pairs], [xs[k] for k in diff],
                                        [p[1] for p in pairs], allow_unused=True)
    except RuntimeError as e:
        if "not implemented for" not in str(e):
            raise
        # No CPU kernel in this dtype: compute in f32 from the rounded inputs, round once.
        ref = "f32"
        xs, outs = reference(torch.float32)
        native_dtypes = [DT[dt] if o.is_floating_point() else o.dtype for o in outs]
        cots = [torch.randn(o.shape, generator=torch.Generator().manual_seed(7000 + idx),
                            dtype=torch.float64).to(nd) if o.is_floating_point() else None
                for o, nd in zip(outs, native_dtypes)]
        pairs = [(o, c) for o, c in zip(outs, cots) if c is not None and o.requires_grad]
        grads = []
        if diff and pairs:
            grads = torch.autograd.grad([p[0] for p in pairs], [xs[k] for k in diff],
                                        [p[1].to(p[0].dtype) for p in pairs], allow_unused=True)
        outs = [o.to(nd) for o, nd in zip(outs, native_dtypes)]
        grads = [g.to(inputs[k].dtype) if g is not None else None for g, k in zip(grads, diff)]

    name = "case%03d" % idx
    tensors = {}
    for k, t in enumerate(inputs):
        tensors[f"{name}.in{k}"] = t
    for k, o in enumerate(outs):
        tensors[f"{name}.out{k}"] = o.detach()
        if cots[k] is not None:
            tensors[f"{name}.cot{k}"] = cots[k]
    grad_idx = []
    if grads:
        for g, k in zip(grads, diff):
            grad_idx.append(k)
            tensors[f"{name}.grad{len(grad_idx) - 1}"] = (
                g if g is not None else torch.zeros_like(inputs[k]))
    meta = {"op": case["op"], "attrs": case["attrs"], "dtype": dt, "layout": case["layout"],
            "n_in": len(inputs), "n_out": len(outs), "grads": grad_idx, "ref": ref}
    if case["check"]:
        meta["check"] = case["check"]
    return name, tensors, json.dumps(meta, separators=(",", ":"))


def save_safetensors(path, tensors, metadata):
    header, blobs, offset = {"__metadata__": metadata}, [], 0
    for name, t in tensors.items():
        t = t.detach().contiguous()
        raw = (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy().tobytes()
        header[name] = {"dtype": ST_NAME[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


def main():
    tensors, meta = {}, {}
    ops = set()
    for idx, case in enumerate(CASES):
        name, ts, m = run_case(case, idx)
        tensors.update(ts)
        meta[name] = m
        ops.add(case["op"])
    save_safetensors(OUT, tensors, meta)
    size = os.path.getsize(OUT)
    print(f"wrote {os.path.normpath(OUT)}: {len(CASES)} cases, {len(ops)} ops, {size} bytes")
    if size > 1536 * 1024:
        sys.exit("parity file exceeds 1.5 MB: use smaller shapes")


if __name__ == "__main__":
    main()
