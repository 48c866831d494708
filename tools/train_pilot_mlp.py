#!/usr/bin/env python3
"""Trains the pilot pass's test classifier and writes testdata/pilot_mlp/.

A ReLU MLP  y = relu(x·W1 + b1)·W2 + b2  (256 inputs, 1024 hidden units, 10 classes) on a
synthetic task: a 16-dimensional latent z ~ N(0, I) labelled by a fixed random teacher
network (argmax of V·tanh(U·z)), observed as x = A·z + noise in 256 dimensions. The hidden
layer is much wider than the task needs, as in the over-parameterised networks seed 003
prunes, and it dominates the run time (the first matmul is 256x1024 per row), so the
speed-up of skipping its pruned columns and W2's matching rows shows.

Writes (float32 unless noted; about 3.6 MB in all):
  classifier.json        the graph (meshc-graph/1), batch 512
  weights/{w1,b1,w2,b2}.npy
  pilot/x.npy            512 training rows: the pilot input (--pilot-input x=...)
  heldout/x.npy          2048 rows never seen in training (4 runs of the graph)
  heldout/labels.npy     their classes (int32)
  README.md              this description and the trained model's held-out accuracy

Deterministic: numpy's PCG64 with fixed seeds. Run: python3 tools/train_pilot_mlp.py
"""

import json
import os

import numpy as np

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "testdata", "pilot_mlp")
LATENT, IN, HIDDEN, CLASSES, BATCH = 8, 256, 1024, 10, 512
TRAIN, HELDOUT = 16384, 2048
BLOCK = 16
# Strength of the group-lasso penalty, over blocks of BLOCK hidden units (the pilot's
# default block), that trains the network for pruning: most blocks end up contributing
# little, the few that carry the task stand out (as in networks trained
# with structured sparsity before deployment; without it, dropping half of the units of a
# densely trained MLP costs ~10 points of accuracy however they are chosen).
GROUP_LASSO = 8.0
# The penalty applies to this fraction of the epochs; the rest fine-tune what survived (a
# zeroed block stays exactly zero: ReLU passes it no gradient).
PENALISED = 0.6


def task(rng):
    u = rng.standard_normal((LATENT, 24)) / np.sqrt(LATENT)
    v = rng.standard_normal((24, CLASSES))
    a = rng.standard_normal((LATENT, IN)) / np.sqrt(LATENT)

    def sample(n):
        z = rng.standard_normal((n, LATENT))
        labels = np.argmax(np.tanh(z @ u) @ v, axis=1).astype(np.int32)
        x = z @ a + 0.1 * rng.standard_normal((n, IN))
        return x.astype(np.float32), labels

    return sample


def block_sq(w1, b1, w2):
    """The squared norm of each block's weights."""
    unit = (w1 * w1).sum(0) + b1 * b1 + (w2 * w2).sum(1)
    return unit.reshape(-1, BLOCK).sum(1)


def train(x, labels, rng, epochs=24, lr=2e-3, batch=256, group=GROUP_LASSO):
    w1 = (rng.standard_normal((IN, HIDDEN)) * np.sqrt(2.0 / IN)).astype(np.float32)
    b1 = np.zeros(HIDDEN, np.float32)
    w2 = (rng.standard_normal((HIDDEN, CLASSES)) * np.sqrt(1.0 / HIDDEN)).astype(np.float32)
    b2 = np.zeros(CLASSES, np.float32)
    params = [w1, b1, w2, b2]
    m = [np.zeros_like(p) for p in params]
    s = [np.zeros_like(p) for p in params]
    step = 0
    for epoch in range(epochs):
        order = rng.permutation(len(x))
        for i in range(0, len(x), batch):
            idx = order[i : i + batch]
            xb, yb = x[idx], labels[idx]
            h = xb @ w1 + b1
            a = np.maximum(h, 0)
            logits = a @ w2 + b2
            p = np.exp(logits - logits.max(axis=1, keepdims=True))
            p /= p.sum(axis=1, keepdims=True)
            p[np.arange(len(yb)), yb] -= 1
            g_logits = p / len(yb)
            g_a = g_logits @ w2.T
            g_h = g_a * (h > 0)
            grads = [xb.T @ g_h, g_h.sum(0), a.T @ g_logits, g_logits.sum(0)]
            step += 1
            rate = lr * (0.5 * (1 + np.cos(np.pi * step / (epochs * len(x) / batch))))
            for j, g in enumerate(grads):
                m[j] = 0.9 * m[j] + 0.1 * g
                s[j] = 0.999 * s[j] + 0.001 * g * g
                mh = m[j] / (1 - 0.9**step)
                sh = s[j] / (1 - 0.999**step)
                params[j] -= (rate * mh / (np.sqrt(sh) + 1e-8)).astype(np.float32)
            # Group lasso over blocks of BLOCK hidden units (the pilot's blocks), as a proximal
            # step: each block's weights (W1[:, block], b1[block], W2[block, :]) shrink by
            # rate * group in norm, and a block whose norm falls below that becomes zero.
            if epoch >= PENALISED * epochs:
                continue
            norm = np.sqrt(block_sq(w1, b1, w2))
            scale = np.repeat(np.maximum(0.0, 1.0 - rate * group / np.maximum(norm, 1e-12)), BLOCK).astype(np.float32)
            w1 *= scale
            b1 *= scale
            w2 *= scale[:, None]
    return params


def accuracy(params, x, labels):
    w1, b1, w2, b2 = params
    y = np.maximum(x @ w1 + b1, 0) @ w2 + b2
    return float((np.argmax(y, axis=1) == labels).mean())


def main():
    rng = np.random.default_rng(20261124)
    sample = task(rng)
    x, labels = sample(TRAIN)
    hx, hlabels = sample(HELDOUT)
    params = train(x, labels, rng)
    acc_train, acc_held = accuracy(params, x, labels), accuracy(params, hx, hlabels)
    w1, b1, w2, b2 = params
    norm = np.sqrt(block_sq(w1, b1, w2))
    print("block norm quantiles (10, 50, 70, 80, 90, 100%):", np.quantile(norm, [0.1, 0.5, 0.7, 0.8, 0.9, 1.0]).round(4))
    for d in ["weights", "pilot", "heldout"]:
        os.makedirs(os.path.join(OUT, d), exist_ok=True)
    for name, p in zip(["w1", "b1", "w2", "b2"], params):
        np.save(os.path.join(OUT, "weights", f"{name}.npy"), p.astype(np.float32))
    np.save(os.path.join(OUT, "pilot", "x.npy"), x[:BATCH])
    np.save(os.path.join(OUT, "heldout", "x.npy"), hx)
    np.save(os.path.join(OUT, "heldout", "labels.npy"), hlabels)
    shapes = {"w1": [IN, HIDDEN], "b1": [HIDDEN], "w2": [HIDDEN, CLASSES], "b2": [CLASSES]}
    graph = {
        "format": "meshc-graph/1",
        "name": "pilot_classifier",
        "inputs": [{"name": "x", "dtype": "f32", "shape": [BATCH, IN], "dims": ["batch", "embed"]}],
        "params": [
            {"name": n, "dtype": "f32", "shape": s, "file": f"weights/{n}.npy"} for n, s in shapes.items()
        ],
        "nodes": [
            {"name": "h", "op": "matmul", "inputs": ["x", "w1"]},
            {"name": "hb", "op": "add", "inputs": ["h", "b1"]},
            {"name": "a", "op": "relu", "inputs": ["hb"]},
            {"name": "z", "op": "matmul", "inputs": ["a", "w2"]},
            {"name": "y", "op": "add", "inputs": ["z", "b2"]},
        ],
        "outputs": ["y"],
    }
    with open(os.path.join(OUT, "classifier.json"), "w") as f:
        json.dump(graph, f, indent=2)
        f.write("\n")
    with open(os.path.join(OUT, "README.md"), "w") as f:
        f.write(
            "# pilot_mlp: the pilot pass's classifier\n\n"
            "Generated by `python3 tools/train_pilot_mlp.py` (see its docstring); do not edit.\n\n"
            f"A ReLU MLP {IN} -> {HIDDEN} -> {CLASSES} (`classifier.json`, batch {BATCH}) trained with\n"
            f"numpy (Adam, {TRAIN} synthetic rows; a group-lasso penalty {GROUP_LASSO} on blocks of {BLOCK}\n"
            f"hidden units for the first {PENALISED:.0%} of the epochs) on an 8-dimensional latent task seen\n"
            f"through {IN}"
            " noisy dimensions. `pilot/x.npy` is one batch of training rows for `--pilot-input`;\n"
            f"`heldout/x.npy` ({HELDOUT} rows, {HELDOUT // BATCH} runs of the graph) and\n"
            "`heldout/labels.npy` measure accuracy (`cargo bench --bench pilot`).\n\n"
            f"numpy accuracy of the trained model: train {100 * acc_train:.2f}%, held-out {100 * acc_held:.2f}%;\n"
            f"{int((norm < 1e-3).sum())} of {len(norm)} blocks of {BLOCK} hidden units have weights of norm below 1e-3\n"
            f"({int((norm == 0).sum())} exactly zero): the penalty all but removed them in training. The pilot pass\n"
            "must find them, and at keep fractions below the live share choose among the rest.\n"
            "It is named `classifier.json`, not `graph.json`, so the per-graph golden tests skip it.\n"
        )
    print(f"train accuracy {acc_train:.4f}, held-out accuracy {acc_held:.4f}")


if __name__ == "__main__":
    main()
