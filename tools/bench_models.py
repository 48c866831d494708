#!/usr/bin/env python3
"""The anchors of `cargo bench --bench models`: the bench's models run by JAX/XLA or by
onnxruntime, timed in the same run as meshc on the same machine.

    bench_models.py encoder DIR --layers L --width D --heads H --engine xla|ort [--threads T] [--runs N]
    bench_models.py mlp --engine xla [--runs N]

`encoder`: DIR holds what the bench wrote: model.safetensors (the encoder's params, named
l{i}_wq ... as benches/common/encoder.rs names them), x.npy and mask.npy (the inputs) and
y.npy (meshc's output). The same encoder (pre-attention layer norm, attention with the
additive mask, GELU(erf) FFN, the residuals of the meshc graph) is built in JAX, or exported
to ONNX with onnx.helper (opset 20, the weights as initializers, as an exported model holds
them) and run by onnxruntime with `T` intra-op threads. Its output is compared with meshc's,
so both anchors are known to compute the same function.

`mlp`: x[512,1024]·W1[1024,4096] → relu → ·W2[4096,1024] (the mesh bench's MLP; random
weights of those shapes: the values do not change the time).

Prints one JSON line: median_ms (median of N timed runs after a warm-up), first_ms (the first
call, which for XLA includes compiling), max_abs_err against meshc (encoder only).
"""

import argparse
import json
import math
import struct
import sys
import time

import numpy as np


def read_safetensors(path):
    """Every tensor of a .safetensors file of F32 tensors, by name."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        assert t["dtype"] == "F32", f"{name}: {t['dtype']}"
        lo, hi = t["data_offsets"]
        out[name] = np.frombuffer(data[lo:hi], dtype="<f4").reshape(t["shape"])
    return out


def timed(call, runs):
    """(first call's ms, median ms of `runs` later calls, last result)."""
    t = time.perf_counter()
    y = call()
    first = (time.perf_counter() - t) * 1e3
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        y = call()
        times.append((time.perf_counter() - t) * 1e3)
    return first, float(np.median(times)), y


def encoder_jax(p, layers, heads):
    import jax
    import jax.numpy as jnp

    def layer_norm(x, g, b):
        mu = jnp.mean(x, axis=-1, keepdims=True)
        var = jnp.mean((x - mu) ** 2, axis=-1, keepdims=True)
        return (x - mu) / jnp.sqrt(var + 1e-12) * g + b

    def f(p, x, mask):
        b, s, d = x.shape
        hd = d // heads
        split = lambda t: t.reshape(b, s, heads, hd).transpose(0, 2, 1, 3)
        for i in range(layers):
            w = lambda n: p[f"l{i}_{n}"]
            h = layer_norm(x, w("ln1_g"), w("ln1_b"))
            q, k, v = (split(h @ w(f"w{n}") + w(f"b{n}")) for n in "qkv")
            scores = q @ k.transpose(0, 1, 3, 2) * (1.0 / math.sqrt(hd)) + mask
            ctx = jax.nn.softmax(scores, axis=-1) @ v
            o = ctx.transpose(0, 2, 1, 3).reshape(b, s, d) @ w("wo") + w("bo")
            h2 = layer_norm(h + o, w("ln2_g"), w("ln2_b"))
            ff = jax.nn.gelu(h2 @ w("w_ff1") + w("b_ff1"), approximate=False) @ w("w_ff2") + w("b_ff2")
            x = h2 + ff
        return x

    g = jax.jit(f)
    p = {k: jnp.asarray(v) for k, v in p.items()}
    return lambda x, mask: g(p, x, mask).block_until_ready()


def encoder_onnx(p, layers, heads, b, s, d):
    """The encoder as an ONNX model (serialised bytes)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    hd = d // heads
    nodes, inits = [], [numpy_helper.from_array(v, k) for k, v in sorted(p.items())]

    def const(name, arr):
        inits.append(numpy_helper.from_array(np.asarray(arr), name))
        return name

    split_shape = const("split_shape", np.array([b, s, heads, hd], np.int64))
    merge_shape = const("merge_shape", np.array([b, s, d], np.int64))
    scale = const("scale", np.array(1.0 / math.sqrt(hd), np.float32))

    def node(op, ins, out, **attrs):
        nodes.append(helper.make_node(op, ins, [out], **attrs))
        return out

    x = "x"
    for i in range(layers):
        w = lambda n: f"l{i}_{n}"
        t = lambda n: f"l{i}_{n}_t"
        h = node("LayerNormalization", [x, w("ln1_g"), w("ln1_b")], t("h"), axis=-1, epsilon=1e-12)
        heads_of = {}
        for n, perm in (("q", [0, 2, 1, 3]), ("k", [0, 2, 3, 1]), ("v", [0, 2, 1, 3])):
            y = node("MatMul", [h, w(f"w{n}")], t(n))
            y = node("Add", [y, w(f"b{n}")], t(n + "_b"))
            y = node("Reshape", [y, split_shape], t(n + "_r"))
            heads_of[n] = node("Transpose", [y], t(n + "_h"), perm=perm)
        sc = node("MatMul", [heads_of["q"], heads_of["k"]], t("scores"))
        sc = node("Mul", [sc, scale], t("scaled"))
        sc = node("Add", [sc, "mask"], t("masked"))
        pr = node("Softmax", [sc], t("probs"), axis=-1)
        cx = node("MatMul", [pr, heads_of["v"]], t("ctx"))
        cx = node("Transpose", [cx], t("ctx_t"), perm=[0, 2, 1, 3])
        cx = node("Reshape", [cx, merge_shape], t("ctx_r"))
        o = node("MatMul", [cx, w("wo")], t("o"))
        o = node("Add", [o, w("bo")], t("o_b"))
        r = node("Add", [h, o], t("res1"))
        h2 = node("LayerNormalization", [r, w("ln2_g"), w("ln2_b")], t("h2"), axis=-1, epsilon=1e-12)
        f = node("MatMul", [h2, w("w_ff1")], t("f1"))
        f = node("Add", [f, w("b_ff1")], t("f1_b"))
        f = node("Gelu", [f], t("f1_a"))
        f = node("MatMul", [f, w("w_ff2")], t("f2"))
        f = node("Add", [f, w("b_ff2")], t("f2_b"))
        x = node("Add", [h2, f], t("y"))
    graph = helper.make_graph(
        nodes,
        "encoder",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [b, s, d]),
            helper.make_tensor_value_info("mask", TensorProto.FLOAT, [b, 1, 1, s]),
        ],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, [b, s, d])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    onnx.checker.check_model(model)
    return model.SerializeToString()


def ort_session(model_bytes, threads):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    return ort.InferenceSession(model_bytes, so, providers=["CPUExecutionProvider"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model", choices=["encoder", "mlp"])
    ap.add_argument("dir", nargs="?")
    ap.add_argument("--engine", choices=["xla", "ort"], required=True)
    ap.add_argument("--layers", type=int)
    ap.add_argument("--width", type=int)
    ap.add_argument("--heads", type=int)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=20)
    a = ap.parse_args()
    result = {}
    if a.model == "encoder":
        p = read_safetensors(f"{a.dir}/model.safetensors")
        x, mask, want = (np.load(f"{a.dir}/{n}.npy") for n in ("x", "mask", "y"))
        b, s, d = x.shape
        if a.engine == "xla":
            call = encoder_jax(p, a.layers, a.heads)
            run = lambda: np.asarray(call(x, mask))
        else:
            sess = ort_session(encoder_onnx(p, a.layers, a.heads, b, s, d), a.threads)
            run = lambda: sess.run(None, {"x": x, "mask": mask})[0]
        first, median, y = timed(run, a.runs)
        result["max_abs_err"] = float(np.max(np.abs(y - want)))
    else:
        rng = np.random.default_rng(0)
        x = rng.standard_normal((512, 1024), np.float32)
        w1 = (rng.standard_normal((1024, 4096), np.float32) * 0.02).astype(np.float32)
        w2 = (rng.standard_normal((4096, 1024), np.float32) * 0.02).astype(np.float32)
        if a.engine != "xla":
            sys.exit("mlp: only --engine xla")
        import jax
        import jax.numpy as jnp

        f = jax.jit(lambda x, w1, w2: jnp.maximum(x @ w1, 0) @ w2)
        xs = [jnp.asarray(t) for t in (x, w1, w2)]
        first, median, _ = timed(lambda: f(*xs).block_until_ready(), a.runs)
    result.update(median_ms=median, first_ms=first)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
