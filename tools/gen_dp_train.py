#!/usr/bin/env python3
"""testdata/dp_train: one data-parallel training step of a 2-layer tanh MLP on a 4x4 torus,
with degraded devices (seed 002, issue 6).

Every device is one data-parallel replica: x and t carry two replica dims (rx, ry) split over
the two mesh axes, each replica holds B samples. The graph computes each replica's forward
pass, a hand-written backward pass of its own mean-squared-error loss, the gradient mean
over the replicas (lowered to an all_reduce mean over the whole torus) and the SGD update.

expected/ is the fault-free step (all 16 replicas; what the interpreter and a single device
compute; layouts/torus-4x4.json spreads it over the torus). expected-degraded/ is the step
under degraded/torus-4x4.json, the same layout with failed devices and a failed link: the
degraded devices do no work, so the mean is over the healthy replicas' gradients only. (It
is kept out of layouts/, whose specs must all give the single-device answer.)

The reference is computed in float64 and written as float32. Run: python3
tools/gen_dp_train.py (numpy only; deterministic).
"""
import json
import os

import numpy as np

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
OUT = os.path.join(ROOT, "testdata", "dp_train")
R, B, D, H, O = 4, 8, 16, 32, 8
LR = 0.5
# (row, column) of the failed devices, and one failed link.
DEGRADED_NODES = [[1, 2], [2, 1], [3, 3]]
DEGRADED_LINKS = [[[0, 0], [0, 1]]]


def graph():
    io = lambda n, shape, dims: {"name": n, "dtype": "f32", "shape": shape, "dims": dims}
    node = lambda n, op, ins, **attrs: dict({"name": n, "op": op, "inputs": ins}, **({"attrs": attrs} if attrs else {}))
    return {
        "format": "meshc-graph/1",
        "name": "dp_train",
        "inputs": [io("x", [R, R, B, D], ["rx", "ry", "batch", "embed"]), io("t", [R, R, B, O], ["rx", "ry", "batch", "out"])],
        "params": [
            {"name": "w1", "dtype": "f32", "shape": [D, H], "file": "weights/w1.npy"},
            {"name": "w2", "dtype": "f32", "shape": [H, O], "file": "weights/w2.npy"},
            {"name": "one", "dtype": "f32", "shape": [], "value": 1.0},
            # d(mean over a replica's B*O squared errors)/dy = 2 (y - t) / (B*O)
            {"name": "loss_scale", "dtype": "f32", "shape": [], "value": 2.0 / (B * O)},
            {"name": "lr", "dtype": "f32", "shape": [], "value": LR},
        ],
        "nodes": [
            node("h", "einsum", ["x", "w1"], equation="xybd,dh->xybh"),
            node("a", "tanh", ["h"]),
            node("y", "einsum", ["a", "w2"], equation="xybh,ho->xybo"),
            node("err", "sub", ["y", "t"]),
            node("sq", "mul", ["err", "err"]),
            node("loss", "reduce_mean", ["sq"], axes=[0, 1, 2, 3]),
            node("dy", "mul", ["err", "loss_scale"]),
            node("dw2_r", "einsum", ["a", "dy"], equation="xybh,xybo->xyho"),
            node("da", "einsum", ["dy", "w2"], equation="xybo,ho->xybh"),
            node("a2", "mul", ["a", "a"]),
            node("dtanh", "sub", ["one", "a2"]),
            node("dh", "mul", ["da", "dtanh"]),
            node("dw1_r", "einsum", ["x", "dh"], equation="xybd,xybh->xydh"),
            node("g1", "reduce_mean", ["dw1_r"], axes=[0, 1]),
            node("g2", "reduce_mean", ["dw2_r"], axes=[0, 1]),
            node("step1", "mul", ["g1", "lr"]),
            node("step2", "mul", ["g2", "lr"]),
            node("w1_new", "sub", ["w1", "step1"]),
            node("w2_new", "sub", ["w2", "step2"]),
        ],
        "outputs": ["w1_new", "w2_new", "loss"],
    }


def step(x, t, w1, w2, healthy):
    """The update from the replicas marked in `healthy` (R x R booleans), in float64."""
    x, t, w1, w2 = (a.astype(np.float64) for a in (x, t, w1, w2))
    g1s, g2s, losses = [], [], []
    for i in range(R):
        for j in range(R):
            if not healthy[i, j]:
                continue
            a = np.tanh(x[i, j] @ w1)
            err = a @ w2 - t[i, j]
            losses.append(np.mean(err * err))
            dy = err * 2.0 / (B * O)
            g2s.append(a.T @ dy)
            g1s.append(x[i, j].T @ ((dy @ w2.T) * (1 - a * a)))
    g1, g2 = np.mean(g1s, axis=0), np.mean(g2s, axis=0)
    out = {"w1_new": w1 - LR * g1, "w2_new": w2 - LR * g2, "loss": np.array(np.mean(losses))}
    return {k: v.astype(np.float32) for k, v in out.items()}


def write_npy(path, arr):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    np.save(path, np.asarray(arr, order="C"))


def main():
    rng = np.random.default_rng(2026)
    w1 = (rng.standard_normal((D, H)) / np.sqrt(D)).astype(np.float32)
    w2 = (rng.standard_normal((H, O)) / np.sqrt(H)).astype(np.float32)
    x = rng.standard_normal((R, R, B, D)).astype(np.float32)
    # Replicas see different data: a degraded replica's absence changes the update.
    x += np.arange(R * R, dtype=np.float32).reshape(R, R, 1, 1) * 0.05
    t = rng.standard_normal((R, R, B, O)).astype(np.float32)
    with open(os.path.join(OUT, "README.md"), "w") as f:
        f.write("# dp_train\n\nGenerated by `python3 tools/gen_dp_train.py`; do not edit by hand.\n\n")
        f.write(__doc__.split("\n\n", 1)[1])
    with open(os.path.join(OUT, "graph.json"), "w") as f:
        json.dump(graph(), f, indent=1)
        f.write("\n")
    write_npy(os.path.join(OUT, "weights", "w1.npy"), w1)
    write_npy(os.path.join(OUT, "weights", "w2.npy"), w2)
    write_npy(os.path.join(OUT, "inputs", "x.npy"), x)
    write_npy(os.path.join(OUT, "inputs", "t.npy"), t)
    healthy = np.ones((R, R), dtype=bool)
    for name, arr in step(x, t, w1, w2, healthy).items():
        write_npy(os.path.join(OUT, "expected", name + ".npy"), arr)
    # A failed link leaves both ends computing (degraded along one dimension only).
    for i, j in DEGRADED_NODES:
        healthy[i, j] = False
    for name, arr in step(x, t, w1, w2, healthy).items():
        write_npy(os.path.join(OUT, "expected-degraded", name + ".npy"), arr)
    layout = lambda degraded: {
        "format": "meshc-layout/1",
        "mesh": {"shape": [R, R], "axes": ["dx", "dy"], "topology": "torus"},
        "rules": {"rx": "dx", "ry": "dy"},
        **({"degraded": degraded} if degraded else {}),
    }
    for sub, deg in [("layouts", None), ("degraded", {"nodes": DEGRADED_NODES, "links": DEGRADED_LINKS})]:
        os.makedirs(os.path.join(OUT, sub), exist_ok=True)
        with open(os.path.join(OUT, sub, "torus-4x4.json"), "w") as f:
            json.dump(layout(deg), f)
            f.write("\n")


if __name__ == "__main__":
    main()
