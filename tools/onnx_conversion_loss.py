#!/usr/bin/env python3
"""Conversion loss of an exported Fashion-MNIST model: test accuracy on the whole test set
through onnxruntime (CPU, graph optimizations off) against Hetrain's. Run with the venv of
tools/install_onnx_peer.sh:

  hetrain train --preset fashion-mlp --save ckpt --json > train.json
  hetrain export ckpt -o m.onnx
  .venv-onnx/bin/python tools/onnx_conversion_loss.py m.onnx --hetrain build/hetrain \
      --train-json train.json

Hetrain's side is its own test accuracy from `train --json` and, per example, the logits that
`hetrain run` computes on the same 10,000 images; the script reports both accuracies, the
number of examples whose predicted class differs and the largest logit difference.
"""
import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import onnxruntime as ort

MEAN, STD = 0.2860, 0.3530  # src/training/data/idx.cpp, as torchvision's Normalize


def read_idx(path):
    with gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--hetrain", required=True, help="the hetrain binary")
    ap.add_argument("--train-json", help="the final JSON of 'hetrain train --json'")
    a = ap.parse_args()

    images = read_idx(os.path.join(a.data, "t10k-images-idx3-ubyte.gz"))
    labels = read_idx(os.path.join(a.data, "t10k-labels-idx1-ubyte.gz")).astype(np.int64)
    # The same float32 arithmetic as Hetrain's lookup table: (p / 255 - mean) / std.
    lut = (np.arange(256, dtype=np.float32) / np.float32(255) - np.float32(MEAN)) / np.float32(STD)
    x = lut[images].reshape(-1, 1, 28, 28).astype(np.float32)

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(a.model, so, providers=["CPUExecutionProvider"])
    ort_logits = np.concatenate([sess.run(None, {"image": x[i:i + 1000]})[0]
                                 for i in range(0, len(x), 1000)])
    ort_acc = float((ort_logits.argmax(1) == labels).mean())

    with tempfile.TemporaryDirectory() as tmp:
        os.makedirs(os.path.join(tmp, "in"))
        np.save(os.path.join(tmp, "in", "input_0.npy"), x)
        subprocess.run([a.hetrain, "run", a.model, "--inputs", os.path.join(tmp, "in"),
                        "--output-dir", os.path.join(tmp, "out")], check=True,
                       stdout=subprocess.DEVNULL)
        ht_logits = np.load(os.path.join(tmp, "out", "output_0.npy"))
    ht_acc = float((ht_logits.argmax(1) == labels).mean())
    differ = int((ht_logits.argmax(1) != ort_logits.argmax(1)).sum())
    result = {
        "model": a.model,
        "examples": int(len(labels)),
        "onnxruntime_accuracy": ort_acc,
        "hetrain_run_accuracy": ht_acc,
        "predictions_that_differ": differ,
        "max_abs_logit_difference": float(np.abs(ht_logits - ort_logits).max()),
        "onnxruntime_version": ort.__version__,
    }
    if a.train_json:
        with open(a.train_json) as f:
            result["hetrain_train_test_accuracy"] = json.load(f)["test_accuracy"]
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
