#!/usr/bin/env python3
"""Expected gradients for `meshc grad`, computed by jax.grad.

Run from the repository root, in a venv with jax and numpy (CPU jax from PyPI):

    python3 -m venv target/venv-jax && target/venv-jax/bin/pip install jax numpy
    target/venv-jax/bin/python tools/gen_grad_testdata.py

For the MLP and the transformer block of testdata/ it writes testdata/grad/NAME/:

    graph.json          testdata/NAME/graph.json plus a scalar loss: the mean squared
                        error of the graph's output against an input `target`
                        (param files point into ../../NAME/)
    inputs/*.npy        the graph's inputs (copied) and `target`
    expected/loss.npy   the loss
    expected/grad.P.npy d loss / d P for every f32 param P (jax.grad)

The graph is evaluated by a small jax interpreter of the op set (docs/ops.md), written
here independently of meshc, in float64 (jax_enable_x64) from the float32 data: the
reference is more accurate than meshc's f32 result. Deterministic: the target comes from
a fixed seed, and running the script again gives the same files.
"""

import json
import math
import os
import shutil
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_testdata as gt  # noqa: E402  (init generator, safetensors reader, npy writer)

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402

GRAPHS = ["mlp", "transformer"]


def load_params(graph, base):
    out = {}
    for p in graph["params"]:
        dt = gt.NP_DTYPE[p["dtype"]]
        if "file" in p:
            path = os.path.join(base, p["file"])
            if path.endswith(".npy"):
                arr = np.load(path)
            else:
                with open(path, "rb") as f:
                    arr = gt.read_safetensors(f.read())[p["key"]]
        elif "init" in p:
            arr = gt.init_values(p["init"], p["shape"], p["dtype"])
        else:
            arr = np.array(p["value"], dtype=dt)
        assert list(arr.shape) == p["shape"], p["name"]
        out[p["name"]] = arr.astype(dt)
    return out


def axis(a, rank):
    return a + rank if a < 0 else a


def eval_op(op, a, at):
    binary = {"add": jnp.add, "sub": jnp.subtract, "mul": jnp.multiply, "div": jnp.divide,
              "maximum": jnp.maximum, "minimum": jnp.minimum, "pow": jnp.power}
    if op in binary:
        return binary[op](a[0], a[1])
    x = a[0]
    unary = {"neg": jnp.negative, "abs": jnp.abs, "exp": jnp.exp, "log": jnp.log, "sqrt": jnp.sqrt,
             "rsqrt": jax.lax.rsqrt, "tanh": jnp.tanh, "erf": jax.scipy.special.erf,
             "sigmoid": jax.nn.sigmoid, "relu": jax.nn.relu}
    if op in unary:
        return unary[op](x)
    if op == "gelu":
        return jax.nn.gelu(x, approximate=at.get("approximate", "none") == "tanh")
    if op == "cast":
        assert at["to"] == "f32", "only float casts are differentiated here"
        return x.astype(jnp.float64)
    if op == "where":
        return jnp.where(a[0], a[1], a[2])
    if op == "matmul":
        return jnp.matmul(a[0], a[1])
    if op == "einsum":
        return jnp.einsum(at["equation"], *a)
    if op in ("reduce_sum", "reduce_mean", "reduce_max"):
        axes = at.get("axes")
        axes = tuple(range(x.ndim)) if axes is None else tuple(axis(i, x.ndim) for i in axes)
        f = {"reduce_sum": jnp.sum, "reduce_mean": jnp.mean, "reduce_max": jnp.max}[op]
        return f(x, axis=axes, keepdims=at.get("keepdims", False)) if axes else x
    if op == "softmax":
        return jax.nn.softmax(x, axis=at.get("axis", -1))
    if op == "layer_norm":
        ax = axis(at.get("axis", -1), x.ndim)
        axes = tuple(range(ax, x.ndim))
        mu = jnp.mean(x, axis=axes, keepdims=True)
        var = jnp.mean((x - mu) ** 2, axis=axes, keepdims=True)
        return (x - mu) / jnp.sqrt(var + at.get("eps", 1e-5)) * a[1] + a[2]
    if op == "reshape":
        return jnp.reshape(x, at["shape"])
    if op == "transpose":
        return jnp.transpose(x, at.get("perm"))
    if op == "broadcast_to":
        return jnp.broadcast_to(x, at["shape"])
    if op == "concat":
        return jnp.concatenate(a, axis=at["axis"])
    if op == "gather":
        ax = axis(at.get("axis", 0), x.ndim)
        n = x.shape[ax]
        return jnp.take(x, jnp.where(a[1] < 0, a[1] + n, a[1]), axis=ax)
    raise ValueError("no jax rule for op " + op)


def forward(graph, values):
    env = dict(values)
    for node in graph["nodes"]:
        env[node["name"]] = eval_op(node["op"], [env[n] for n in node["inputs"]], node.get("attrs", {}))
    return env


def with_loss(graph, out):
    """The graph with input `target` and loss = mean((out - target)^2)."""
    g = json.loads(json.dumps(graph))
    out_ty = next(n for n in g["nodes"] if n["name"] == out)
    g["inputs"].append({"name": "target", "dtype": "f32", "shape": out_ty["shape"]})
    g["nodes"] += [
        {"name": "loss.diff", "op": "sub", "inputs": [out, "target"]},
        {"name": "loss.sq", "op": "mul", "inputs": ["loss.diff", "loss.diff"]},
        {"name": "loss", "op": "reduce_mean", "inputs": ["loss.sq"]},
    ]
    g["outputs"] = ["loss"]
    for p in g["params"]:
        if "file" in p:
            p["file"] = "../../%s/%s" % (g["name"], p["file"])
    return g


def main():
    for name in GRAPHS:
        src = os.path.join(gt.TESTDATA, name)
        with open(os.path.join(src, "graph.json")) as f:
            graph = json.load(f)
        out = graph["outputs"][0]
        params = load_params(graph, src)
        inputs = {i["name"]: np.load(os.path.join(src, "inputs", i["name"] + ".npy")) for i in graph["inputs"]}
        out_shape = next(n for n in graph["nodes"] if n["name"] == out)["shape"]
        rng = np.random.default_rng(2026)
        inputs["target"] = rng.standard_normal(out_shape).astype(np.float32)
        g = with_loss(graph, out)
        wrt = [p["name"] for p in g["params"] if p["dtype"] == "f32"]
        fixed = {k: (jnp.asarray(v, jnp.float64) if v.dtype == np.float32 else jnp.asarray(v))
                 for k, v in list(inputs.items()) + [(k, v) for k, v in params.items() if k not in wrt]}

        def loss(ps):
            return forward(g, {**fixed, **ps})["loss"]

        ps = {k: jnp.asarray(params[k], jnp.float64) for k in wrt}
        value, grads = jax.value_and_grad(loss)(ps)
        dst = os.path.join(gt.TESTDATA, "grad", name)
        shutil.rmtree(dst, ignore_errors=True)
        gt.write_file(os.path.join(dst, "graph.json"), (json.dumps(g, indent=1) + "\n").encode())
        for k, v in inputs.items():
            gt.write_npy(os.path.join(dst, "inputs", k + ".npy"), v)
        gt.write_npy(os.path.join(dst, "expected", "loss.npy"), np.asarray(value, np.float32))
        for k in wrt:
            gt.write_npy(os.path.join(dst, "expected", "grad.%s.npy" % k), np.asarray(grads[k], np.float32))
        print("%-12s loss %.6f, %d gradients" % (name, float(value), len(wrt)))


if __name__ == "__main__":
    sys.exit(main())
