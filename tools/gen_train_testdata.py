#!/usr/bin/env python3
"""A small ReLU classifier and its reference training curves, for `meshc run --steps`.

Run from the repository root, in the venv of tools/gen_grad_testdata.py (jax, numpy):

    target/venv-jax/bin/python tools/gen_train_testdata.py

Writes testdata/train/:

    classifier.json         x f32[16,8] -> dense 32 + relu -> dense 4 -> softmax
                            cross-entropy against one-hot `labels` (loss, a scalar);
                            weights from seeded `init`s, biases zero
    layouts/mp-2x4.json     batch over a mesh axis of 2, the hidden layer over one of 4
    layouts/ring-8.json     batch over a ring (1-D torus) of 8 devices
    data/x.npy              f32[200,16,8]  one batch per step (leading step axis)
    data/labels.npy         f32[200,16,4]  one-hot classes of a random linear teacher
    expected/sgd.npy        f32[200] the loss of every step, trained with sgd:0.1
    expected/adamw.npy      f32[200] ... with adamw:0.01,0.9,0.999,1e-8,0.01 (computed in float64)
    expected/sgd-ring-8-degraded-3.npy
                            f32[200] sgd:0.1 on the rows of the healthy devices of ring-8
                            with device 3 degraded (rows 6 and 7 left out)

The reference trains in float64 from the float32 initial values: the loss comes from the
jax interpreter of tools/gen_grad_testdata.py, the gradient from jax.grad, and the updates
are written out below in numpy (the formulas of ir/src/optim.rs: decoupled weight decay,
bias-corrected moments). Deterministic: fixed seeds.
"""

import json
import os
import shutil
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_grad_testdata as gg  # noqa: E402  (jax op interpreter, x64 enabled)
import gen_testdata as gt  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

STEPS, B, D, H, C = 200, 16, 8, 32, 4
# Batch over one mesh axis, the hidden layer over the other: data x model parallel.
LAYOUT = """{
  "format": "meshc-layout/1",
  "mesh": {"shape": [2, 4], "axes": ["data", "model"]},
  "rules": {"batch": "data", "hidden": "model"}
}
"""
# The batch over a ring of 8 devices (2 rows each), for runs with device 3 degraded: the
# reference for those is the same training on the 14 rows of the healthy devices.
RING = """{
  "format": "meshc-layout/1",
  "mesh": {"shape": [8], "axes": ["data"], "topology": "torus"},
  "rules": {"batch": "data"}
}
"""
DEGRADED_ROWS = (6, 7)
OPTIMIZERS = {"sgd": "sgd:0.1", "adamw": "adamw:0.01,0.9,0.999,1e-8,0.01"}


def graph(batch=B):
    return {
        "format": "meshc-graph/1",
        "name": "classifier",
        "inputs": [
            {"name": "x", "dtype": "f32", "shape": [batch, D], "dims": ["batch", "feature"]},
            {"name": "labels", "dtype": "f32", "shape": [batch, C], "dims": ["batch", "class"]},
        ],
        "params": [
            {"name": "w1", "dtype": "f32", "shape": [D, H], "dims": ["feature", "hidden"],
             "init": {"normal": {"seed": 11, "std": 0.5}}},
            {"name": "b1", "dtype": "f32", "shape": [H], "dims": ["hidden"], "init": "zeros"},
            {"name": "w2", "dtype": "f32", "shape": [H, C], "dims": ["hidden", "class"],
             "init": {"normal": {"seed": 12, "std": 0.25}}},
            {"name": "b2", "dtype": "f32", "shape": [C], "dims": ["class"], "init": "zeros"},
        ],
        "nodes": [
            {"name": "h", "op": "matmul", "inputs": ["x", "w1"]},
            {"name": "hb", "op": "add", "inputs": ["h", "b1"]},
            {"name": "a", "op": "relu", "inputs": ["hb"]},
            {"name": "z", "op": "matmul", "inputs": ["a", "w2"]},
            {"name": "zb", "op": "add", "inputs": ["z", "b2"]},
            {"name": "p", "op": "softmax", "inputs": ["zb"]},
            {"name": "lp", "op": "log", "inputs": ["p"]},
            {"name": "t", "op": "mul", "inputs": ["lp", "labels"]},
            {"name": "s", "op": "reduce_sum", "inputs": ["t"], "attrs": {"axes": [1]}},
            {"name": "m", "op": "reduce_mean", "inputs": ["s"]},
            {"name": "loss", "op": "neg", "inputs": ["m"]},
        ],
        "outputs": ["loss"],
    }


def data():
    rng = np.random.default_rng(7)
    teacher = rng.standard_normal((D, C))
    x = rng.standard_normal((STEPS, B, D)).astype(np.float32)
    labels = np.eye(C, dtype=np.float32)[np.argmax(x.astype(np.float64) @ teacher, axis=-1)]
    return x, labels


def curve(g, params, x, labels, spec):
    kind, args = spec.split(":")
    hp = [float(v) for v in args.split(",")]
    names = [p["name"] for p in g["params"]]
    ps = {k: jnp.asarray(params[k], jnp.float64) for k in names}

    def loss(ps, xb, lb):
        return gg.forward(g, {**ps, "x": xb, "labels": lb})["loss"]

    step = jax.jit(jax.value_and_grad(loss))
    m = {k: np.zeros_like(params[k], np.float64) for k in names}
    v = {k: np.zeros_like(params[k], np.float64) for k in names}
    losses = []
    for t in range(1, STEPS + 1):
        value, grads = step(ps, jnp.asarray(x[t - 1], jnp.float64), jnp.asarray(labels[t - 1], jnp.float64))
        losses.append(float(value))
        new = {}
        for k in names:
            p, gk = np.asarray(ps[k]), np.asarray(grads[k])
            if kind == "sgd":
                new[k] = p - hp[0] * gk
            else:
                lr, b1, b2, eps, wd = hp
                m[k] = b1 * m[k] + (1 - b1) * gk
                v[k] = b2 * v[k] + (1 - b2) * gk * gk
                mhat, vhat = m[k] / (1 - b1 ** t), v[k] / (1 - b2 ** t)
                new[k] = p - lr * (mhat / (np.sqrt(vhat) + eps) + wd * p)
        ps = {k: jnp.asarray(a) for k, a in new.items()}
    return np.array(losses, np.float64)


def main():
    g = graph()
    params = {p["name"]: gt.init_values(p["init"], p["shape"], "f32") for p in g["params"]}
    x, labels = data()
    dst = os.path.join(gt.TESTDATA, "train")
    shutil.rmtree(dst, ignore_errors=True)
    gt.write_file(os.path.join(dst, "classifier.json"), (json.dumps(g, indent=1) + "\n").encode())
    gt.write_file(os.path.join(dst, "layouts", "mp-2x4.json"), LAYOUT.encode())
    gt.write_file(os.path.join(dst, "layouts", "ring-8.json"), RING.encode())
    gt.write_npy(os.path.join(dst, "data", "x.npy"), x)
    gt.write_npy(os.path.join(dst, "data", "labels.npy"), labels)
    for name, spec in OPTIMIZERS.items():
        c = curve(g, params, x, labels, spec)
        gt.write_npy(os.path.join(dst, "expected", name + ".npy"), c.astype(np.float32))
        print("%-6s %-32s loss %.6f -> %.6f" % (name, spec, c[0], c[-1]))
    keep = [i for i in range(B) if i not in DEGRADED_ROWS]
    c = curve(graph(len(keep)), params, x[:, keep], labels[:, keep], OPTIMIZERS["sgd"])
    gt.write_npy(os.path.join(dst, "expected", "sgd-ring-8-degraded-3.npy"), c.astype(np.float32))
    print("sgd on the 14 rows of a ring of 8 with device 3 degraded: loss %.6f -> %.6f" % (c[0], c[-1]))


if __name__ == "__main__":
    sys.exit(main())
