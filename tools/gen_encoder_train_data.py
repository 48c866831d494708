#!/usr/bin/env python3
"""Writes testdata/onnx/encoder/train/: batches for fine-tuning the imported encoder
(testdata/onnx/encoder/model.onnx) with a built-in loss, `--loss mse:last_hidden_state`.

`hidden_states.npy`, `attention_mask.npy` and `target.npy` have the step as their leading
axis (`meshc run --steps N --data DIR` slices them); `expected/loss0.npy` is the first step's loss,
mean((onnxruntime's output − target)²), which the first step's printed loss must match.

Needs numpy and onnxruntime (`make onnx-testdata` makes a venv with them). Deterministic.
"""

import os

import numpy as np
import onnxruntime as ort

HERE = os.path.dirname(os.path.abspath(__file__))
MODEL = os.path.join(HERE, "..", "testdata", "onnx", "encoder", "model.onnx")
OUT = os.path.join(HERE, "..", "testdata", "onnx", "encoder", "train")
STEPS, BATCH, SEQ, HIDDEN = 8, 2, 5, 32

rng = np.random.default_rng(31)
hidden = rng.standard_normal((STEPS, BATCH, SEQ, HIDDEN)).astype(np.float32)
# Each sequence of the batch has its own length: the mask zeroes the rest.
lengths = rng.integers(2, SEQ + 1, size=(STEPS, BATCH))
mask = (np.arange(SEQ)[None, None, :] < lengths[:, :, None]).astype(np.int64)
target = (0.5 * rng.standard_normal((STEPS, BATCH, SEQ, HIDDEN))).astype(np.float32)

session = ort.InferenceSession(MODEL, providers=["CPUExecutionProvider"])
(y,) = session.run(["last_hidden_state"], {"hidden_states": hidden[0], "attention_mask": mask[0]})
loss0 = np.float32(np.mean((y.astype(np.float64) - target[0]) ** 2))

os.makedirs(OUT, exist_ok=True)
os.makedirs(os.path.join(OUT, "expected"), exist_ok=True)
for name, value in [("hidden_states", hidden), ("attention_mask", mask), ("target", target), ("expected/loss0", loss0)]:
    np.save(os.path.join(OUT, name + ".npy"), value)
