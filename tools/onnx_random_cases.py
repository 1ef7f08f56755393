#!/usr/bin/env python3
"""Random-input cases for ONNX's backend node tests, with onnxruntime's outputs as reference.

For every node-test directory the file MODELS lists (ONNX's layout: NAME/model.onnx and
NAME/test_data_set_0/input_K.pb; test_interop lists those Hetrain imports), identical models
counted once, writes OUT/NAME/model.onnx and OUT/NAME/test_data_set_0/{input_K.pb,
output_K.pb}: random inputs of the model's declared shapes and element types, and what
onnxruntime (CPU, graph optimisations off, one thread) computes from them. The layout is the
node tests' own, so the same runner compares Hetrain with it (test_interop's
OnnxNodeSuite.RandomInputsAgreeWithOnnxruntime, which runs this script). Where no case can be
made, OUT/NAME/excluded.txt says why; where onnxruntime refuses the random inputs,
OUT/NAME/ort_error.txt holds its message (an error for the comparison: the inputs would be at
fault).

Inputs (numpy's PCG64, seeded per model from its name and --seed, so a case does not depend on
which other models are present):
  * floats: standard normal; positive (|x| + 0.1) where an op needs it (Log, Sqrt, the base of
    Pow, BatchNormalization's variance); integers and floats from a few small values where
    equality matters (Equal) and within range where a Cast to a narrow type follows;
  * integers: small values (-5..5, 0..9 unsigned; the divisor of Div never 0, Pow's exponent
    0..3 on a base 1..4); Gather's indices uniform in [-n, n) of the axis they index;
  * bool: fair coin;
  * values that decide shapes, axes or modes (Reshape's and Expand's shape, Slice's starts,
    ends, axes and steps, Split's sizes, Squeeze/Unsqueeze/Reduce axes, Range's operands,
    Trilu's k, Dropout's ratio and training_mode, ...) are the test's own input values: random
    ones would change the outputs' shapes or be invalid.

Models at opset 22 run in onnxruntime (which loads up to 21) with the opset lowered to 21 when
every op in them changed at 22 in its types alone (bfloat16 added to Conv, the pools, Dropout);
Hetrain reads the file as it is.

Exclusions (excluded.txt): an input that is not a tensor (sequences, optionals), an element type
numpy cannot hand to onnxruntime (bfloat16) or that Hetrain has no dtype for (strings, uint64,
complex, fp8, int4), a type onnxruntime's CPU kernels lack (uint8 Add, int8 Max, ...), a model
on whose own test data onnxruntime fails (its reference would be wrong), and models whose
outputs are random (Dropout in training mode with a non-zero ratio, RandomNormal and the like).

usage: onnx_random_cases.py OUT MODELS [--seed 26]
"""
import argparse
import hashlib
import os
import shutil
import sys
import zlib

import numpy as np
import onnx
import onnx.numpy_helper
import onnxruntime as ort

TP = onnx.TensorProto

# (op type, input index) whose values decide shapes, axes or modes: the test's values are kept.
STRUCTURAL = {
    "Reshape": {1}, "Expand": {1}, "Tile": {1}, "ConstantOfShape": {0},
    "Slice": {1, 2, 3, 4}, "Split": {1}, "Squeeze": {1}, "Unsqueeze": {1},
    "Range": {0, 1, 2}, "Trilu": {1}, "Dropout": {1, 2}, "Pad": {1, 2, 3},
    "Resize": {1, 2, 3}, "Upsample": {1}, "TopK": {1}, "OneHot": {1, 2}, "CumSum": {1},
    "Clip": {1, 2}, "Compress": {1}, "BatchNormalization": set(),
}
for _r in ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1",
           "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"):
    STRUCTURAL[_r] = {1}
# (op type, input index) that must be positive.
POSITIVE = {("Log", 0), ("Sqrt", 0), ("Pow", 0), ("BatchNormalization", 4)}
# Ops whose outputs compare values: inputs from a few values so that ties occur.
COMPARING = {"Equal", "Greater", "Less", "GreaterOrEqual", "LessOrEqual", "Max", "Min"}
# The newest opset the pinned onnxruntime (1.20.1) loads.
ORT_MAX_OPSET = 21
RANDOM_OPS = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
              "Bernoulli", "Multinomial"}
INT_TYPES = {TP.INT8, TP.INT16, TP.INT32, TP.INT64, TP.UINT8, TP.UINT16, TP.UINT32}
UNSIGNED = {TP.UINT8, TP.UINT16, TP.UINT32}
FLOAT_TYPES = {TP.FLOAT, TP.DOUBLE, TP.FLOAT16}


def consumers(graph):
    """graph input name -> [(node, input index)] over the top-level nodes."""
    out = {}
    for n in graph.node:
        for i, name in enumerate(n.input):
            if name:
                out.setdefault(name, []).append((n, i))
    return out


def attr(node, name, default):
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def cast_range(uses):
    """The value range a Cast reading this input keeps exact in every target type."""
    lo, hi = -100, 100
    for n, _ in uses:
        if n.op_type == "Cast" and attr(n, "to", TP.FLOAT) in UNSIGNED | {TP.BOOL}:
            lo = 0
    return lo, hi


def random_input(rng, vi, test_value, uses, shapes):
    """A random array for graph input vi; test_value is the test's own (kept where structural)."""
    et = vi.type.tensor_type.elem_type
    dtype = onnx.helper.tensor_dtype_to_np_dtype(et)
    dims = [d.dim_value if d.HasField("dim_value") else -1
            for d in vi.type.tensor_type.shape.dim]
    shape = tuple(dims) if vi.type.tensor_type.HasField("shape") and min(dims, default=0) >= 0 \
        else test_value.shape
    if any(i in STRUCTURAL.get(n.op_type, ()) for n, i in uses):
        return test_value
    gather = [(n, i) for n, i in uses if n.op_type == "Gather" and i == 1]
    if gather:
        n = gather[0][0]
        data_shape = shapes.get(n.input[0])
        if data_shape is None:
            return test_value
        axis = attr(n, "axis", 0)
        size = data_shape[axis]
        return rng.integers(-size, size, size=shape).astype(dtype)
    positive = any((n.op_type, i) in POSITIVE for n, i in uses)
    comparing = any(n.op_type in COMPARING for n, _ in uses)
    if et == TP.BOOL:
        return rng.random(shape) < 0.5
    if et in INT_TYPES:
        if any(n.op_type == "Pow" and i == 1 for n, i in uses):
            return rng.integers(0, 4, size=shape).astype(dtype)
        if positive:  # Pow's base: a negative one to a fractional power is NaN
            return rng.integers(1, 5, size=shape).astype(dtype)
        lo = 0 if et in UNSIGNED or positive else -5
        v = rng.integers(lo, 10 if lo == 0 else 6, size=shape).astype(dtype)
        if any(n.op_type == "Div" and i == 1 for n, i in uses):
            v[v == 0] = 1
        return v
    if any(n.op_type == "Cast" for n, _ in uses):
        lo, hi = cast_range(uses)
        return rng.uniform(lo, hi, size=shape).astype(dtype)
    if comparing:
        return rng.integers(-2, 3, size=shape).astype(dtype)
    v = rng.standard_normal(shape)
    if positive:
        v = np.abs(v) + 0.1
    return v.astype(dtype)


def exclusion(model):
    g = model.graph
    for n in g.node:
        if n.op_type in RANDOM_OPS:
            return f"{n.op_type} draws random numbers"
    inits = {i.name for i in g.initializer}
    for vi in list(g.input) + list(g.output):
        if vi.name in inits:
            continue
        if not vi.type.HasField("tensor_type"):
            return f"'{vi.name}' is not a tensor"
        et = vi.type.tensor_type.elem_type
        if et == TP.BFLOAT16:
            return f"'{vi.name}' is bfloat16, which numpy cannot hand to onnxruntime"
        if et not in INT_TYPES | FLOAT_TYPES | {TP.BOOL, TP.INT64}:
            return f"'{vi.name}' is {TP.DataType.Name(et)}, which Hetrain has no dtype for"
    return ""


def training_dropout(model, inputs):
    """Dropout in training mode with a non-zero ratio: its mask is random."""
    for n in model.graph.node:
        if n.op_type != "Dropout":
            continue
        ratio = inputs.get(n.input[1]) if len(n.input) > 1 and n.input[1] else None
        mode = inputs.get(n.input[2]) if len(n.input) > 2 and n.input[2] else None
        training = bool(mode) if mode is not None else False
        if training and (ratio is None or float(ratio) != 0.0):
            return True
    return False


def same_signature(a, b):
    """Two schemas of one op that differ in type constraints alone (the same semantics)."""
    def sig(s):
        return (sorted(s.attributes), [(f.name, f.option) for f in s.inputs],
                [(f.name, f.option) for f in s.outputs])
    return sig(a) == sig(b)


def model_for_ort(model):
    """The model as onnxruntime loads it: a default-domain opset past ORT_MAX_OPSET lowered to
    it when every node's op changed since then in types alone (opset 22 added bfloat16 to Conv,
    the pools, Dropout, ...); (None, why) when an op's semantics changed."""
    opsets = {o.domain: o for o in model.opset_import}
    default = opsets.get("", opsets.get("ai.onnx"))
    if default is None or default.version <= ORT_MAX_OPSET:
        return model, ""
    for n in model.graph.node:
        if n.domain not in ("", "ai.onnx"):
            continue
        new = onnx.defs.get_schema(n.op_type, default.version)
        old = onnx.defs.get_schema(n.op_type, ORT_MAX_OPSET)
        if new.since_version != old.since_version and not same_signature(new, old):
            return None, (f"{n.op_type}-{new.since_version} changed after opset {ORT_MAX_OPSET}, "
                          f"the newest onnxruntime 1.20.1 loads")
    lowered = onnx.ModelProto()
    lowered.CopyFrom(model)
    for o in lowered.opset_import:
        if o.domain in ("", "ai.onnx"):
            o.version = ORT_MAX_OPSET
    return lowered, ""


def agrees_with_test_data(sess, src_dir, graph_inputs, test_values):
    """onnxruntime on the test's own inputs gives the test's outputs (ONNX's runner tolerances)."""
    got = sess.run(None, {vi.name: test_values[vi.name] for vi in graph_inputs})
    for k, g in enumerate(got):
        t = onnx.TensorProto()
        with open(os.path.join(src_dir, "test_data_set_0", f"output_{k}.pb"), "rb") as f:
            t.ParseFromString(f.read())
        want = onnx.numpy_helper.to_array(t)
        g = np.asarray(g)
        if g.shape != want.shape or not np.allclose(g, want, rtol=1e-3, atol=1e-7, equal_nan=True):
            return False
    return True


def make_case(src_dir, out_dir, seed):
    model = onnx.load(os.path.join(src_dir, "model.onnx"))
    os.makedirs(out_dir)
    shutil.copy(os.path.join(src_dir, "model.onnx"), os.path.join(out_dir, "model.onnx"))
    why = exclusion(model)
    if why:
        return "excluded", why
    g = model.graph
    inits = {i.name for i in g.initializer}
    graph_inputs = [vi for vi in g.input if vi.name not in inits]
    test_values = {}
    for k, vi in enumerate(graph_inputs):
        p = os.path.join(src_dir, "test_data_set_0", f"input_{k}.pb")
        t = onnx.TensorProto()
        with open(p, "rb") as f:
            t.ParseFromString(f.read())
        test_values[vi.name] = onnx.numpy_helper.to_array(t)
    if training_dropout(model, test_values):
        return "excluded", "Dropout in training mode with a non-zero ratio draws a random mask"
    rng = np.random.default_rng([seed, zlib.crc32(os.path.basename(src_dir).encode())])
    uses = consumers(g)
    shapes = {vi.name: test_values[vi.name].shape for vi in graph_inputs}
    for i in g.initializer:
        shapes[i.name] = tuple(i.dims)
    feeds = {}
    for vi in graph_inputs:
        feeds[vi.name] = np.asarray(
            random_input(rng, vi, test_values[vi.name], uses.get(vi.name, []), shapes))
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 4
    ort_model, why = model_for_ort(model)
    if ort_model is None:
        return "excluded", why
    try:
        sess = ort.InferenceSession(ort_model.SerializeToString(), opts,
                                    providers=["CPUExecutionProvider"])
        if not agrees_with_test_data(sess, src_dir, graph_inputs, test_values):
            return "excluded", ("onnxruntime 1.20.1 disagrees with the test's own expected outputs "
                                "(on the test's inputs)")
        outs = sess.run(None, feeds)
    except Exception as e:  # noqa: BLE001 - onnxruntime raises several kinds
        if "NOT_IMPLEMENTED" in str(e):  # a type onnxruntime's CPU kernels lack
            return "excluded", "onnxruntime 1.20.1: " + str(e).split(" : ")[-1]
        with open(os.path.join(out_dir, "ort_error.txt"), "w") as f:
            f.write(str(e).splitlines()[0] if str(e) else type(e).__name__)
        return "ort_error", str(e)
    ds = os.path.join(out_dir, "test_data_set_0")
    os.makedirs(ds)
    for k, vi in enumerate(graph_inputs):
        t = onnx.numpy_helper.from_array(feeds[vi.name], vi.name)
        with open(os.path.join(ds, f"input_{k}.pb"), "wb") as f:
            f.write(t.SerializeToString())
    for k, (vi, v) in enumerate(zip(g.output, outs)):
        t = onnx.numpy_helper.from_array(np.asarray(v), vi.name)
        with open(os.path.join(ds, f"output_{k}.pb"), "wb") as f:
            f.write(t.SerializeToString())
    return "made", ""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("models", help="a file naming one node-test directory per line")
    ap.add_argument("--seed", type=int, default=26)
    a = ap.parse_args()
    with open(a.models) as f:
        dirs = [line.strip() for line in f if line.strip()]
    seen = set()
    counts = {}
    for src in dirs:
        name = os.path.basename(os.path.normpath(src))
        with open(os.path.join(src, "model.onnx"), "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
        if digest in seen:
            continue
        seen.add(digest)
        out = os.path.join(a.out, name)
        if os.path.exists(out):  # the same name, another model (another onnx version)
            out = os.path.join(a.out, f"{name}@{digest[:8]}")
        kind, why = make_case(src, out, a.seed)
        if kind == "excluded":
            with open(os.path.join(out, "excluded.txt"), "w") as f:
                f.write(why)
        counts[kind] = counts.get(kind, 0) + 1
    print(f"onnx_random_cases: {len(seen)} distinct models of {len(dirs)}: "
          + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
