#!/usr/bin/env python3
"""Writes tests/data/reference.safetensors with Hugging Face's own `safetensors` package
(pip install safetensors numpy), so the C++ reader is tested against the reference writer.
bf16 is absent from numpy, so tests/interop writes a BF16 file by hand instead.

    python3 tools/gen_safetensors_fixture.py
"""
import os

import numpy as np
from safetensors.numpy import save_file

out = os.path.join(os.path.dirname(__file__), "..", "tests", "data", "reference.safetensors")
tensors = {
    "f64": np.array([[1.5, -2.25, 3.0], [0.0, 1e-300, -7.0]], dtype=np.float64),
    "f32": np.arange(12, dtype=np.float32).reshape(2, 3, 2) * 0.5 - 1.0,
    "f16": np.array([0.1, -65504.0, 6.1035e-05, 1.0], dtype=np.float16),
    "i32": np.array([-2147483648, 0, 2147483647], dtype=np.int32),
    "i64": np.array([[-(2**62)], [5]], dtype=np.int64),
    "bool": np.array([True, False, True], dtype=np.bool_),
    "scalar": np.array(2.5, dtype=np.float32),
    "empty": np.zeros((0, 4), dtype=np.float32),
}
save_file(tensors, out, metadata={"format": "np", "producer": "safetensors-python"})
print("wrote", os.path.normpath(out), os.path.getsize(out), "bytes")
