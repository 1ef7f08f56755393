#!/usr/bin/env python3
"""Checks an ONNX model Hetrain exported against onnx and onnxruntime (the venv that
tools/install_onnx_peer.sh makes):

  * onnx.checker.check_model(full_check=True) passes;
  * the graph's inputs, outputs, opset and IR version are the ones given;
  * every node's op exists at the declared opset (no node newer than it);
  * onnxruntime (CPU, graph optimizations off) on each test_data_set_K/input_0.pb beside the
    model agrees with Hetrain's own output_0.pb to rtol/atol (numpy.allclose's rule).

usage: onnx_peer_check.py MODEL.onnx --inputs ids --outputs logits --opset 17 --ir 8
       [--rtol 1e-4] [--atol 1e-5] [--min-sets 2]
"""
import argparse
import glob
import os
import sys

import numpy as np
import onnx
import onnx.numpy_helper
import onnxruntime as ort


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--inputs", required=True, help="comma-separated graph input names")
    ap.add_argument("--outputs", required=True, help="comma-separated graph output names")
    ap.add_argument("--opset", type=int, required=True)
    ap.add_argument("--ir", type=int, required=True)
    ap.add_argument("--rtol", type=float, default=1e-4)
    ap.add_argument("--atol", type=float, default=1e-5)
    ap.add_argument("--min-sets", type=int, default=2)
    ap.add_argument("--dims", default="", help="expected input dims, e.g. batch,1,28,28")
    a = ap.parse_args()

    onnx.checker.check_model(a.model, full_check=True)
    m = onnx.load(a.model)
    problems = []
    ins = [i.name for i in m.graph.input]
    outs = [o.name for o in m.graph.output]
    if ins != a.inputs.split(","):
        problems.append(f"inputs {ins}, expected {a.inputs.split(',')}")
    if outs != a.outputs.split(","):
        problems.append(f"outputs {outs}, expected {a.outputs.split(',')}")
    opsets = {o.domain: o.version for o in m.opset_import}
    if opsets.get("", opsets.get("ai.onnx")) != a.opset or len(opsets) != 1:
        problems.append(f"opset imports {opsets}, expected {{'': {a.opset}}}")
    if m.ir_version != a.ir:
        problems.append(f"IR version {m.ir_version}, expected {a.ir}")
    if a.dims:
        dims = [d.dim_param or str(d.dim_value) for d in m.graph.input[0].type.tensor_type.shape.dim]
        if dims != a.dims.split(","):
            problems.append(f"input dims {dims}, expected {a.dims.split(',')}")
    for n in m.graph.node:
        try:
            s = onnx.defs.get_schema(n.op_type, a.opset, n.domain)
        except Exception as e:  # no schema at or below the declared opset
            problems.append(f"node {n.name} ({n.op_type}) does not exist at opset {a.opset}: {e}")
            continue
        if s.since_version > a.opset:
            problems.append(f"node {n.name} ({n.op_type}-{s.since_version}) newer than opset {a.opset}")

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(a.model, so, providers=["CPUExecutionProvider"])
    sets = sorted(glob.glob(os.path.join(os.path.dirname(os.path.abspath(a.model)), "test_data_set_*")))
    if len(sets) < a.min_sets:
        problems.append(f"{len(sets)} test data sets beside the model, expected at least {a.min_sets}")
    for d in sets:
        feeds = {}
        for k, name in enumerate(ins):
            t = onnx.TensorProto()
            with open(os.path.join(d, f"input_{k}.pb"), "rb") as f:
                t.ParseFromString(f.read())
            feeds[name] = onnx.numpy_helper.to_array(t)
        got = sess.run(None, feeds)
        for k, g in enumerate(got):
            t = onnx.TensorProto()
            with open(os.path.join(d, f"output_{k}.pb"), "rb") as f:
                t.ParseFromString(f.read())
            want = onnx.numpy_helper.to_array(t)
            shape = "x".join(map(str, next(iter(feeds.values())).shape))
            if g.shape != want.shape:
                problems.append(f"{d}: output {k} shape {g.shape}, Hetrain {want.shape}")
                continue
            err = np.abs(g.astype(np.float64) - want.astype(np.float64))
            tol = a.atol + a.rtol * np.abs(want.astype(np.float64))
            bad = int((err > tol).sum())
            print(f"{os.path.basename(d)} (input {shape}): onnxruntime vs Hetrain max abs error "
                  f"{err.max():.3g}, {bad} of {err.size} outside rtol {a.rtol} atol {a.atol}")
            if bad:
                problems.append(f"{d}: output {k}: {bad} elements differ beyond tolerance")
    if problems:
        print("FAILED:\n  " + "\n  ".join(problems))
        return 1
    print(f"ok: full_check passed, opset {a.opset}, IR {a.ir}, inputs {ins}, outputs {outs}, "
          f"onnxruntime {ort.__version__} agrees on {len(sets)} test data sets")
    return 0


if __name__ == "__main__":
    sys.exit(main())
