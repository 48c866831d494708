#!/usr/bin/env python3
"""Generate meshc's test graphs with their weights, inputs and expected outputs.

Run from the repository root:  python3 tools/gen_testdata.py   (needs only numpy)

For every graph NAME it (re)writes, and only these (testdata/bad/ is not touched):

    testdata/NAME/graph.json            the graph, format meshc-graph/1
    testdata/NAME/weights/*.npy         params stored as .npy; some as .safetensors
    testdata/NAME/weights/*.safetensors (written by hand: 8-byte LE header length, JSON, data)
    testdata/NAME/inputs/<input>.npy    one file per graph input
    testdata/NAME/expected/<out>.npy    one file per graph output

plus testdata/README.md, which lists the graphs and the comparison tolerance.

Graphs: mlp, gelu_mlp, transformer, reductions, all_ops, cnn (see README_TEXT below).

How the expected outputs are computed
-------------------------------------
All data (inputs, weights, seeded `init` params, inline `value` params) is first made
float32 (or i32/i64/bool), exactly the values meshc will load. The graph is then evaluated
by a small numpy interpreter (`evaluate`, semantics of docs/ops.md) in float64: every f32
tensor is held as float64, so the reference is more accurate than any f32 computation.
Each output is finally cast to its dtype (float32 for f32 outputs) and saved.

Independent checks (asserts): every graph is also computed a second way, written out by
hand with plain numpy (attention via einsum, variance via np.var, gather via loops, ...),
and must match the interpreter to ~1e-12. The init generator is checked against a
scalar pure-Python implementation. Finally the graph is evaluated a third time with f32
arithmetic (what an f32 interpreter does), which must be within the stated tolerance
|got - want| <= 1e-5 + 1e-4*|want| of the expected outputs (ints and bools: exact) --
so the tolerance is known to be achievable.

Determinism: fixed seeds (numpy default_rng / PCG64), sorted JSON keys in safetensors
headers, no timestamps: running the script twice produces byte-identical files.
"""

import json
import math
import os
import shutil
import sys

import numpy as np

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
TESTDATA = os.path.normpath(os.path.join(ROOT, "testdata"))

ATOL = 1e-5
RTOL = 1e-4

NP_DTYPE = {"f32": np.float32, "i32": np.int32, "i64": np.int64, "bool": np.bool_}
ST_DTYPE = {"f32": "F32", "i32": "I32", "i64": "I64", "bool": "BOOL"}


def c_order(arr):
    """A C-ordered copy; unlike np.ascontiguousarray it keeps 0-d arrays 0-d."""
    return np.array(arr, order="C")


def dtype_name(arr):
    """meshc dtype of an evaluator value (float arrays stand for f32)."""
    if arr.dtype.kind == "f":
        return "f32"
    return {np.dtype(np.int32): "i32", np.dtype(np.int64): "i64", np.dtype(np.bool_): "bool"}[arr.dtype]


# --------------------------------------------------------------------------------------
# The seeded init generator (docs/format.md, ir/src/init.rs), vectorised with uint64.
# --------------------------------------------------------------------------------------

GOLDEN = np.uint64(0x9E3779B97F4A7C15)
M1 = np.uint64(0xBF58476D1CE4E5B9)
M2 = np.uint64(0x94D049BB133111EB)


def _mix(z):
    z = (z ^ (z >> np.uint64(30))) * M1
    z = (z ^ (z >> np.uint64(27))) * M2
    return z ^ (z >> np.uint64(31))


def uniform01(seed, k):
    """k: uint64 array of draw indices. Returns float64 in (0, 1)."""
    with np.errstate(over="ignore"):
        s = _mix(np.uint64(seed))
        r = _mix(s + (k + np.uint64(1)) * GOLDEN)
    return ((r >> np.uint64(11)).astype(np.float64) + 0.5) / float(1 << 53)


def init_values(init, shape, dtype):
    n = int(np.prod(shape, dtype=np.int64))
    k = np.arange(n, dtype=np.uint64)
    if init == "zeros":
        v = np.zeros(n)
    elif init == "ones":
        v = np.ones(n)
    elif "uniform" in init:
        u = init["uniform"]
        v = u["low"] + (u["high"] - u["low"]) * uniform01(u["seed"], k)
    elif "normal" in init:
        p = init["normal"]
        u1 = uniform01(p["seed"], np.uint64(2) * k)
        u2 = uniform01(p["seed"], np.uint64(2) * k + np.uint64(1))
        # math.log / math.cos are the platform libm, as Rust's f64::ln / cos.
        ln = np.array([math.log(a) for a in u1], dtype=np.float64)
        cs = np.array([math.cos(2.0 * math.pi * b) for b in u2], dtype=np.float64)
        v = p.get("mean", 0.0) + p["std"] * np.sqrt(-2.0 * ln) * cs
    else:
        raise ValueError(init)
    return v.astype(NP_DTYPE[dtype]).reshape(shape)


def _check_init_generator():
    """Compare the vectorised generator with a scalar pure-Python one."""
    mask = (1 << 64) - 1

    def mix(z):
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
        return z ^ (z >> 31)

    def u01(seed, k):
        r = mix((mix(seed) + (k + 1) * 0x9E3779B97F4A7C15) & mask)
        return ((r >> 11) + 0.5) / 2.0**53

    for seed in (0, 1, 7, 12345, 2**64 - 1):
        ks = np.arange(300, dtype=np.uint64)
        assert np.array_equal(uniform01(seed, ks), [u01(seed, int(k)) for k in ks])
    got = init_values({"normal": {"seed": 3, "std": 2.0, "mean": 0.5}}, [5, 7], "f32")
    want = [0.5 + 2.0 * math.sqrt(-2 * math.log(u01(3, 2 * k))) * math.cos(2 * math.pi * u01(3, 2 * k + 1))
            for k in range(35)]
    assert np.array_equal(got.ravel(), np.array(want).astype(np.float32))
    got = init_values({"uniform": {"seed": 9, "low": -1.0, "high": 3.0}}, [4], "f32")
    assert np.array_equal(got, np.array([-1 + 4 * u01(9, k) for k in range(4)]).astype(np.float32))


# --------------------------------------------------------------------------------------
# Reference interpreter (docs/ops.md). `F` is the float type used for f32 tensors:
# float64 for the expected outputs, float32 for the achievability check.
# --------------------------------------------------------------------------------------

_erf = np.vectorize(math.erf, otypes=[np.float64])


def _axis(a, rank):
    assert -rank <= a < rank, (a, rank)
    return a + rank if a < 0 else a


def evaluate(graph, params, inputs, F):
    env = {}

    def load(arr):
        return arr.astype(F) if arr.dtype == np.float32 else arr.copy()

    for p in graph["params"]:
        env[p["name"]] = load(params[p["name"]])
    for i in graph["inputs"]:
        env[i["name"]] = load(inputs[i["name"]])
    for node in graph["nodes"]:
        args = [env[n] for n in node["inputs"]]
        out = eval_op(node["op"], args, node.get("attrs", {}), F)
        if out.dtype.kind == "f":
            out = out.astype(F)
        if "shape" in node:
            assert list(out.shape) == node["shape"], (node["name"], out.shape)
        if "dtype" in node:
            assert dtype_name(out) == node["dtype"], node["name"]
        env[node["name"]] = out
    return {o: env[o] for o in graph["outputs"]}


def eval_op(op, a, at, F):
    binary = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide,
              "maximum": np.maximum, "minimum": np.minimum, "pow": np.power}
    if op in binary:
        assert a[0].dtype == a[1].dtype, op
        if op in ("div", "pow"):
            assert a[0].dtype.kind == "f"
        return binary[op](a[0], a[1])
    x = a[0] if a else None
    if op in ("exp", "log", "sqrt", "rsqrt", "tanh", "erf", "sigmoid", "gelu"):
        assert x.dtype.kind == "f", op
    if op == "neg":
        return -x
    if op == "abs":
        return np.abs(x)
    if op == "relu":
        return np.maximum(x, x.dtype.type(0))
    if op == "exp":
        return np.exp(x)
    if op == "log":
        return np.log(x)
    if op == "sqrt":
        return np.sqrt(x)
    if op == "rsqrt":
        return F(1) / np.sqrt(x)
    if op == "tanh":
        return np.tanh(x)
    if op == "erf":
        return _erf(x).astype(F)
    if op == "sigmoid":
        return F(1) / (F(1) + np.exp(-x))
    if op == "gelu":
        if at.get("approximate", "none") == "none":
            return x * F(0.5) * (F(1) + _erf(x / F(math.sqrt(2.0))).astype(F))
        c = F(math.sqrt(2.0 / math.pi))
        return x * F(0.5) * (F(1) + np.tanh(c * (x + F(0.044715) * x * x * x)))
    if op == "cast":
        to = at["to"]
        if to == "f32":
            return x.astype(F)
        if to == "bool":
            return x != 0
        if x.dtype.kind == "f":
            return np.trunc(x).astype(NP_DTYPE[to])
        return x.astype(NP_DTYPE[to])
    if op == "where":
        assert a[0].dtype == np.bool_ and a[1].dtype == a[2].dtype
        return np.where(a[0], a[1], a[2])
    if op == "matmul":
        assert all(t.dtype.kind == "f" and t.ndim >= 1 for t in a)
        return np.matmul(a[0], a[1])
    if op == "einsum":
        eq = at["equation"]
        assert "->" in eq and "." not in eq
        return np.einsum(eq, *a)
    if op in ("reduce_sum", "reduce_mean", "reduce_max"):
        axes = at.get("axes")
        axes = tuple(range(x.ndim)) if axes is None else tuple(_axis(i, x.ndim) for i in axes)
        assert len(set(axes)) == len(axes)
        kd = at.get("keepdims", False)
        if op == "reduce_sum":
            return np.sum(x, axis=axes, keepdims=kd).astype(x.dtype)
        if op == "reduce_mean":
            assert x.dtype.kind == "f"
            return np.mean(x, axis=axes, keepdims=kd).astype(x.dtype)
        return np.max(x, axis=axes, keepdims=kd) if axes else x.copy()
    if op == "softmax":
        ax = at.get("axis", -1)
        e = np.exp(x - np.max(x, axis=ax, keepdims=True))
        return e / np.sum(e, axis=ax, keepdims=True)
    if op == "layer_norm":
        g, b = a[1], a[2]
        ax = _axis(at.get("axis", -1), x.ndim)
        eps = F(at.get("eps", 1e-5))
        assert g.shape == x.shape[ax:] and b.shape == x.shape[ax:]
        axes = tuple(range(ax, x.ndim))
        mu = np.mean(x, axis=axes, keepdims=True)
        var = np.mean((x - mu) ** 2, axis=axes, keepdims=True)
        return (x - mu) / np.sqrt(var + eps) * g + b
    if op == "reshape":
        return np.reshape(x, at["shape"]).copy()
    if op == "transpose":
        return np.transpose(x, at.get("perm")).copy()
    if op == "broadcast_to":
        return np.broadcast_to(x, at["shape"]).copy()
    if op == "concat":
        assert len({t.dtype for t in a}) == 1 and len({t.ndim for t in a}) == 1
        return np.concatenate(a, axis=at["axis"])
    if op == "slice":
        st, en = at["starts"], at["ends"]
        axes = at.get("axes", list(range(len(st))))
        steps = at.get("steps", [1] * len(st))
        assert len(st) == len(en) == len(axes) == len(steps) and 0 not in steps
        idx = [slice(None)] * x.ndim
        for s, e, ax, k in zip(st, en, axes, steps):
            idx[_axis(ax, x.ndim)] = slice(s, e, k)
        return x[tuple(idx)].copy()
    if op == "gather":
        data, ind = a
        assert ind.dtype in (np.int32, np.int64)
        ax = _axis(at.get("axis", 0), data.ndim)
        n = data.shape[ax]
        assert np.all((ind >= -n) & (ind < n)), "index out of range"
        return np.take(data, np.where(ind < 0, ind + n, ind), axis=ax)
    return eval_op_v2(op, a, at, F)


def _py_mod(x, y, fmod):
    """ONNX/numpy integer mod on Python ints: sign of the divisor, or of the dividend (fmod)."""
    if y == 0:
        return 0
    r = x % y
    if fmod and r != 0 and (r < 0) != (x < 0):
        r -= y
    return r


def _window_attrs(at, kernel):
    sp = len(kernel)
    pads = at.get("pads", [0] * 2 * sp)
    return (list(kernel), at.get("strides", [1] * sp), at.get("dilations", [1] * sp),
            pads[:sp], pads[sp:], at.get("ceil_mode", False))


def _window_out(n, win):
    k, st, dl, b, e, ceil = win
    out = []
    for d in range(len(n)):
        span = (k[d] - 1) * dl[d] + 1
        padded = n[d] + b[d] + e[d]
        assert padded >= span
        m = (padded - span) // st[d] + 1
        if ceil and (padded - span) % st[d]:
            m += 1
            if (m - 1) * st[d] >= n[d] + b[d]:
                m -= 1
        out.append(m)
    return out


def _window_taps(n, win, o):
    """(tap, kind, input index) of every kernel tap of output position o; kind is
    'real', 'pad' (inside the pads) or 'out' (past the end pad: counts for nothing)."""
    k, st, dl, b, e, _ = win
    for tap in np.ndindex(*k):
        kind, idx = "real", []
        for d in range(len(n)):
            i = o[d] * st[d] + tap[d] * dl[d] - b[d]
            if 0 <= i < n[d]:
                idx.append(i)
            elif i < n[d] + e[d]:
                kind = "out" if kind == "out" else "pad"
            else:
                kind = "out"
        yield tap, kind, tuple(idx)


def eval_op_v2(op, a, at, F):
    """Op set v2: comparisons, logic, mod, rounding, scatter_elements, windows and pad."""
    x = a[0] if a else None
    cmp = {"equal": np.equal, "less": np.less, "less_equal": np.less_equal,
           "greater": np.greater, "greater_equal": np.greater_equal}
    if op in cmp:
        assert a[0].dtype == a[1].dtype and (op == "equal" or a[0].dtype != np.bool_), op
        return cmp[op](a[0], a[1])
    logic = {"and": np.logical_and, "or": np.logical_or, "xor": np.logical_xor}
    if op in logic:
        assert a[0].dtype == a[1].dtype == np.bool_, op
        return logic[op](a[0], a[1])
    if op == "not":
        assert x.dtype == np.bool_
        return np.logical_not(x)
    if op == "mod":
        assert a[0].dtype == a[1].dtype and a[0].dtype.kind == "i"
        xb, yb = np.broadcast_arrays(a[0], a[1])
        r = [_py_mod(int(p), int(q), at.get("fmod", False)) for p, q in zip(xb.ravel(), yb.ravel())]
        return np.array(r, np.int64).astype(a[0].dtype).reshape(xb.shape)
    if op in ("floor", "ceil", "round"):
        assert x.dtype.kind == "f"
        return {"floor": np.floor, "ceil": np.ceil, "round": np.round}[op](x)
    if op == "scatter_elements":
        data, ind, upd = a
        ax = _axis(at.get("axis", 0), data.ndim)
        red = at.get("reduction", "none")
        out = data.copy()
        for p in np.ndindex(*ind.shape):
            i = int(ind[p])
            i = i + data.shape[ax] if i < 0 else i
            assert 0 <= i < data.shape[ax]
            q = p[:ax] + (i,) + p[ax + 1:]
            u = upd[p]
            out[q] = {"none": lambda o: u, "add": lambda o: o + u, "mul": lambda o: o * u,
                      "max": lambda o: max(o, u), "min": lambda o: min(o, u)}[red](out[q])
        return out
    if op in ("dynamic_slice", "dynamic_update_slice"):
        upd = a[1] if op == "dynamic_update_slice" else None
        starts = a[-1]
        assert starts.dtype in (np.int32, np.int64) and starts.shape == (len(at["axes"]),)
        sizes = at["sizes"] if upd is None else [upd.shape[_axis(ax, x.ndim)] for ax in at["axes"]]
        idx = [slice(None)] * x.ndim
        for ax, s, n in zip(at["axes"], starts, sizes):
            ax = _axis(ax, x.ndim)
            s = min(max(int(s), 0), x.shape[ax] - n)  # clamped into x, as XLA does
            idx[ax] = slice(s, s + n)
        if upd is None:
            return x[tuple(idx)].copy()
        out = x.copy()
        out[tuple(idx)] = upd
        return out
    if op == "conv":
        w = a[1]
        groups = at.get("groups", 1)
        n = list(x.shape[2:])
        win = _window_attrs(at, w.shape[2:])
        out_sz = _window_out(n, win)
        M, cg = w.shape[0], w.shape[1]
        mg = M // groups
        out = np.zeros((x.shape[0], M, *out_sz), F)
        for o in np.ndindex(*out_sz):
            for tap, kind, idx in _window_taps(n, win, o):
                if kind != "real":
                    continue
                for g_ in range(groups):
                    xs = x[(slice(None), slice(g_ * cg, (g_ + 1) * cg)) + idx]  # [N, cg]
                    ws = w[(slice(g_ * mg, (g_ + 1) * mg), slice(None)) + tap]  # [mg, cg]
                    out[(slice(None), slice(g_ * mg, (g_ + 1) * mg)) + o] += xs @ ws.T
        if len(a) == 3:
            out += a[2].reshape((1, M) + (1,) * len(n))
        return out
    if op in ("max_pool", "avg_pool"):
        n = list(x.shape[2:])
        win = _window_attrs(at, at["kernel"])
        out_sz = _window_out(n, win)
        out = np.zeros(x.shape[:2] + tuple(out_sz), x.dtype)
        for o in np.ndindex(*out_sz):
            taps = list(_window_taps(n, win, o))
            real = [x[(slice(None), slice(None)) + idx] for _, kind, idx in taps if kind == "real"]
            assert real, "a window of pads only"
            if op == "max_pool":
                out[(slice(None), slice(None)) + o] = np.max(np.stack(real), axis=0)
            else:
                count = len(real) + (sum(kind == "pad" for _, kind, _ in taps) if at.get("count_include_pad") else 0)
                out[(slice(None), slice(None)) + o] = np.sum(np.stack(real), axis=0) / F(count)
        return out
    if op == "pad":
        pads = at["pads"]
        r = x.ndim
        mode = at.get("mode", "constant")
        crop = tuple(slice(max(0, -pads[d]), x.shape[d] - max(0, -pads[r + d])) for d in range(r))
        grow = [(max(0, pads[d]), max(0, pads[r + d])) for d in range(r)]
        # A crop and a non-constant pad on one dim would depend on their order: not used.
        assert mode == "constant" or all(pads[d] >= 0 and pads[r + d] >= 0 for d in range(r))
        y = x[crop]
        if mode == "constant":
            return np.pad(y, grow, mode="constant", constant_values=np.array(at.get("value", 0.0)).astype(x.dtype))
        return np.pad(y, grow, mode=mode)
    raise ValueError("unknown op " + op)


# --------------------------------------------------------------------------------------
# Graph builder and writers.
# --------------------------------------------------------------------------------------


class G:
    def __init__(self, name):
        self.name = name
        self.inputs, self.params, self.nodes, self.outputs = [], [], [], []
        self.input_data, self.param_data = {}, {}
        self.files = {}  # weights file name -> list of (key, array) or array
        self.extra_files = {}  # other files under the graph directory -> array

    def input(self, name, arr, dims=None):
        arr = c_order(arr)
        d = {"name": name, "dtype": dtype_name(arr), "shape": list(arr.shape)}
        if dims is not None:
            d["dims"] = dims
        self.inputs.append(d)
        self.input_data[name] = arr
        return name

    def _param(self, name, dtype, shape, dims, data, arr):
        d = {"name": name, "dtype": dtype, "shape": list(shape)}
        if dims is not None:
            d["dims"] = dims
        d.update(data)
        self.params.append(d)
        assert arr.dtype == NP_DTYPE[dtype] and list(arr.shape) == list(shape)
        self.param_data[name] = arr
        return name

    def param_npy(self, name, arr, dims=None, file=None):
        arr = c_order(arr)
        file = file or name + ".npy"
        self.files[file] = arr
        return self._param(name, dtype_name(arr), arr.shape, dims, {"file": "weights/" + file}, arr)

    def param_st(self, name, arr, file, key=None, dims=None):
        arr = c_order(arr)
        key = key or name
        self.files.setdefault(file, []).append((key, arr))
        return self._param(name, dtype_name(arr), arr.shape, dims,
                           {"file": "weights/" + file, "key": key}, arr)

    def param_init(self, name, init, shape, dtype="f32", dims=None):
        return self._param(name, dtype, shape, dims, {"init": init}, init_values(init, shape, dtype))

    def param_value(self, name, value, dtype, shape, dims=None):
        arr = np.array(value, dtype=NP_DTYPE[dtype]).reshape(shape)
        return self._param(name, dtype, shape, dims, {"value": value}, arr)

    def node(self, name, op, inputs, attrs=None, shape=None, dtype=None, dims=None, output=False):
        d = {"name": name, "op": op, "inputs": list(inputs)}
        if attrs:
            d["attrs"] = attrs
        if shape is not None:
            d["shape"] = shape
        if dtype is not None:
            d["dtype"] = dtype
        if dims is not None:
            d["dims"] = dims
        assert name not in [n["name"] for n in self.nodes]
        self.nodes.append(d)
        if output:
            self.outputs.append(name)
        return name

    def graph(self):
        return {"format": "meshc-graph/1", "name": self.name, "inputs": self.inputs,
                "params": self.params, "nodes": self.nodes, "outputs": self.outputs}


def graph_json(g):
    """The graph as JSON, one input/param/node a line."""
    lines = ["{", '  "format": "meshc-graph/1",', '  "name": %s,' % json.dumps(g["name"])]
    for key in ("inputs", "params", "nodes"):
        items = g[key]
        if not items:
            lines.append('  "%s": [],' % key)
            continue
        lines.append('  "%s": [' % key)
        for i, it in enumerate(items):
            lines.append("    " + json.dumps(it) + ("," if i + 1 < len(items) else ""))
        lines.append("  ],")
    lines.append('  "outputs": %s' % json.dumps(g["outputs"]))
    lines.append("}")
    text = "\n".join(lines) + "\n"
    assert json.loads(text) == g
    return text


def safetensors_bytes(tensors):
    # Laid out by decreasing element size, then key, so every tensor's data is aligned
    # to its element size (the header is padded to a multiple of 8).
    header, blobs, off = {}, [], 0
    for key, arr in sorted(tensors, key=lambda kv: (-kv[1].dtype.itemsize, kv[0])):
        arr = c_order(arr)
        b = arr.astype(arr.dtype.newbyteorder("<")).tobytes()
        header[key] = {"dtype": ST_DTYPE[dtype_name(arr)], "shape": list(arr.shape),
                       "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return len(h).to_bytes(8, "little") + h + b"".join(blobs)


def read_safetensors(data):
    """Minimal reader, to check the writer round-trips."""
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    inv = {v: k for k, v in ST_DTYPE.items()}
    out = {}
    for key, h in header.items():
        s, e = h["data_offsets"]
        out[key] = np.frombuffer(data[8 + n + s:8 + n + e], dtype=np.dtype(NP_DTYPE[inv[h["dtype"]]]).newbyteorder("<")).reshape(h["shape"])
    return out


WRITTEN = []


def write_file(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
    WRITTEN.append((path, len(data)))


def write_npy(path, arr):
    arr = c_order(arr)
    if arr.dtype.kind in "fi":
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    np.save(path, arr, allow_pickle=False)
    back = np.load(path, allow_pickle=False)
    assert back.shape == arr.shape and back.dtype == arr.dtype and np.array_equal(back, arr), path
    WRITTEN.append((path, os.path.getsize(path)))


def close(got, want):
    """The stated tolerance, element-wise; ints and bools must be equal."""
    if want.dtype.kind == "f":
        return bool(np.all(np.abs(got.astype(np.float64) - want.astype(np.float64))
                           <= ATOL + RTOL * np.abs(want.astype(np.float64))))
    return np.array_equal(got, want)


def emit(g, second_path):
    """Evaluate (f64), cross-check, then write graph, weights, inputs and expected outputs."""
    graph = g.graph()
    names = [x["name"] for x in graph["inputs"] + graph["params"] + graph["nodes"]]
    assert len(names) == len(set(names)), "duplicate names"
    ref = evaluate(graph, g.param_data, g.input_data, np.float64)

    # Second, hand-written computation path.
    alt = second_path({**g.param_data, **g.input_data})
    for name, want in alt.items():
        got = ref[name]
        assert got.shape == np.shape(want) and (got.dtype.kind == "f") == (np.asarray(want).dtype.kind == "f"), name
        if got.dtype.kind == "f":
            assert np.allclose(got, want, rtol=1e-10, atol=1e-12), (g.name, name, np.max(np.abs(got - want)))
        else:
            assert np.array_equal(got, want), (g.name, name)

    expected = {}
    for name, v in ref.items():
        if v.dtype.kind == "f":
            assert np.all(np.isfinite(v)), name
            expected[name] = v.astype(np.float32)
        else:
            expected[name] = v
    # The tolerance is achievable by an f32 evaluation of the same graph.
    f32 = evaluate(graph, g.param_data, g.input_data, np.float32)
    for name, want in expected.items():
        assert f32[name].dtype == want.dtype and close(f32[name], want), (g.name, name)

    d = os.path.join(TESTDATA, g.name)
    # Only what this script writes: layouts/ and anything else hand-made stays.
    for sub in ["weights", "inputs", "expected", "generate"]:
        if os.path.isdir(os.path.join(d, sub)):
            shutil.rmtree(os.path.join(d, sub))
    write_file(os.path.join(d, "graph.json"), graph_json(graph).encode())
    for file, content in sorted(g.files.items()):
        path = os.path.join(d, "weights", file)
        if isinstance(content, list):
            data = safetensors_bytes(content)
            back = read_safetensors(data)
            for key, arr in content:
                assert np.array_equal(back[key], arr) and back[key].dtype == arr.dtype
            write_file(path, data)
        else:
            write_npy(path, content)
    for name, arr in g.input_data.items():
        write_npy(os.path.join(d, "inputs", name + ".npy"), arr)
    for name in graph["outputs"]:
        write_npy(os.path.join(d, "expected", name + ".npy"), expected[name])
    for path, arr in sorted(g.extra_files.items()):
        write_npy(os.path.join(d, path), arr)
    return graph, expected


# --------------------------------------------------------------------------------------
# Plain-numpy helpers for the second computation paths (float64).
# --------------------------------------------------------------------------------------


def f64(d):
    return {k: (v.astype(np.float64) if v.dtype == np.float32 else v) for k, v in d.items()}


def np_layer_norm(x, g, b, naxes, eps):
    axes = tuple(range(x.ndim - naxes, x.ndim))
    return (x - x.mean(axis=axes, keepdims=True)) / np.sqrt(x.var(axis=axes, keepdims=True) + eps) * g + b


def np_softmax(x, axis):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def np_gelu(x):
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


def np_gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def normal(rng, shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


# --------------------------------------------------------------------------------------
# 1. mlp — DESIGN.md §3's 2-layer ReLU MLP, small.
# --------------------------------------------------------------------------------------


def build_mlp():
    rng = np.random.default_rng(1001)
    g = G("mlp")
    g.input("x", normal(rng, (16, 64)), dims=["batch", "embed"])
    g.param_npy("w1", normal(rng, (64, 256), 1 / 8), dims=["embed", "hidden"])
    g.param_init("w2", {"normal": {"seed": 1, "std": 0.0625}}, [256, 64], dims=["hidden", "embed"])
    g.node("h", "matmul", ["x", "w1"])
    g.node("a", "relu", ["h"])
    g.node("y", "matmul", ["a", "w2"], shape=[16, 64], dtype="f32", output=True)

    def alt(d):
        d = f64(d)
        return {"y": np.maximum(d["x"] @ d["w1"], 0) @ d["w2"]}

    return g, alt


# --------------------------------------------------------------------------------------
# 2. gelu_mlp — three layers with biases, gelu (exact) and gelu (tanh).
# --------------------------------------------------------------------------------------


def build_gelu_mlp():
    rng = np.random.default_rng(1002)
    g = G("gelu_mlp")
    g.input("x", normal(rng, (8, 32)), dims=["batch", "embed"])
    g.param_npy("w1", normal(rng, (32, 64), 1 / math.sqrt(32)), dims=["embed", "hidden"])
    g.param_npy("b1", normal(rng, (64,), 0.1), dims=["hidden"])
    g.param_npy("w2", normal(rng, (64, 64), 1.5 / math.sqrt(64)), dims=["hidden", "hidden2"])
    g.param_init("b2", {"uniform": {"seed": 7, "low": -0.1, "high": 0.1}}, [64], dims=["hidden2"])
    g.param_npy("w3", normal(rng, (64, 16), 1.5 / math.sqrt(64)), dims=["hidden2", "out"])
    b3 = [round(float(v), 3) for v in rng.uniform(-0.2, 0.2, 16)]
    g.param_value("b3", b3, "f32", [16], dims=["out"])
    g.node("h1", "matmul", ["x", "w1"])
    g.node("h1b", "add", ["h1", "b1"])
    g.node("a1", "gelu", ["h1b"], {"approximate": "none"})
    g.node("h2", "matmul", ["a1", "w2"])
    g.node("h2b", "add", ["h2", "b2"])
    g.node("a2", "gelu", ["h2b"], {"approximate": "tanh"})
    g.node("h3", "matmul", ["a2", "w3"])
    g.node("y", "add", ["h3", "b3"], shape=[8, 16], dims=["batch", "out"], output=True)

    def alt(d):
        d = f64(d)
        a1 = np_gelu(np.einsum("bi,ih->bh", d["x"], d["w1"]) + d["b1"])
        a2 = np_gelu_tanh(a1 @ d["w2"] + d["b2"])
        return {"y": a2 @ d["w3"] + d["b3"]}

    return g, alt


# --------------------------------------------------------------------------------------
# 3. transformer — BERT-style encoder block.
# --------------------------------------------------------------------------------------

B, S, D, H, V, FF = 2, 8, 32, 4, 50, 128
DH = D // H


def build_transformer():
    rng = np.random.default_rng(1003)
    g = G("transformer")
    ids = rng.integers(0, V, size=(B, S)).astype(np.int32)
    ids[1, 2] = ids[0, 5] = 7  # a repeated token
    ids[0, 0], ids[1, 7] = 0, V - 1  # both ends of the table
    g.input("ids", ids, dims=["batch", "seq"])
    mask = np.zeros((B, 1, 1, S), np.float32)
    mask[0, 0, 0, 6:] = -1e9  # batch 0: last 2 keys are padding
    mask[1, 0, 0, 5:] = -1e9  # batch 1: last 3 keys are padding
    g.input("mask", mask, dims=["batch", None, None, "seq"])

    st = "model.safetensors"
    g.param_st("emb", normal(rng, (V, D)), st, key="emb", dims=["vocab", "embed"])
    g.param_st("pos", normal(rng, (S, D), 0.5), st, key="pos", dims=["seq", "embed"])
    g.param_init("ln1_g", "ones", [D], dims=["embed"])
    g.param_init("ln1_b", "zeros", [D], dims=["embed"])
    w = 1 / math.sqrt(D)
    for n in ("q", "k", "v"):
        g.param_st("w" + n, normal(rng, (D, D), w), st, key="attn.w" + n, dims=["embed", "qkv"])
        g.param_st("b" + n, normal(rng, (D,), 0.1), st, key="attn.b" + n, dims=["qkv"])
    g.param_value("scale", 1 / math.sqrt(DH), "f32", [])
    g.param_npy("wo", normal(rng, (D, D), w), dims=["qkv", "embed"])
    g.param_npy("bo", normal(rng, (D,), 0.1), dims=["embed"])
    g.param_npy("ln2_g", (1 + normal(rng, (D,), 0.1)).astype(np.float32), dims=["embed"])
    g.param_npy("ln2_b", normal(rng, (D,), 0.1), dims=["embed"])
    g.param_npy("w_ff1", normal(rng, (D, FF), w), dims=["embed", "hidden"])
    g.param_npy("b_ff1", normal(rng, (FF,), 0.1), dims=["hidden"])
    g.param_init("w_ff2", {"normal": {"seed": 42, "std": 1 / math.sqrt(FF)}}, [FF, D], dims=["hidden", "embed"])
    g.param_npy("b_ff2", normal(rng, (D,), 0.1), dims=["embed"])

    g.node("tok", "gather", ["emb", "ids"], {"axis": 0}, shape=[B, S, D], dims=["batch", "seq", "embed"])
    g.node("x0", "add", ["tok", "pos"])
    g.node("h", "layer_norm", ["x0", "ln1_g", "ln1_b"], {"axis": -1, "eps": 1e-12})
    heads = ["batch", "heads", "seq", "head_dim"]
    for n in ("q", "k", "v"):
        g.node(n, "matmul", ["h", "w" + n])
        g.node(n + "_b", "add", [n, "b" + n])
        g.node(n + "_r", "reshape", [n + "_b"], {"shape": [B, S, H, DH]}, dims=["batch", "seq", "heads", "head_dim"])
        g.node(n + "_h", "transpose", [n + "_r"], {"perm": [0, 2, 1, 3]}, shape=[B, H, S, DH], dims=heads)
    g.node("k_t", "transpose", ["k_h"], {"perm": [0, 1, 3, 2]}, dims=["batch", "heads", "head_dim", "seq"])
    g.node("scores", "matmul", ["q_h", "k_t"], shape=[B, H, S, S])
    g.node("scaled", "mul", ["scores", "scale"])
    g.node("masked", "add", ["scaled", "mask"])
    g.node("probs", "softmax", ["masked"], {"axis": -1})
    g.node("ctx", "matmul", ["probs", "v_h"], shape=[B, H, S, DH])
    g.node("ctx_t", "transpose", ["ctx"], {"perm": [0, 2, 1, 3]})
    g.node("ctx_r", "reshape", ["ctx_t"], {"shape": [B, S, -1]}, shape=[B, S, D], dims=["batch", "seq", "qkv"])
    g.node("o", "matmul", ["ctx_r", "wo"])
    g.node("o_b", "add", ["o", "bo"])
    g.node("res1", "add", ["h", "o_b"])
    g.node("h2", "layer_norm", ["res1", "ln2_g", "ln2_b"])
    g.node("f1", "matmul", ["h2", "w_ff1"], dims=["batch", "seq", "hidden"])
    g.node("f1_b", "add", ["f1", "b_ff1"])
    g.node("f1_a", "gelu", ["f1_b"])
    g.node("f2", "matmul", ["f1_a", "w_ff2"])
    g.node("f2_b", "add", ["f2", "b_ff2"])
    g.node("y", "add", ["h2", "f2_b"], shape=[B, S, D], dtype="f32", dims=["batch", "seq", "embed"], output=True)

    def alt(d):
        d = f64(d)
        # Embedding by explicit row loop.
        x0 = np.array([[d["emb"][d["ids"][b, s]] for s in range(S)] for b in range(B)]) + d["pos"]
        h = np_layer_norm(x0, d["ln1_g"], d["ln1_b"], 1, 1e-12)
        q, k, v = [(np.einsum("bsd,de->bse", h, d["w" + n]) + d["b" + n]).reshape(B, S, H, DH) for n in "qkv"]
        sc = np.einsum("bqhd,bkhd->bhqk", q, k) * float(np.float32(1 / math.sqrt(DH)))
        valid = d["mask"] == 0  # [B,1,1,S]
        sc = np.where(valid, sc, -np.inf)
        p = np_softmax(sc, -1)
        assert np.allclose(p.sum(-1), 1) and np.all(p[~np.broadcast_to(valid, p.shape)] == 0)
        ctx = np.einsum("bhqk,bkhd->bqhd", p, v).reshape(B, S, D)
        h2 = np_layer_norm(h + ctx @ d["wo"] + d["bo"], d["ln2_g"], d["ln2_b"], 1, 1e-5)
        y = h2 + np_gelu(h2 @ d["w_ff1"] + d["b_ff1"]) @ d["w_ff2"] + d["b_ff2"]
        return {"y": y}

    return g, alt


# --------------------------------------------------------------------------------------
# 4. reductions
# --------------------------------------------------------------------------------------


def build_reductions():
    rng = np.random.default_rng(1004)
    g = G("reductions")
    g.input("a", (rng.standard_normal((4, 6, 8)) + 0.5).astype(np.float32), dims=["batch", "seq", "embed"])
    g.input("b", normal(rng, (2, 3, 4, 5), 2.0), dims=["groups", "heads", "rows", None])
    g.input("c", rng.integers(-50, 50, size=(3, 4)).astype(np.int32))
    g.param_npy("g", (1 + normal(rng, (4, 5), 0.2)).astype(np.float32))
    g.param_npy("beta", normal(rng, (4, 5), 0.2))

    g.node("sum_all", "reduce_sum", ["a"], shape=[], output=True)
    g.node("sum_02", "reduce_sum", ["a"], {"axes": [0, 2]}, output=True)
    g.node("sum_keep", "reduce_sum", ["b"], {"axes": [1, 3], "keepdims": True}, shape=[2, 1, 4, 1], output=True)
    g.node("mean_neg", "reduce_mean", ["b"], {"axes": [-1, -3]}, shape=[2, 4], output=True)
    g.node("mean_all_keep", "reduce_mean", ["a"], {"keepdims": True}, shape=[1, 1, 1], output=True)
    g.node("max_1", "reduce_max", ["a"], {"axes": [1], "keepdims": False}, output=True)
    g.node("max_keep", "reduce_max", ["b"], {"axes": [0, 2], "keepdims": True}, shape=[1, 3, 1, 5], output=True)
    g.node("max_all", "reduce_max", ["b"], output=True)
    g.node("none", "reduce_sum", ["a"], {"axes": []}, shape=[4, 6, 8])
    g.node("twice", "add", ["none", "a"], output=True)
    g.node("sm", "softmax", ["b"], {"axis": 1}, output=True)
    g.node("sm_sum", "reduce_sum", ["sm"], {"axes": [1]}, output=True)
    g.node("ln", "layer_norm", ["b", "g", "beta"], {"axis": 2, "eps": 1e-3}, output=True)
    # variance by hand: mean of squared deviations over the last axis
    g.node("mu", "reduce_mean", ["a"], {"axes": [-1], "keepdims": True})
    g.node("dev", "sub", ["a", "mu"])
    g.node("dev2", "mul", ["dev", "dev"])
    g.node("var", "reduce_mean", ["dev2"], {"axes": [-1]}, shape=[4, 6], output=True)
    # logsumexp over the last axis, stabilised by the max
    g.node("m", "reduce_max", ["a"], {"axes": [-1], "keepdims": True})
    g.node("sh", "sub", ["a", "m"])
    g.node("e", "exp", ["sh"])
    g.node("se", "reduce_sum", ["e"], {"axes": [-1], "keepdims": True})
    g.node("lse_l", "log", ["se"])
    g.node("lse", "add", ["lse_l", "m"], shape=[4, 6, 1], output=True)
    # integer reductions
    g.node("c_sum", "reduce_sum", ["c"], {"axes": [0]}, dtype="i32", output=True)
    g.node("c_max", "reduce_max", ["c"], output=True)

    def alt(d):
        d = f64(d)
        a, b, c = d["a"], d["b"], d["c"]
        sm = np.exp(b) / np.exp(b).sum(axis=1, keepdims=True)
        out = {
            "sum_all": np.array(math.fsum(a.ravel())),
            "sum_02": a.transpose(1, 0, 2).reshape(6, -1).sum(axis=1),
            "sum_keep": b.sum(axis=3).sum(axis=1)[:, None, :, None],
            "mean_neg": b.mean(axis=(1, 3)),
            "mean_all_keep": np.full((1, 1, 1), a.mean()),
            "max_1": a.max(axis=1),
            "max_keep": b.max(axis=2, keepdims=True).max(axis=0, keepdims=True),
            "max_all": np.array(b.max()),
            "twice": 2 * a,
            "sm": sm,
            "sm_sum": np.ones((2, 4, 5)),
            "var": np.var(a, axis=-1),
            "lse": np.log(np.exp(a).sum(axis=-1, keepdims=True)),
            "c_sum": c.sum(axis=0).astype(np.int32),
            "c_max": np.array(c.max(), dtype=np.int32),
        }
        bb = b.reshape(2, 3, 20)
        ln = (bb - bb.mean(-1, keepdims=True)) / np.sqrt(bb.var(-1, keepdims=True) + 1e-3)
        out["ln"] = ln.reshape(b.shape) * d["g"] + d["beta"]
        return out

    return g, alt


# --------------------------------------------------------------------------------------
# 5. all_ops — every non-communication op, every attribute form.
# --------------------------------------------------------------------------------------


def build_all_ops():
    rng = np.random.default_rng(1005)
    g = G("all_ops")
    x = normal(rng, (4, 6))
    g.input("x", x, dims=["batch", "feat"])
    g.input("y", normal(rng, (4, 6)))
    g.input("z", normal(rng, (6,)), dims=["feat"])
    g.input("t", normal(rng, (2, 3, 4)))
    # q: values to truncate, kept away from integers so f32 and f64 agree on the result.
    q = rng.uniform(-4.9, 4.9, (4, 6)).astype(np.float32)
    q = np.where(np.abs(q - np.round(q)) < 0.05, q + np.float32(0.25), q).astype(np.float32)
    assert np.all(np.abs(q - np.round(q)) >= 0.04)
    g.input("q", q)
    m = rng.choice(np.array([0.0, 0.0, 0.5, -2.0, 3.0], np.float32), size=(4, 6))
    g.input("m", m)
    g.input("n", rng.integers(-5, 6, size=(4, 6)).astype(np.int32))
    g.input("idx", np.array([[0, -1, 2], [-6, 5, -3]], np.int64))

    st = "params.safetensors"
    g.param_value("one", 1.0, "f32", [])
    g.param_npy("w", normal(rng, (6, 5), 0.4), dims=["feat", "out"])
    g.param_st("p", normal(rng, (4, 5), 0.5), st)
    g.param_st("bp", normal(rng, (3, 4, 2), 0.5), st)
    g.param_init("e", {"uniform": {"seed": 3, "low": -1.0, "high": 1.0}}, [2, 4, 5])
    g.param_init("v4", {"normal": {"seed": 4, "mean": 0.5, "std": 1.0}}, [4])
    g.param_npy("gidx", np.array([2, -1, 0], np.int32))
    g.param_value("sidx", -1, "i32", [])
    g.param_st("bmask", rng.random((4, 6)) < 0.5, st)
    g.param_st("k64", np.array([3, -1, 4, -1, 5, -9], np.int64), st)
    g.param_value("c3", [1, -2, 3, -4, 5, -6], "i32", [6])
    g.param_init("g6", "ones", [6])
    g.param_init("b6", "zeros", [6])
    g.param_npy("g34", (1 + normal(rng, (3, 4), 0.2)).astype(np.float32))
    g.param_npy("b34", normal(rng, (3, 4), 0.2))
    g.param_value("u4", [0.5, -1.0, 2.0, 0.25], "f32", [4])

    N = g.node
    # elementwise, f32
    N("add_xy", "add", ["x", "y"])
    N("sub_xz", "sub", ["x", "z"])  # broadcast [4,6] - [6]
    N("mul_", "mul", ["add_xy", "sub_xz"])
    N("exp_y", "exp", ["y"])
    N("div_", "div", ["x", "exp_y"])
    N("max_", "maximum", ["x", "y"])
    N("min_", "minimum", ["x", "z"])
    N("abs_", "abs", ["x"])
    N("pos", "add", ["abs_", "one"])  # >= 1, scalar broadcast
    N("pow_", "pow", ["pos", "z"])
    N("neg_", "neg", ["x"])
    N("log_", "log", ["pos"])
    N("sqrt_", "sqrt", ["pos"])
    N("rsqrt_", "rsqrt", ["pos"])
    N("tanh_", "tanh", ["x"])
    N("erf_", "erf", ["x"])
    N("sigmoid_", "sigmoid", ["x"])
    N("relu_", "relu", ["x"])
    N("gelu_", "gelu", ["x"])
    N("gelu_none", "gelu", ["y"], {"approximate": "none"})
    N("gelu_tanh", "gelu", ["x"], {"approximate": "tanh"})
    # casts
    N("q_i32", "cast", ["q"], {"to": "i32"}, dtype="i32")
    N("n_f32", "cast", ["n"], {"to": "f32"})
    N("m_bool", "cast", ["m"], {"to": "bool"}, dtype="bool")
    N("m_f32", "cast", ["m_bool"], {"to": "f32"})
    N("n_i64", "cast", ["n"], {"to": "i64"})
    N("mix_f", "mul", ["n_f32", "m_f32"])
    # elementwise, integers
    N("int_add", "add", ["q_i32", "n"])
    N("int_sub", "sub", ["int_add", "c3"])
    N("int_mul", "mul", ["int_sub", "n"])
    N("int_max", "maximum", ["int_mul", "c3"])
    N("int_min", "minimum", ["q_i32", "n"])
    N("int_neg", "neg", ["int_min"])
    N("int_abs", "abs", ["n"])
    N("int_relu", "relu", ["q_i32"])
    N("i64_mul", "mul", ["n_i64", "k64"])
    N("i64_sum", "reduce_sum", ["i64_mul"], {"axes": [1]}, dtype="i64")
    # where
    N("where_f", "where", ["m_bool", "x", "z"])  # cond [4,6], b broadcast from [6]
    N("where_i", "where", ["bmask", "int_max", "int_relu"], dtype="i32")
    # matmul
    N("mm", "matmul", ["x", "w"], dims=["batch", "out"])
    N("mv", "matmul", ["x", "z"], shape=[4])  # 1-D right operand
    N("vm", "matmul", ["u4", "x"], shape=[6])  # 1-D left operand
    N("bmm", "matmul", ["t", "p"], shape=[2, 3, 5])  # batched lhs, 2-D rhs
    N("t4", "reshape", ["t"], {"shape": [2, 1, 3, 4]})
    N("bcmm", "matmul", ["t4", "bp"], shape=[2, 3, 3, 2])  # batch [2,1] x [3] -> [2,3]
    N("bmv", "matmul", ["t", "v4"], shape=[2, 3])  # batched lhs, 1-D rhs
    # einsum
    N("ein_b", "einsum", ["t", "e"], {"equation": "bij,bjk->bik"})
    N("ein_t", "einsum", ["x", "y"], {"equation": "ij,kj->ik"}, shape=[4, 4])
    N("ein_1", "einsum", ["t"], {"equation": "abc->cb"}, shape=[4, 3])
    N("ein_3", "einsum", ["u4", "x", "z"], {"equation": "i,ij,j->j"}, shape=[6])
    # reductions
    N("rs_all", "reduce_sum", ["x"], shape=[])
    N("rs_keep", "reduce_sum", ["t"], {"axes": [0, 2], "keepdims": True}, shape=[1, 3, 1])
    N("rs_none", "reduce_sum", ["x"], {"axes": []}, shape=[4, 6])
    N("rm", "reduce_mean", ["t"], {"axes": [-1]})
    N("rmax", "reduce_max", ["x"], {"axes": [0], "keepdims": False})
    N("rmax_i", "reduce_max", ["n"], {"axes": [1], "keepdims": True}, shape=[4, 1])
    # normalisations
    N("sm", "softmax", ["x"])
    N("sm0", "softmax", ["t"], {"axis": 0})
    N("ln", "layer_norm", ["x", "g6", "b6"])
    N("ln2", "layer_norm", ["t", "g34", "b34"], {"axis": 1, "eps": 1e-3})
    # data movement
    N("rsh", "reshape", ["x"], {"shape": [-1, 3]}, shape=[8, 3])
    N("rsh2", "reshape", ["t"], {"shape": [4, -1]}, shape=[4, 6])
    N("tr", "transpose", ["t"], {"perm": [1, 0, 2]}, shape=[3, 2, 4])
    N("tr_rev", "transpose", ["t"], shape=[4, 3, 2])
    N("bc", "broadcast_to", ["z"], {"shape": [3, 4, 6]})
    N("bc2", "broadcast_to", ["rs_keep"], {"shape": [2, 3, 4]})
    N("cat", "concat", ["x", "y", "mul_"], {"axis": 0}, shape=[12, 6])
    N("cat_i", "concat", ["n", "q_i32", "int_abs"], {"axis": -1}, shape=[4, 18])
    N("cat_b", "concat", ["m_bool", "bmask"], {"axis": 1}, shape=[4, 12], dtype="bool")
    N("sl1", "slice", ["x"], {"starts": [1], "ends": [3]}, shape=[2, 6])
    N("sl2", "slice", ["x"], {"starts": [-1, 0], "ends": [-5, 100], "axes": [0, 1], "steps": [-1, 2]}, shape=[4, 3])
    N("sl3", "slice", ["t"], {"starts": [-3, 1], "ends": [10, -1], "axes": [-1, 1], "steps": [2, 1]}, shape=[2, 1, 2])
    N("sl4", "slice", ["q_i32"], {"starts": [5], "ends": [-100], "axes": [1], "steps": [-2]}, shape=[4, 3])
    N("ga", "gather", ["x", "idx"], {"axis": 1}, shape=[4, 2, 3])
    N("ga0", "gather", ["x", "gidx"], shape=[3, 6])
    N("ga_s", "gather", ["t", "sidx"], {"axis": 0}, shape=[3, 4])
    N("ga_i", "gather", ["n", "idx"], {"axis": -1}, shape=[4, 2, 3], dtype="i32")
    g.outputs = [n["name"] for n in g.nodes]  # every node is an output

    covered = {n["op"] for n in g.nodes}
    all_ops = set("add sub mul div maximum minimum pow neg abs exp log sqrt rsqrt tanh erf sigmoid relu "
                  "gelu cast where matmul einsum reduce_sum reduce_mean reduce_max softmax layer_norm "
                  "reshape transpose broadcast_to concat slice gather".split())
    assert covered == all_ops, all_ops ^ covered

    def alt(d):
        d = f64(d)
        x, y, z, t, q, m, n, idx = (d[k] for k in "x y z t q m n idx".split())
        pos = np.abs(x) + 1
        qi = np.array([[int(v) for v in row] for row in q], np.int32)  # Python int() truncates
        mb = m != 0
        c3 = np.array([1, -2, 3, -4, 5, -6], np.int32)
        int_max = np.maximum((qi + n - c3) * n, c3)
        out = {
            "mul_": (x + y) * (x - z[None, :]),
            "div_": x * np.exp(-y),
            "pow_": np.exp(np.log(pos) * z),
            "log_": np.log(pos), "sqrt_": pos**0.5, "rsqrt_": pos**-0.5,
            "sigmoid_": 0.5 * (1 + np.tanh(x / 2)),
            "relu_": np.where(x > 0, x, 0.0),
            "gelu_": np_gelu(x), "gelu_none": np_gelu(y), "gelu_tanh": np_gelu_tanh(x),
            "q_i32": qi, "m_bool": mb, "m_f32": mb.astype(np.float64), "mix_f": n.astype(np.float64) * mb,
            "int_max": int_max,
            "int_neg": -np.minimum(qi, n), "int_relu": np.maximum(qi, 0),
            "i64_sum": (n.astype(np.int64) * d["k64"]).sum(axis=1),
            "where_f": np.where(mb, x, np.broadcast_to(z, x.shape)),
            "where_i": np.where(d["bmask"], int_max, np.maximum(qi, 0)),
            "mm": np.einsum("ij,jk->ik", x, d["w"]),
            "mv": (x * z).sum(axis=1),
            "vm": (d["u4"][:, None] * x).sum(axis=0),
            "bmm": np.stack([t[i] @ d["p"] for i in range(2)]),
            "bcmm": np.array([[t[i] @ d["bp"][j] for j in range(3)] for i in range(2)]),
            "bmv": (t * d["v4"]).sum(-1),
            "ein_b": np.stack([t[i] @ d["e"][i] for i in range(2)]),
            "ein_t": x @ y.T,
            "ein_1": t.sum(axis=0).T,
            "ein_3": (d["u4"] @ x) * z,
            "rs_all": np.array(x.sum()),
            "rs_keep": t.sum(axis=(0, 2)).reshape(1, 3, 1),
            "rs_none": x,
            "rmax_i": n.max(axis=1, keepdims=True),
            "sm": np_softmax(x, 1), "sm0": np_softmax(t, 0),
            "ln": np_layer_norm(x, 1.0, 0.0, 1, 1e-5),
            "ln2": np_layer_norm(t, d["g34"], d["b34"], 2, 1e-3),
            "rsh": x.ravel().reshape(8, 3),
            "tr": np.array([[t[j, i] for j in range(2)] for i in range(3)]),
            "tr_rev": np.einsum("abc->cba", t),
            "bc": np.tile(z, (3, 4, 1)),
            "bc2": np.repeat(t.sum(axis=(0, 2))[None, :, None], 4, axis=2).repeat(2, axis=0),
            "cat": np.vstack([x, y, (x + y) * (x - z)]),
            "cat_i": np.hstack([n, qi, np.abs(n)]),
            "sl1": x[[1, 2]],
            "sl2": x[[3, 2, 1, 0]][:, [0, 2, 4]],
            "sl3": t[:, [1]][:, :, [1, 3]],
            "sl4": qi[:, [5, 3, 1]],
            "ga": np.array([[[x[r, c % 6] for c in row] for row in idx] for r in range(4)]),
            "ga0": x[[2, 3, 0]],
            "ga_s": t[1],
            "ga_i": np.array([[[n[r, c % 6] for c in row] for row in idx] for r in range(4)], np.int32),
        }
        assert np.allclose(np_softmax(x, 1).sum(1), 1)
        assert np.array_equal(qi, np.trunc(q).astype(np.int32)) and qi.min() < 0
        assert mb.any() and not mb.all() and (m < 0).any()
        return out

    return g, alt


# --------------------------------------------------------------------------------------
# 6. cnn — op set v2: windows, pad, comparisons and logic, mod, rounding, scatter.
# --------------------------------------------------------------------------------------


def build_cnn():
    rng = np.random.default_rng(1006)
    g = G("cnn")
    g.input("x", normal(rng, (4, 3, 9, 9)), dims=["batch", "cin", "h", "w"])
    g.input("s", normal(rng, (4, 5, 10)), dims=["batch", "cs", "len"])
    a = normal(rng, (4, 6))
    b = np.where(rng.random((4, 6)) < 0.3, a, normal(rng, (4, 6))).astype(np.float32)
    g.input("a", a, dims=["batch", "feat"])
    g.input("b", b, dims=["batch", "feat"])
    # r: exact halves (round half to even), integers and values in between.
    r = rng.choice(np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, -3.0, 4.0, 0.3, -0.7, 1.75, -2.2], np.float32), (4, 6))
    g.input("r", r, dims=["batch", "feat"])
    g.input("n", rng.integers(-9, 10, (4, 6)).astype(np.int32), dims=["batch", "feat"])
    g.input("k", rng.choice(np.array([-4, -3, -1, 0, 2, 3, 5], np.int32), (4, 6)), dims=["batch", "feat"])
    g.input("si", np.array([[5, 0, 2], [1, -1, 3], [4, 2, 0], [-6, 3, 1]], np.int64), dims=["batch", None])
    g.input("su", normal(rng, (4, 3)), dims=["batch", None])
    # Column indices with duplicates (2 twice in row 0, 1 three times in row 2): reductions combine them.
    g.input("sd", np.array([[2, 2, 0], [1, 4, 5], [1, 1, 1], [0, 5, -1]], np.int32), dims=["batch", None])
    # Row indices, every one hit twice (3 and -2 are rows 3 and 2).
    g.param_value("rows", [[3, 0, 2], [3, 0, -2]], "i64", [2, 3])

    st = "params.safetensors"
    g.param_npy("w1", normal(rng, (8, 3, 3, 3), 0.3), dims=["ch", "cin", "kh", "kw"])
    g.param_npy("b1", normal(rng, (8,), 0.1), dims=["ch"])
    g.param_st("wd", normal(rng, (8, 1, 3, 3), 0.3), st, dims=["ch", None, "kh", "kw"])
    g.param_st("wg", normal(rng, (4, 4, 3, 3), 0.3), st)
    g.param_st("w1d", normal(rng, (6, 5, 3), 0.3), st)
    g.param_st("wfc", normal(rng, (8 * 5 * 5, 10), 0.1), st, dims=["flat", "cls"])
    g.param_value("big", [10, -10, 7, -7, 1, 0], "i64", [6])

    N = g.node
    # A small CNN: conv (bias, pads) -> relu -> depthwise (strides, asymmetric pads) and pools.
    N("c1", "conv", ["x", "w1", "b1"], {"pads": [1, 1, 1, 1]}, shape=[4, 8, 9, 9], dims=["batch", "ch", "h", "w"])
    N("r1", "relu", ["c1"])
    N("dw", "conv", ["r1", "wd"], {"groups": 8, "strides": [2, 2], "pads": [1, 0, 1, 2]}, shape=[4, 8, 5, 5])
    N("gc", "conv", ["r1", "wg"], {"groups": 2, "dilations": [2, 2], "strides": [1, 2]}, shape=[4, 4, 5, 3])
    N("mp", "max_pool", ["r1"], {"kernel": [3, 3], "strides": [2, 2], "pads": [1, 1, 0, 0], "ceil_mode": True},
      shape=[4, 8, 5, 5])
    N("mp_d", "max_pool", ["c1"], {"kernel": [2, 2], "dilations": [2, 1], "strides": [3, 3], "ceil_mode": True},
      shape=[4, 8, 3, 3])
    N("ap", "avg_pool", ["r1"], {"kernel": [2, 3], "strides": [2, 2], "pads": [0, 1, 0, 1], "count_include_pad": True},
      shape=[4, 8, 4, 5])
    N("ap_c", "avg_pool", ["c1"], {"kernel": [3, 3], "strides": [3, 2], "pads": [1, 1, 1, 1], "ceil_mode": True},
      shape=[4, 8, 4, 5])
    N("gap", "reduce_mean", ["r1"], {"axes": [2, 3]}, shape=[4, 8])
    N("flat", "reshape", ["mp"], {"shape": [4, 200]})
    N("logits", "matmul", ["flat", "wfc"], shape=[4, 10])
    # 1-D windows.
    N("c1d", "conv", ["s", "w1d"], {"pads": [2, 0], "dilations": [2]}, shape=[4, 6, 8])
    N("mp1d", "max_pool", ["s"], {"kernel": [3], "strides": [2]}, shape=[4, 5, 4])
    N("ap1d", "avg_pool", ["s"], {"kernel": [4], "pads": [2, 2], "strides": [3]}, shape=[4, 5, 4])
    # pad: every mode; a negative pad crops.
    N("pd_c", "pad", ["x"], {"pads": [0, 0, 1, -1, 0, 0, 2, 1], "value": 0.5}, shape=[4, 3, 12, 9])
    N("pd_r", "pad", ["x"], {"pads": [0, 0, 2, 1, 0, 0, 1, 3], "mode": "reflect"}, shape=[4, 3, 12, 13])
    N("pd_e", "pad", ["s"], {"pads": [0, 1, 2, 0, 0, 3], "mode": "edge"}, shape=[4, 6, 15])
    N("pd_w", "pad", ["s"], {"pads": [0, 0, 12, 0, 2, 1], "mode": "wrap"}, shape=[4, 7, 23])
    N("pd_i", "pad", ["n"], {"pads": [0, 2, 0, -1], "value": 7.0}, shape=[4, 7], dtype="i32")
    # Comparisons and logic.
    N("eq", "equal", ["a", "b"], dtype="bool")
    N("lt", "less", ["a", "b"], dtype="bool")
    N("le", "less_equal", ["a", "b"], dtype="bool")
    N("gt", "greater", ["a", "b"], dtype="bool")
    N("ge_i", "greater_equal", ["n", "k"], dtype="bool")
    N("eq_b", "equal", ["eq", "le"], dtype="bool")
    N("and_", "and", ["le", "ge_i"], dtype="bool")
    N("or_", "or", ["lt", "gt"], dtype="bool")
    N("xor_", "xor", ["eq", "ge_i"], dtype="bool")
    N("not_", "not", ["and_"], dtype="bool")
    N("sel", "where", ["not_", "a", "b"])
    # Integer mod: divisor sign (Python), dividend sign (fmod), by zero, i64 broadcast.
    N("mod_", "mod", ["n", "k"], dtype="i32")
    N("fmod_", "mod", ["n", "k"], {"fmod": True}, dtype="i32")
    N("n64", "cast", ["n"], {"to": "i64"}, dtype="i64")
    N("mod64", "mod", ["big", "n64"], dtype="i64")
    # Rounding.
    N("fl", "floor", ["r"])
    N("ce", "ceil", ["r"])
    N("ro", "round", ["r"])
    # scatter_elements along the split-free axis 1 (rows stay with their batch) and along 0.
    N("sc", "scatter_elements", ["a", "si", "su"], {"axis": 1})
    N("sc_add", "scatter_elements", ["b", "sd", "su"], {"axis": 1, "reduction": "add"})
    N("sc_max", "scatter_elements", ["a", "sd", "su"], {"axis": 1, "reduction": "max"})
    N("k3", "slice", ["k"], {"starts": [0], "ends": [3], "axes": [1]}, dtype="i32")
    N("sc_mul", "scatter_elements", ["n", "sd", "k3"], {"axis": 1, "reduction": "mul"}, dtype="i32")
    # Along axis 0 the indices pick rows: a batch split cannot stay.
    N("su2", "slice", ["su"], {"starts": [1], "ends": [3], "axes": [0]})
    N("sc_0", "scatter_elements", ["a", "rows", "su2"], {"axis": 0, "reduction": "min"})
    g.outputs = [n["name"] for n in g.nodes]  # every node is an output

    def alt(d):
        d = f64(d)
        x, s, a, b, n, k = (d[v] for v in "x s a b n k".split())

        def im2col_conv(x, w, pads, strides, dil, groups, bias=None):
            sp = x.ndim - 2
            xp = np.pad(x, [(0, 0), (0, 0)] + [(pads[i], pads[sp + i]) for i in range(sp)])
            M, cg = w.shape[:2]
            mg = M // groups
            outs = []
            for gi in range(groups):
                xs = xp[:, gi * cg:(gi + 1) * cg]
                span = [(w.shape[2 + i] - 1) * dil[i] + 1 for i in range(sp)]
                win = np.lib.stride_tricks.sliding_window_view(xs, span, axis=tuple(range(2, 2 + sp)))
                sel = (Ellipsis,) + tuple(slice(None, None, dil[i]) for i in range(sp))
                win = win[sel]  # [N, cg, positions..., kernel...]
                win = win[(slice(None), slice(None)) + tuple(slice(None, None, strides[i]) for i in range(sp))]
                ws = w[gi * mg:(gi + 1) * mg]
                if sp == 2:
                    outs.append(np.einsum("ncyxij,mcij->nmyx", win, ws))
                else:
                    outs.append(np.einsum("ncyi,mci->nmy", win, ws))
            out = np.concatenate(outs, axis=1)
            return out if bias is None else out + bias.reshape((1, -1) + (1,) * sp)

        c1 = im2col_conv(x, d["w1"], [1, 1, 1, 1], [1, 1], [1, 1], 1, d["b1"])
        r1 = np.maximum(c1, 0)
        # max_pool by hand: -inf pads; ceil_mode's last window reaches one past the input, where
        # the second -inf pad stands in for "counts for nothing".
        rp = np.pad(r1, [(0, 0), (0, 0), (1, 1), (1, 1)], constant_values=-np.inf)
        mp = np.array([[[[rp[i, c, 2 * y:2 * y + 3, 2 * z:2 * z + 3].max() for z in range(5)] for y in range(5)]
                        for c in range(8)] for i in range(4)])
        py = n.astype(np.int64) % np.where(k == 0, 1, k)
        fm = np.fmod(n, np.where(k == 0, 1, k))
        su = d["su"]
        sc = a.copy()
        np.put_along_axis(sc, np.where(d["si"] < 0, d["si"] + 6, d["si"]), su, axis=1)
        sc_add = b.copy()
        for row in range(4):
            np.add.at(sc_add[row], np.where(d["sd"][row] < 0, d["sd"][row] + 6, d["sd"][row]), su[row])
        return {
            "c1": c1, "r1": r1,
            "dw": im2col_conv(r1, d["wd"], [1, 0, 1, 2], [2, 2], [1, 1], 8),
            "gc": im2col_conv(r1, d["wg"], [0, 0, 0, 0], [1, 2], [2, 2], 2),
            "c1d": im2col_conv(s, d["w1d"], [2, 0], [1], [2], 1),
            "mp": mp, "logits": mp.reshape(4, 200) @ d["wfc"],
            "gap": r1.mean(axis=(2, 3)),
            "mp1d": np.stack([s[:, :, 2 * j:2 * j + 3].max(-1) for j in range(4)], -1),
            "pd_c": np.pad(x[:, :, :, 1:], [(0, 0), (0, 0), (1, 2), (0, 1)], constant_values=0.5),
            "pd_i": np.pad(n[:, :5], [(0, 0), (2, 0)], constant_values=7),
            "eq": a == b, "lt": a < b, "gt": a > b, "ge_i": n >= k, "not_": ~((a <= b) & (n >= k)),
            "sel": np.where(~((a <= b) & (n >= k)), a, b),
            "mod_": np.where(k == 0, 0, py).astype(np.int32), "fmod_": np.where(k == 0, 0, fm).astype(np.int32),
            "fl": np.floor(d["r"]), "ce": np.ceil(d["r"]), "ro": np.round(d["r"]),
            "sc": sc, "sc_add": sc_add,
        }

    return g, alt


# --------------------------------------------------------------------------------------

README_TEXT = """\
# testdata

Generated by `python3 tools/gen_testdata.py` (numpy only; deterministic: running it again
gives byte-identical files). Do not edit the generated directories by hand; change the
script and re-run it. `bad/` (malformed inputs) is not generated by the script.

Each graph directory `NAME/` holds:

- `graph.json` — the graph (`meshc-graph/1`); param file paths are relative to it;
- `weights/` — params stored as `.npy` and, for some, `.safetensors` (with `key`);
- `inputs/<input>.npy` — one file per graph input;
- `expected/<output>.npy` — one file per graph output;
- `generate/` (decoder) — `prompt.npy` and `greedy.npy`, the ids numpy generates greedily from
  the prompt with this decode step, feeding one position a step from empty caches (what
  `meshc generate` must print; docs/generation.md);
- `layouts/<layout>.json` (mlp, transformer, cnn and decoder) — layout specs (`meshc-layout/1`,
  docs/layout.md), written by hand, not by the script: data parallel (`dp-2`, `dp-2x4`),
  Megatron-style model parallel (`mp-2x4`, `mp-4`, `mp-8`), a 2×2×2 mesh mixing both
  (`cube-2x2x2`) and a torus (`torus-2x4`); placements on stages (`stages-*`: explicit,
  with and without per-stage layouts; `design-2x4`, `embed-on-0`: stages sharing devices
  with the whole mesh) and pipelines with micro-batches (`pipeline-*`).
  Under each, the graph must still give `expected/` (tests/all/distributed.rs); what each
  costs in collectives is stated there, in transfers in tests/all/placement.rs.

Expected outputs are computed by a numpy reference interpreter in float64 from the
float32 data (so they are more accurate than f32 arithmetic), then cast to the output's
dtype. Compare element-wise:

    |got - want| <= 1e-5 + 1e-4 * |want|      (f32 outputs)
    got == want                               (i32, i64, bool outputs)

The script checks that an f32 evaluation of each graph meets this tolerance.

| graph | inputs | outputs | exercises |
|---|---|---|---|
{rows}

## onnx/

Small random-weight ONNX models written by `tools/gen_onnx_testdata.py` (`make
onnx-testdata`: a venv under target/ with onnx, onnxruntime and numpy), each in its folder:
`model.onnx`, `inputs/`, `expected/` (onnxruntime's outputs) and `dims.txt` (the `--dim`
bindings its symbolic dims need). `mlp` (Gemm with transB, Add with the bias first, Clip
with only a min, a final Identity), `encoder` (one BERT block with an attention mask, head
reshapes from Shape/Gather/Unsqueeze/Concat), `gpt2_block` (a causal mask from
Range/Trilu/Where), `resnet_block` and `mobilenet_block` (Conv, BatchNormalization, pools,
depthwise convs), `opset_v2` (the op set v2 imports), `half_weights` (f16/bf16
initializers), `shapes` (shape subgraphs and ONNX's semantic traps). tests/all/onnx.rs
checks them through import, interp, and run on 1 device and under `layouts/`.
"""

# --------------------------------------------------------------------------------------
# 7. decoder — one decode step of a tiny GPT-style language model with a KV cache.
# --------------------------------------------------------------------------------------

DEC = {"B": 2, "H": 4, "C": 16, "DH": 8, "V": 40, "FF": 64, "POS": 5}


def build_decoder():
    B, H, C, DH, V, FF, POS = (DEC[k] for k in ("B", "H", "C", "DH", "V", "FF", "POS"))
    D = H * DH
    rng = np.random.default_rng(1007)
    g = G("decoder")
    g.input("ids", rng.integers(0, V, size=(B, 1)).astype(np.int64), dims=["batch", None])
    g.input("pos", np.array([POS], np.int64))
    heads = ["batch", "heads", "ctx", "head_dim"]
    for n in ("k", "v"):
        cache = np.zeros((B, H, C, DH), np.float32)
        cache[:, :, :POS] = normal(rng, (B, H, POS, DH))
        g.input(n + "_cache", cache, dims=heads)
    w = 1 / math.sqrt(D)
    g.param_npy("wte", normal(rng, (V, D)), dims=["vocab", "embed"])
    g.param_npy("wpe", normal(rng, (C, D), 0.5), dims=["ctx", "embed"])
    for n in ("ln1", "ln2", "lnf"):
        g.param_npy(n + "_g", (1 + normal(rng, (D,), 0.1)).astype(np.float32), dims=["embed"])
        g.param_npy(n + "_b", normal(rng, (D,), 0.1), dims=["embed"])
    for n in ("q", "k", "v"):
        g.param_npy("w" + n, normal(rng, (D, D), w), dims=["embed", "qkv"])
    g.param_npy("wo", normal(rng, (D, D), w), dims=["qkv", "embed"])
    g.param_npy("w_ff1", normal(rng, (D, FF), w), dims=["embed", "hidden"])
    g.param_npy("w_ff2", normal(rng, (FF, D), 1 / math.sqrt(FF)), dims=["hidden", "embed"])
    g.param_npy("head", normal(rng, (D, V), w), dims=["embed", "vocab"])
    g.param_value("scale", 1 / math.sqrt(DH), "f32", [])
    g.param_value("slots", list(range(C)), "i64", [C], dims=["ctx"])
    g.param_value("neg", -1e9, "f32", [])
    g.param_value("zero", 0.0, "f32", [])

    g.node("tok", "gather", ["wte", "ids"], {"axis": 0}, shape=[B, 1, D])
    g.node("at", "dynamic_slice", ["wpe", "pos"], {"axes": [0], "sizes": [1]}, shape=[1, D])
    g.node("x", "add", ["tok", "at"])
    g.node("h", "layer_norm", ["x", "ln1_g", "ln1_b"])
    for n in ("q", "k", "v"):
        g.node(n, "matmul", ["h", "w" + n])
        g.node(n + "_r", "reshape", [n], {"shape": [B, 1, H, DH]})
        g.node(n + "_h", "transpose", [n + "_r"], {"perm": [0, 2, 1, 3]}, shape=[B, H, 1, DH])
    for n in ("k", "v"):
        g.node("next.%s_cache" % n, "dynamic_update_slice", [n + "_cache", n + "_h", "pos"], {"axes": [2]},
               shape=[B, H, C, DH], dims=heads, output=True)
    g.node("k_t", "transpose", ["next.k_cache"], {"perm": [0, 1, 3, 2]})
    g.node("scores", "matmul", ["q_h", "k_t"], shape=[B, H, 1, C])
    g.node("scaled", "mul", ["scores", "scale"])
    g.node("future", "greater", ["slots", "pos"], dtype="bool")
    g.node("mask", "where", ["future", "neg", "zero"], shape=[C])
    g.node("masked", "add", ["scaled", "mask"])
    g.node("probs", "softmax", ["masked"], {"axis": -1})
    g.node("ctx", "matmul", ["probs", "next.v_cache"], shape=[B, H, 1, DH])
    g.node("ctx_t", "transpose", ["ctx"], {"perm": [0, 2, 1, 3]})
    g.node("ctx_r", "reshape", ["ctx_t"], {"shape": [B, 1, D]})
    g.node("o", "matmul", ["ctx_r", "wo"])
    g.node("x2", "add", ["x", "o"])
    g.node("h2", "layer_norm", ["x2", "ln2_g", "ln2_b"])
    g.node("f1", "matmul", ["h2", "w_ff1"])
    g.node("f1_a", "gelu", ["f1"])
    g.node("f2", "matmul", ["f1_a", "w_ff2"])
    g.node("x3", "add", ["x2", "f2"])
    g.node("hf", "layer_norm", ["x3", "lnf_g", "lnf_b"])
    g.node("logits", "matmul", ["hf", "head"], shape=[B, 1, V], dtype="f32", output=True)

    def step(d, ids, pos, kc, vc):
        """One step in float64: the logits [B, V] and the caches with position pos written."""
        x = d["wte"][ids] + d["wpe"][pos]  # [B, D]
        h = np_layer_norm(x, d["ln1_g"], d["ln1_b"], 1, 1e-5)
        q, k, v = [(h @ d["w" + n]).reshape(B, H, DH) for n in "qkv"]
        kc, vc = kc.copy(), vc.copy()
        kc[:, :, pos], vc[:, :, pos] = k, v
        sc = np.einsum("bhd,bhcd->bhc", q, kc[:, :, :pos + 1]) * float(np.float32(1 / math.sqrt(DH)))
        ctx = np.einsum("bhc,bhcd->bhd", np_softmax(sc, -1), vc[:, :, :pos + 1]).reshape(B, D)
        x2 = x + ctx @ d["wo"]
        h2 = np_layer_norm(x2, d["ln2_g"], d["ln2_b"], 1, 1e-5)
        x3 = x2 + np_gelu(h2 @ d["w_ff1"]) @ d["w_ff2"]
        return np_layer_norm(x3, d["lnf_g"], d["lnf_b"], 1, 1e-5) @ d["head"], kc, vc

    def alt(d):
        d = f64(d)
        logits, kc, vc = step(d, d["ids"][:, 0], POS, d["k_cache"], d["v_cache"])
        return {"logits": logits[:, None], "next.k_cache": kc, "next.v_cache": vc}

    # Greedy generation from a prompt, fed one token a step from empty caches: what `meshc
    # generate` must print (tests/all/generate.rs). Each step's top logit leads the next
    # by a margin that f32 arithmetic cannot overturn.
    d = f64({**g.param_data})
    prompt = np.array([[3, 17, 29], [11, 0, 39]], np.int64)
    kc, vc = np.zeros((B, H, C, DH)), np.zeros((B, H, C, DH))
    out = []
    for pos in range(C):
        fed = prompt[:, pos] if pos < prompt.shape[1] else out[-1]
        logits, kc, vc = step(d, fed, pos, kc, vc)
        if pos + 1 >= prompt.shape[1]:
            top = np.sort(logits, axis=-1)
            assert np.all(top[:, -1] - top[:, -2] > 1e-3), (pos, top[:, -2:])
            out.append(np.argmax(logits, axis=-1))
    g.extra_files = {"generate/prompt.npy": prompt, "generate/greedy.npy": np.stack(out, 1)}
    return g, alt


DESCRIPTIONS = {
    "decoder": "one decode step of a GPT-style attention block with a KV cache: the new token's keys and values written into the caches at a run-time position (`dynamic_update_slice`, outputs `next.k_cache`/`next.v_cache`, so the caches are state a session keeps on the devices), a causal mask from that position, and the written row read back (`dynamic_slice`); named dims batch/heads/ctx",
    "mlp": "DESIGN §3's 2-layer ReLU MLP (small); w1 from .npy, w2 from a seeded `init` normal; named dims batch/embed/hidden",
    "gelu_mlp": "3-layer MLP with bias adds (broadcast), gelu `none` and `tanh`; `init` uniform and inline `value` params",
    "transformer": "BERT-style encoder block: embedding gather (table in .safetensors), positional add, layer_norm, 4-head self-attention with padding mask (-1e9), softmax, FFN with gelu, residuals; `init` ones/zeros/normal, scalar `value` param",
    "reductions": "reduce_sum/mean/max over various axes (negative, unsorted, empty list, all), keepdims, i32 reductions, softmax over a middle axis, layer_norm over the last 2 dims, variance and logsumexp by hand",
    "cnn": "op set v2: a small CNN (conv with bias and pads, relu, depthwise and grouped/dilated convs, max/avg pools with ceil_mode, dilations and count_include_pad, global average pool, flatten, matmul head), 1-D conv and pools, pad in every mode (and a crop), comparisons and logic to bool, where, integer mod (both signs, by zero, i64), floor/ceil/round (halves), scatter_elements with every reduction; every node is an output",
    "all_ops": "every non-communication op and attribute form: broadcasting, all casts, where, matmul with 1-D operands and broadcast batch dims, 4 einsums, slices with negative indices/steps, gathers with i32/i64, negative and scalar indices; every node is an output",
}


def sig(items):
    return ", ".join("`%s` %s%s" % (i["name"], i["dtype"], i["shape"]) for i in items)


def main():
    _check_init_generator()
    os.makedirs(TESTDATA, exist_ok=True)
    rows = []
    for build in (build_mlp, build_gelu_mlp, build_transformer, build_reductions, build_all_ops, build_cnn,
                  build_decoder):
        g, alt = build()
        graph, expected = emit(g, alt)
        outs = [{"name": o, "dtype": dtype_name(v) if v.dtype.kind != "f" else "f32", "shape": list(v.shape)}
                for o, v in expected.items()]
        outs_txt = sig(outs) if len(outs) <= 16 else "%d outputs (every node), incl. i32, i64 and bool" % len(outs)
        rows.append("| `%s` | %s | %s | %s |" % (g.name, sig(graph["inputs"]), outs_txt, DESCRIPTIONS[g.name]))
        n_files = sum(1 for p, _ in WRITTEN if p.startswith(os.path.join(TESTDATA, g.name) + os.sep))
        print("%-12s %3d nodes %3d outputs %3d files" % (g.name, len(graph["nodes"]), len(graph["outputs"]), n_files))
    write_file(os.path.join(TESTDATA, "README.md"), README_TEXT.replace("{rows}", "\n".join(rows)).encode())
    total = sum(n for _, n in WRITTEN)
    print("wrote %d files, %d bytes (%.1f KiB) under %s" % (len(WRITTEN), total, total / 1024,
                                                          os.path.relpath(TESTDATA)))


if __name__ == "__main__":
    sys.exit(main())
