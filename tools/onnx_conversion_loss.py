#!/usr/bin/env python3
"""Conversion loss of an exported model: its accuracy and loss through onnxruntime (CPU, graph
optimizations off) on the evaluation set `hetrain train` used, against Hetrain's own figures
from that run's `--json` output. Run with the venv of tools/install_onnx_peer.sh:

  hetrain train --preset fashion-mlp --save ckpt --json > train.json
  hetrain export ckpt -o m.onnx --eval-data evaldata
  .venv-onnx/bin/python tools/onnx_conversion_loss.py m.onnx evaldata train.json

For classifiers: test accuracy and mean cross-entropy over the 10,000 test images; for the
GPT: mean cross-entropy per byte over the validation windows (`--eval-batches` of them).
"""
import glob
import json
import os
import sys

import numpy as np
import onnxruntime as ort


def cross_entropy_sum(logits, targets):
    """Summed cross-entropy in float64 of logits (..., C) against integer targets (...)."""
    z = logits.astype(np.float64).reshape(-1, logits.shape[-1])
    t = targets.reshape(-1)
    m = z.max(axis=1, keepdims=True)
    lse = (m[:, 0] + np.log(np.exp(z - m).sum(axis=1)))
    return float((lse - z[np.arange(len(t)), t]).sum()), len(t)


def main():
    if len(sys.argv) != 4:
        print(__doc__)
        return 2
    model, data_dir, train_json = sys.argv[1:]
    with open(train_json) as f:
        hetrain = json.load(f)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    name = sess.get_inputs()[0].name
    batches = sorted(glob.glob(os.path.join(data_dir, "batch_*")),
                     key=lambda p: int(p.rsplit("_", 1)[1]))
    if not batches:
        print(f"no batch_K directories in {data_dir}")
        return 1
    loss_sum, count, correct = 0.0, 0, 0
    for d in batches:
        x = np.load(os.path.join(d, "input_0.npy"))
        t = np.load(os.path.join(d, "targets_0.npy"))
        logits = sess.run(None, {name: x})[0]
        s, n = cross_entropy_sum(logits, t)
        loss_sum += s
        count += n
        if logits.ndim == 2:
            correct += int((logits.argmax(1) == t).sum())
    result = {"model": model, "examples": count, "batches": len(batches),
              "onnxruntime": ort.__version__}
    loss = loss_sum / count
    if "test_accuracy" in hetrain:
        result.update({
            "onnxruntime_test_accuracy": correct / count,
            "hetrain_test_accuracy": hetrain["test_accuracy"],
            "onnxruntime_test_loss": loss,
            "hetrain_test_loss": hetrain["test_loss"],
            "relative_loss_difference": abs(loss - hetrain["test_loss"]) / hetrain["test_loss"],
        })
    else:
        result.update({
            "onnxruntime_val_loss": loss,
            "hetrain_val_loss": hetrain["val_loss"],
            "relative_loss_difference": abs(loss - hetrain["val_loss"]) / hetrain["val_loss"],
        })
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
