#!/usr/bin/env python3
"""Random valid ONNX models run by onnxruntime and by meshc, compared: the differential
fuzzer of the ONNX frontend (`make fuzz`, ONNX_FUZZ_CASES).

    python3 tools/onnx_fuzz.py target/release/meshc [--cases N] [--seed S] [--keep DIR] [--verbose]

Case k draws its model from the seed S + k (the same case again: --seed S+k --cases 1): a
few float inputs, then a chain of nodes of the ops meshc imports (elementwise, MatMul and
Gemm, reductions, Reshape, Transpose, Slice, Concat, Gather, Softmax and LogSoftmax,
LayerNormalization, Conv and pools at small sizes, GridSample, TopK, DFT, LRN, Cast, Identity and Expand no-ops, If
on a fact of the shapes, Loop with a constant trip count, Scan, LSTM/GRU/RNN, quantization:
QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear, MatMulInteger, QLinearMatMul, ConvInteger,
QLinearConv), each reading
values made before it; one to three outputs, among them values later nodes also read and graph
inputs. onnxruntime's outputs are the reference; `meshc run` (import, compile, run) and
`meshc interp` must give them within a tolerance. A model meshc refuses in one line (exit 1) counts as refused; a crash, a hang
or a wrong result is a failure, whose model and inputs are kept (under
target/onnx-fuzz-failures/ unless --keep says) and which makes the run exit 1.
"""

import argparse
import os
import shutil
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from onnx_conformance import compare, run_meshc  # noqa: E402

RTOL, ATOL = 1e-3, 1e-4


class Model:
    """The model being drawn: its nodes, initializers and the values they make. A value is
    (name, shape, dtype, tame): tame when finite and small enough to cast to an integer."""

    def __init__(self, rng, opset):
        self.rng, self.opset = rng, opset
        self.nodes, self.inits, self.values = [], [], []
        self.count = 0

    def name(self, prefix="v"):
        self.count += 1
        return f"{prefix}{self.count}"

    def init(self, array):
        from onnx import numpy_helper

        n = self.name("c")
        self.inits.append(numpy_helper.from_array(np.asarray(array), n))
        return n

    def weight(self, shape):
        return self.init(self.rng.uniform(-1, 1, shape).astype(np.float32))

    def node(self, op, inputs, shape, dtype=np.float32, tame=True, **attrs):
        from onnx import helper

        out = self.name()
        self.nodes.append(helper.make_node(op, inputs, [out], **attrs))
        self.values.append((out, tuple(shape), dtype, tame))
        return out

    def pick(self, pred=lambda v: True):
        """A value made so far (later ones more often), or None."""
        vs = [v for v in self.values if pred(v)]
        if not vs:
            return None
        w = np.arange(1, len(vs) + 1, dtype=np.float64)
        return vs[self.rng.choice(len(vs), p=w / w.sum())]

    def pick_axis(self):
        """A value of rank 1 or more and one of its axes, or (None, None)."""
        a = self.pick(lambda v: len(v[1]) >= 1)
        if a is None:
            return None, None
        return a, int(self.rng.integers(len(a[1])))


def floats(v):
    return v[2] == np.float32


def broadcast_partner(m, shape):
    """A shape that broadcasts with `shape`: the same, a suffix of it, or with dims set to 1."""
    r = m.rng.integers(3)
    if r == 0 or not shape:
        return shape
    if r == 1:
        return shape[m.rng.integers(len(shape) + 1) :]
    return tuple(1 if m.rng.random() < 0.5 else d for d in shape)


def g_unary(m):
    v = m.pick(floats)
    ops = {"Relu": True, "Sigmoid": True, "Tanh": True, "Neg": True, "Abs": True, "Floor": True, "Ceil": True,
           "Exp": False, "Log": False, "Sqrt": False, "Erf": True, "Softplus": False, "Reciprocal": False}
    # Floor and Ceil only on tame values: on others a rounding difference far below the
    # tolerance can cross an integer (onnxruntime's GRU gives 1.0000005 where meshc's gives
    # 1, and their floors differ by 1).
    names = [op for op in ops if v[3] or op not in ("Floor", "Ceil")]
    op = names[m.rng.integers(len(names))]
    return m.node(op, [v[0]], v[1], tame=v[3] and ops[op])


def g_binary(m):
    a = m.pick(floats)
    op = ["Add", "Sub", "Mul", "Div", "Max", "Min"][m.rng.integers(6)]
    partner = broadcast_partner(m, a[1])
    b = m.pick(lambda v: floats(v) and v[1] == partner)
    b_name, b_tame = (b[0], b[3]) if b is not None else (m.weight(partner), True)
    args = [a[0], b_name] if m.rng.random() < 0.5 else [b_name, a[0]]
    return m.node(op, args, np.broadcast_shapes(a[1], partner), tame=a[3] and b_tame and op in ("Add", "Sub", "Max", "Min"))


def g_matmul(m):
    a = m.pick(lambda v: floats(v) and len(v[1]) >= 1)
    if a is None:
        return None
    k, n = a[1][-1], int(m.rng.integers(1, 6))
    if m.rng.random() < 0.5 and len(a[1]) == 2:
        trans_b = int(m.rng.integers(2))
        w = m.weight((n, k) if trans_b else (k, n))
        bias = [m.weight((n,))] if m.rng.random() < 0.7 else []
        alpha, beta = float(m.rng.choice([1.0, 0.5])), float(m.rng.choice([1.0, 2.0]))
        return m.node("Gemm", [a[0], w, *bias], (a[1][0], n), tame=False, transB=trans_b, alpha=alpha, beta=beta)
    out = a[1][:-1] + (n,) if len(a[1]) > 1 else (n,)
    return m.node("MatMul", [a[0], m.weight((k, n))], out, tame=False)


def g_reduce(m):
    a = m.pick(lambda v: floats(v) and len(v[1]) >= 1)
    if a is None:
        return None
    op = ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin"][m.rng.integers(4)]
    r = len(a[1])
    axes = sorted({int(x) for x in m.rng.integers(0, r, m.rng.integers(1, r + 1))})
    keep = int(m.rng.integers(2))
    shape = tuple(1 if i in axes else d for i, d in enumerate(a[1]) if keep or i not in axes)
    spelled = [x - r if m.rng.random() < 0.3 else x for x in axes]
    if op == "ReduceSum" or m.opset >= 18:
        return m.node(op, [a[0], m.init(np.array(spelled, np.int64))], shape, tame=a[3], keepdims=keep)
    return m.node(op, [a[0]], shape, tame=a[3], axes=spelled, keepdims=keep)


def g_reshape(m):
    a = m.pick()
    n = int(np.prod(a[1], dtype=np.int64))
    shape, rest = [], n
    for _ in range(m.rng.integers(0, 4)):
        divs = [d for d in range(1, rest + 1) if rest % d == 0]
        d = int(m.rng.choice(divs))
        shape.append(d)
        rest //= d
    shape.append(rest)
    spelled = list(shape)
    if m.rng.random() < 0.3:
        spelled[m.rng.integers(len(spelled))] = -1
    return m.node("Reshape", [a[0], m.init(np.array(spelled, np.int64))], shape, a[2], a[3])


def g_transpose(m):
    a = m.pick(lambda v: len(v[1]) >= 2)
    if a is None:
        return None
    perm = [int(p) for p in m.rng.permutation(len(a[1]))]
    return m.node("Transpose", [a[0]], tuple(a[1][p] for p in perm), a[2], a[3], perm=perm)


def slice_len(d, start, end, step):
    """The length ONNX's Slice gives (its clamping differs from Python's for a negative step:
    a start before the first element starts there)."""
    start, end = start + d if start < 0 else start, end + d if end < 0 else end
    if step > 0:
        start, end = min(max(start, 0), d), min(max(end, 0), d)
    else:
        start, end = min(max(start, 0), d - 1), min(max(end, -1), d - 1)
    return max(0, -(-(end - start) // step))


def g_slice(m):
    a, axis = m.pick_axis()
    if a is None:
        return None
    d = a[1][axis]
    step = int(m.rng.choice([1, 1, 2, -1, -2]))
    start, end = (int(x) for x in m.rng.integers(-d - 2, d + 3, 2))
    shape = list(a[1])
    shape[axis] = slice_len(d, start, end, step)
    if shape[axis] == 0:
        return None
    ins = [a[0]] + [m.init(np.array([x], np.int64)) for x in (start, end, axis)] + [m.init(np.array([step], np.int64))]
    return m.node("Slice", ins, shape, a[2], a[3])


def g_concat(m):
    a, axis = m.pick_axis()
    if a is None:
        return None
    fits = lambda v: v[2] == a[2] and len(v[1]) == len(a[1]) and all(  # noqa: E731
        x == y for i, (x, y) in enumerate(zip(v[1], a[1])) if i != axis
    )
    b = m.pick(fits)
    shape = list(a[1])
    shape[axis] += b[1][axis]
    spelled = axis - len(shape) if m.rng.random() < 0.3 else axis
    return m.node("Concat", [a[0], b[0]], shape, a[2], a[3] and b[3], axis=spelled)


def g_gather(m):
    a, axis = m.pick_axis()
    if a is None:
        return None
    d = a[1][axis]
    ishape = tuple(int(x) for x in m.rng.integers(1, 4, m.rng.integers(0, 3)))
    idx = m.rng.integers(-d, d, ishape).astype(np.int64)
    shape = a[1][:axis] + ishape + a[1][axis + 1 :]
    return m.node("Gather", [a[0], m.init(idx)], shape, a[2], a[3], axis=axis)


def g_softmax(m):
    a = m.pick(lambda v: floats(v) and len(v[1]) >= 1)
    if a is None:
        return None
    op = "Softmax" if m.rng.random() < 0.6 else "LogSoftmax"
    axis = int(m.rng.integers(-len(a[1]), len(a[1])))
    return m.node(op, [a[0]], a[1], tame=op == "Softmax", axis=axis)


def g_layernorm(m):
    a = m.pick(lambda v: floats(v) and len(v[1]) >= 1)
    if a is None:
        return None
    axis = int(m.rng.integers(-len(a[1]), len(a[1])))
    norm = a[1][axis:]
    ins = [a[0], m.weight(norm)] + ([m.weight(norm)] if m.rng.random() < 0.6 else [])
    return m.node("LayerNormalization", ins, a[1], tame=False, axis=axis, epsilon=1e-5)


def conv_out(d, k, pad, stride, dil):
    return (d + pad - dil * (k - 1) - 1) // stride + 1


def g_conv(m):
    a = m.pick(lambda v: floats(v) and len(v[1]) in (3, 4) and min(v[1][2:]) >= 1)
    if a is None:
        return None
    n, c, *spatial = a[1]
    op = ["Conv", "MaxPool", "AveragePool"][m.rng.integers(3)]
    ks = [int(m.rng.integers(1, min(3, s) + 1)) for s in spatial]
    pads = [int(m.rng.integers(0, k)) for k in ks] * 2
    strides = [int(m.rng.integers(1, 3)) for _ in ks]
    if op == "Conv":
        group = c if c > 1 and m.rng.random() < 0.3 else 1
        cout = group * int(m.rng.integers(1, 3)) if group > 1 else int(m.rng.integers(1, 5))
        dil = [int(m.rng.integers(1, 3)) if s >= 2 * k else 1 for s, k in zip(spatial, ks)]
        out = [conv_out(s, k, pads[i] + pads[i + len(ks)], st, dl) for i, (s, k, st, dl) in enumerate(zip(spatial, ks, strides, dil))]
        if min(out) < 1:
            return None
        ins = [a[0], m.weight((cout, c // group, *ks))] + ([m.weight((cout,))] if m.rng.random() < 0.5 else [])
        return m.node("Conv", ins, (n, cout, *out), tame=False, kernel_shape=ks, pads=pads, strides=strides,
                      dilations=dil, group=group)
    out = [conv_out(s, k, pads[i] + pads[i + len(ks)], st, 1) for i, (s, k, st) in enumerate(zip(spatial, ks, strides))]
    if min(out) < 1:
        return None
    attrs = {"kernel_shape": ks, "pads": pads, "strides": strides}
    if op == "AveragePool":
        attrs["count_include_pad"] = int(m.rng.integers(2))
    return m.node(op, [a[0]], (n, c, *out), tame=a[3], **attrs)


def g_cast(m):
    from onnx import TensorProto

    a = m.pick(lambda v: v[3])
    if a is None:
        return None
    to = [(TensorProto.FLOAT, np.float32), (TensorProto.INT64, np.int64), (TensorProto.INT32, np.int32)][m.rng.integers(3)]
    return m.node("Cast", [a[0]], a[1], to[1], a[3], to=to[0])


def g_noop(m):
    a = m.pick()
    if m.rng.random() < 0.5:
        return m.node("Identity", [a[0]], a[1], a[2], a[3])
    shape = a[1]
    if m.rng.random() < 0.5:
        shape = tuple(int(x) for x in m.rng.integers(1, 3, m.rng.integers(0, 2))) + shape
    return m.node("Expand", [a[0], m.init(np.array(shape, np.int64))], shape, a[2], a[3])


def g_where(m):
    a = m.pick(floats)
    b = m.pick(lambda v: floats(v) and v[1] == broadcast_partner(m, a[1]))
    b = b or a
    op = ["Greater", "Less", "Equal", "GreaterOrEqual"][m.rng.integers(4)]
    shape = np.broadcast_shapes(a[1], b[1])
    cond = m.node(op, [a[0], b[0]], shape, np.bool_, True)
    return m.node("Where", [cond, b[0], a[0]], shape, tame=a[3] and b[3])


def g_pad(m):
    a = m.pick(lambda v: floats(v) and len(v[1]) >= 1)
    if a is None:
        return None
    mode = ["constant", "reflect", "edge"][m.rng.integers(3)]
    limit = [d - 1 if mode == "reflect" else 2 for d in a[1]] * 2
    pads = [int(m.rng.integers(0, min(x, 2) + 1)) for x in limit]
    r = len(a[1])
    shape = tuple(d + pads[i] + pads[i + r] for i, d in enumerate(a[1]))
    ins = [a[0], m.init(np.array(pads, np.int64))] + ([m.init(np.float32(1.5))] if mode == "constant" else [])
    return m.node("Pad", ins, shape, tame=a[3], mode=mode)


def g_grid_sample(m):
    """GridSample (opset 16: 2-D, bilinear/bicubic) at a grid that reaches past the input.
    Not bicubic with border padding: there onnxruntime clamps each tap, where ONNX's
    reference (and meshc) clamp the coordinate first."""
    a = m.pick(lambda v: floats(v) and len(v[1]) == 4)
    if a is None or m.opset < 16:
        return None
    mode = ["bilinear", "nearest", "bicubic"][m.rng.integers(3)]
    pads = ["zeros", "reflection"] if mode == "bicubic" else ["zeros", "border", "reflection"]
    padding = pads[m.rng.integers(len(pads))]
    out = tuple(int(x) for x in m.rng.integers(1, 4, 2))
    grid = m.init(m.rng.uniform(-1.5, 1.5, (a[1][0], *out, 2)).astype(np.float32))
    return m.node("GridSample", [a[0], grid], (a[1][0], a[1][1], *out), tame=a[3], mode=mode, padding_mode=padding,
                  align_corners=int(m.rng.integers(2)))


def g_top_k(m):
    """TopK along an axis, both outputs; only of tame values (NaN's place differs between
    onnxruntime and ONNX's reference, which meshc follows)."""
    from onnx import helper

    a = m.pick(lambda v: floats(v) and v[3] and len(v[1]) >= 1)
    if a is None:
        return None
    axis = int(m.rng.integers(len(a[1])))
    k = int(m.rng.integers(1, a[1][axis] + 1))
    shape = tuple(k if i == axis else d for i, d in enumerate(a[1]))
    values, indices = m.name(), m.name()
    m.nodes.append(helper.make_node("TopK", [a[0], m.init(np.array([k], np.int64))], [values, indices], axis=axis,
                                    largest=int(m.rng.integers(2))))
    m.values.append((values, shape, np.float32, True))
    m.values.append((indices, shape, np.int64, True))
    return values


def g_dft(m):
    """A forward DFT (opset 17+) of a real signal: a value with a dim of 1 appended."""
    a = m.pick(lambda v: floats(v) and v[3] and len(v[1]) >= 1)
    if a is None or m.opset < 17:
        return None
    real = m.node("Unsqueeze", [a[0], m.init(np.array([-1], np.int64))], (*a[1], 1), tame=True)
    axis = int(m.rng.integers(len(a[1])))
    onesided = int(m.rng.integers(2))
    n = a[1][axis] // 2 + 1 if onesided else a[1][axis]
    shape = tuple(n if i == axis else d for i, d in enumerate(a[1])) + (2,)
    return m.node("DFT", [real], shape, tame=False, axis=axis, onesided=onesided)


def g_lrn(m):
    """LRN of a 4-D value with an odd size (onnxruntime's CPU kernel takes no other)."""
    a = m.pick(lambda v: floats(v) and len(v[1]) == 4)
    if a is None:
        return None
    return m.node("LRN", [a[0]], a[1], tame=a[3], size=int(m.rng.choice([1, 3, 5])), alpha=float(m.rng.uniform(1e-4, 1.0)),
                  beta=float(m.rng.uniform(0.5, 1.0)), bias=float(m.rng.uniform(1.0, 2.0)))


def g_int_arith(m):
    """Integer arithmetic on a cast value, with operands past f32's exact integers."""
    a = m.pick(lambda v: v[2] in (np.int64, np.int32))
    if a is None:
        return None
    big = 1 << 40 if a[2] == np.int64 else 1 << 26
    op = ["Add", "Sub", "Mul", "Div"][m.rng.integers(4)]
    c = m.rng.integers(1, 7, a[1]) * m.rng.choice([1, -1], a[1])
    if op in ("Add", "Sub"):
        c = c + big
    return m.node(op, [a[0], m.init(c.astype(a[2]))], a[1], a[2], False)


def g_if(m):
    """An If whose branches apply different unary ops to a value, on a fact of the value's
    static shape (its size along an axis, equal or not to a probe: meshc imports the taken
    branch alone) or on its data (whether it sums above a threshold: meshc imports both and
    selects at run time)."""
    from onnx import TensorProto, helper

    a = m.pick(lambda v: floats(v) and len(v[1]) >= 1)
    if a is None:
        return None
    cond = m.name("c")
    if m.rng.random() < 0.5:
        axis = int(m.rng.integers(len(a[1])))
        probe = a[1][axis] + int(m.rng.integers(0, 2))
        shape, size = m.name("s"), m.name("g")
        m.nodes += [
            helper.make_node("Shape", [a[0]], [shape]),
            helper.make_node("Gather", [shape, m.init(np.int64(axis))], [size], axis=0),
            helper.make_node("Equal", [size, m.init(np.int64(probe))], [cond]),
        ]
    else:
        total = m.name("t")
        m.nodes += [
            helper.make_node("ReduceSum", [a[0]], [total], keepdims=0),
            helper.make_node("Greater", [total, m.init(np.float32(m.rng.normal()))], [cond]),
        ]

    def branch():
        out = m.name("b")
        op = ["Relu", "Neg", "Abs", "Floor" if a[3] else "Sigmoid"][m.rng.integers(4)]
        body = [helper.make_node(op, [a[0]], [out])]
        return helper.make_graph(body, m.name("branch"), [], [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)])

    return m.node("If", [cond], a[1], tame=a[3], then_branch=branch(), else_branch=branch())


def g_loop(m):
    """A Loop of 1 to 4 trips carrying a value through Tanh and an Add of a value of the graph
    around it (a body reads the enclosing graph by name); its body's condition ends it after
    the iteration numbered by a constant, or never (meshc unrolls it to those iterations),
    or once the carried value's largest element passes a threshold (meshc unrolls every
    trip and keeps each iteration's value while the condition holds, at run time)."""
    from onnx import TensorProto, helper

    a = m.pick(floats)
    b = m.pick(lambda v: floats(v) and v[1] == a[1])
    i, c, h, t, u, co = (m.name(p) for p in ("i", "c", "h", "t", "u", "co"))
    more = []
    pick = m.rng.random()
    if pick < 0.35:
        ends = helper.make_node("Less", [i, m.init(np.int64(m.rng.integers(0, 4)))], [co])
    elif pick < 0.7:
        ends = helper.make_node("Identity", [c], [co])
    else:
        top = m.name("top")
        more = [helper.make_node("ReduceMax", [u], [top], keepdims=0)]
        ends = helper.make_node("Less", [top, m.init(np.float32(m.rng.uniform(-1, 3)))], [co])
    body = helper.make_graph(
        [helper.make_node("Tanh", [h], [t]), helper.make_node("Add", [t, a[0]], [u])] + more + [ends],
        m.name("body"),
        [helper.make_tensor_value_info(i, TensorProto.INT64, []),
         helper.make_tensor_value_info(c, TensorProto.BOOL, []),
         helper.make_tensor_value_info(h, TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info(co, TensorProto.BOOL, []),
         helper.make_tensor_value_info(u, TensorProto.FLOAT, None)],
    )
    trips = m.init(np.int64(m.rng.integers(1, 5)))
    return m.node("Loop", [trips, "", b[0]], a[1], tame=a[3], body=body)


def g_scan(m):
    """A Scan over one axis of a value (forward or backward), its body a Tanh of each slice,
    the slices stacked back along an axis (forward or in reverse): meshc unrolls it."""
    from onnx import TensorProto, helper

    a = m.pick(lambda v: floats(v) and len(v[1]) >= 1)
    if a is None:
        return None
    rank = len(a[1])
    axis_in, axis_out = int(m.rng.integers(rank)), int(m.rng.integers(rank))
    dir_in, dir_out = int(m.rng.integers(2)), int(m.rng.integers(2))
    x_t, y_t = m.name("sx"), m.name("sy")
    rest = a[1][:axis_in] + a[1][axis_in + 1:]
    # (onnxruntime wants the body's output shapes.)
    body = helper.make_graph(
        [helper.make_node("Tanh", [x_t], [y_t])], m.name("body"),
        [helper.make_tensor_value_info(x_t, TensorProto.FLOAT, rest)],
        [helper.make_tensor_value_info(y_t, TensorProto.FLOAT, rest)],
    )
    shape = rest[:axis_out] + (a[1][axis_in],) + rest[axis_out:]
    return m.node("Scan", [a[0]], shape, body=body, num_scan_inputs=1, scan_input_axes=[axis_in],
                  scan_input_directions=[dir_in], scan_output_axes=[axis_out], scan_output_directions=[dir_out])


def g_recurrent(m):
    """An LSTM, GRU or RNN over a rank-3 value read as [seq, batch, input]: any direction,
    with or without biases, sequence lengths (0 included), initial state, linear_before_reset
    and clip; Y the value made."""
    a = m.pick(lambda v: floats(v) and len(v[1]) == 3)
    if a is None:
        return None
    seq, batch, width = a[1]
    op = ["LSTM", "GRU", "RNN"][m.rng.integers(3)]
    gates = {"LSTM": 4, "GRU": 3, "RNN": 1}[op]
    direction = ["forward", "reverse", "bidirectional"][m.rng.integers(3)]
    dirs, hidden = 1 + (direction == "bidirectional"), int(m.rng.integers(1, 5))
    ins = [a[0], m.weight((dirs, gates * hidden, width)), m.weight((dirs, gates * hidden, hidden))]
    ins.append(m.weight((dirs, 2 * gates * hidden)) if m.rng.random() < 0.7 else "")
    lens = m.rng.integers(0, seq + 1, batch).astype(np.int32)
    ins.append(m.init(lens) if m.rng.random() < 0.4 else "")
    ins.append(m.weight((dirs, batch, hidden)) if m.rng.random() < 0.5 else "")
    attrs = {"direction": direction, "hidden_size": hidden}
    if op == "GRU" and m.rng.random() < 0.5:
        attrs["linear_before_reset"] = 1
    if m.rng.random() < 0.3:
        attrs["clip"] = float(m.rng.choice([0.5, 2.0]))
    while ins[-1] == "":
        ins.pop()
    return m.node(op, ins, (seq, dirs, batch, hidden), tame=False, **attrs)


def g_quantize(m):
    """Quantization of a graph input: QuantizeLinear (per tensor or, from opset 13, per axis;
    to uint8 or int8) and DequantizeLinear back, or DynamicQuantizeLinear and then
    DequantizeLinear, a MatMulInteger with an int8 weight, a QLinearMatMul, a ConvInteger or a
    QLinearConv (of a 4-D input; else a matmul). Only of inputs:
    a value computed before may differ from onnxruntime's by a rounding, which quantizing can
    turn into a whole step."""
    from onnx import helper

    kind = m.rng.integers(6)
    inputs = lambda v: floats(v) and v[0].startswith("x")  # noqa: E731
    a = (kind >= 4 and m.pick(lambda v: inputs(v) and len(v[1]) == 4)) or m.pick(inputs)
    if a is None:
        return None
    if kind == 0:
        qt = [np.uint8, np.int8][m.rng.integers(2)]
        info = np.iinfo(qt)
        per_axis = m.opset >= 13 and len(a[1]) >= 1 and m.rng.random() < 0.5
        axis = int(m.rng.integers(len(a[1]))) if per_axis else 1
        shape = (a[1][axis],) if per_axis else ()
        scale = m.init(m.rng.uniform(0.005, 0.1, shape).astype(np.float32))
        zp = m.init(m.rng.integers(info.min, info.max + 1, shape).astype(qt))
        attrs = {"axis": axis} if per_axis else {}
        q = m.node("QuantizeLinear", [a[0], scale, zp], a[1], qt, True, **attrs)
        return m.node("DequantizeLinear", [q, scale, zp], a[1], **attrs)
    q, scale, zp = m.name("q"), m.name("scale"), m.name("zp")
    m.nodes.append(helper.make_node("DynamicQuantizeLinear", [a[0]], [q, scale, zp]))
    m.values += [(q, a[1], np.uint8, True), (scale, (), np.float32, True), (zp, (), np.uint8, True)]
    if kind == 1 or not a[1]:
        return m.node("DequantizeLinear", [q, scale, zp], a[1])
    if kind >= 4 and len(a[1]) == 4:
        n, c, h, w_ = a[1]
        kh, kw, mo = int(m.rng.integers(1, min(h, 3) + 1)), int(m.rng.integers(1, min(w_, 3) + 1)), int(m.rng.integers(1, 4))
        out = (n, mo, h - kh + 1, w_ - kw + 1)
        if kind == 4:
            w = m.init(m.rng.integers(0, 256, (mo, c, kh, kw)).astype(np.uint8))
            return m.node("ConvInteger", [q, w, zp, m.init(np.uint8(m.rng.integers(0, 256)))], out, np.int32, True)
        w = m.init(m.rng.integers(-127, 128, (mo, c, kh, kw)).astype(np.int8))
        ws = m.init(m.rng.uniform(0.001, 0.01, mo).astype(np.float32))
        ys, yzp = m.init(np.float32(m.rng.uniform(0.01, 1))), m.init(np.uint8(m.rng.integers(0, 256)))
        bias = m.init(m.rng.integers(-1000, 1000, mo).astype(np.int32))
        return m.node("QLinearConv", [q, scale, zp, w, ws, m.init(np.int8(0)), ys, yzp, bias], out, np.uint8, True)
    k, n = a[1][-1], int(m.rng.integers(1, 6))
    w = m.init(m.rng.integers(-127, 128, (k, n)).astype(np.int8))
    wzp = m.init(np.int8(m.rng.integers(-3, 4)))
    out = a[1][:-1] + (n,) if len(a[1]) > 1 else (n,)
    if kind % 2 == 0:
        return m.node("MatMulInteger", [q, w, zp, wzp], out, np.int32, True)
    ws, ys = m.init(np.float32(m.rng.uniform(0.001, 0.01))), m.init(np.float32(m.rng.uniform(0.01, 1)))
    yzp = m.init(np.uint8(m.rng.integers(0, 256)))
    return m.node("QLinearMatMul", [q, scale, zp, w, ws, wzp, ys, yzp], out, np.uint8, True)


QUANT_OPS = {"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "MatMulInteger", "QLinearMatMul",
             "ConvInteger", "QLinearConv"}

GENERATORS = [g_unary, g_binary, g_binary, g_matmul, g_reduce, g_reshape, g_transpose, g_slice, g_concat, g_gather,
              g_softmax, g_layernorm, g_conv, g_cast, g_noop, g_where, g_pad, g_grid_sample, g_top_k, g_dft, g_lrn, g_int_arith, g_if, g_loop,
              g_scan, g_recurrent, g_quantize]


def draw(seed):
    """Case `seed`: the model and its inputs by name."""
    from onnx import TensorProto, helper

    rng = np.random.default_rng(seed)
    m = Model(rng, int(rng.choice([13, 17, 18])))
    inputs = {}
    for i in range(rng.integers(1, 4)):
        shape = tuple(int(x) for x in rng.integers(1, 6, rng.integers(1, 5)))
        name = f"x{i}"
        # Now and then large values: Softplus, LogSoftmax and the like overflow there.
        scale = float(rng.choice([1, 1, 1, 100, 1000]))
        inputs[name] = (rng.uniform(-3, 3, shape) * scale).astype(np.float32)
        m.values.append((name, shape, np.float32, True))
    gens = [g for g in GENERATORS if m.opset >= 17 or g is not g_layernorm]
    made, want = 0, rng.integers(2, 14)
    for _ in range(200):
        if made >= want:
            break
        if gens[rng.integers(len(gens))](m) is not None:
            made += 1
    # Outputs: the last value, and maybe others (intermediates later nodes read, inputs).
    outs = [m.values[-1]] + [m.values[i] for i in rng.integers(0, len(m.values), rng.integers(0, 3))]
    outs = list({v[0]: v for v in outs}.values())
    elem = {np.float32: TensorProto.FLOAT, np.int64: TensorProto.INT64, np.int32: TensorProto.INT32, np.bool_: TensorProto.BOOL,
            np.uint8: TensorProto.UINT8, np.int8: TensorProto.INT8}
    graph = helper.make_graph(
        m.nodes,
        f"fuzz{seed}",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, v.shape) for n, v in inputs.items()],
        [helper.make_tensor_value_info(v[0], elem[v[2]], v[1]) for v in outs],
        m.inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", m.opset)])
    model.ir_version = 8
    return model, inputs


def run_case(meshc, seed, case_dir):
    """(verdict, detail): pass, refused (meshc, or onnxruntime: a model this generator
    got wrong), or wrong/crash."""
    import onnx
    import onnxruntime as ort

    model, inputs = draw(seed)
    os.makedirs(case_dir, exist_ok=True)
    path = os.path.join(case_dir, "model.onnx")
    onnx.save(model, path)
    try:
        onnx.checker.check_model(model, full_check=True)
        # onnxruntime's graph optimizations rewrite quantization (QDQ pairs fused into QLinear
        # ops, transposes pushed through DequantizeLinear: one of those aborts the process on
        # a DequantizeLinear feeding a Transpose a Loop reads, seed 454): such a model is run
        # as its nodes say.
        so = ort.SessionOptions()
        if any(n.op_type in QUANT_OPS for n in model.graph.node):
            so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        out_names = [o.name for o in model.graph.output]
        expected = sess.run(out_names, inputs)
    except Exception as e:  # noqa: BLE001 -- the generator's own mistake, not meshc's
        return "invalid", f"onnx/onnxruntime refuse the model: {str(e).splitlines()[0][:200]}"
    # Rounding in f32 is relative to the operands' size, which a result near zero (a sum
    # that cancels) does not show: the absolute tolerance grows with the largest value.
    finite = [np.abs(e[np.isfinite(e)]).max(initial=0) for e in expected if e.dtype.kind == "f"]
    atol = ATOL * max([1.0, *finite])
    flags = []
    for name, value in inputs.items():
        np.save(os.path.join(case_dir, f"{name}.npy"), value)
        flags += ["--input", f"{name}={name}.npy"]
    for cmd in ("run", "interp"):
        out_dir = os.path.join(case_dir, f"out_{cmd}")
        shutil.rmtree(out_dir, ignore_errors=True)
        kind, why = run_meshc([meshc, cmd, "model.onnx", *flags, "--output-dir", out_dir], case_dir)
        if kind != "ok":
            return kind, f"{cmd}: {why}"
        diff = compare(out_dir, out_names, expected, RTOL, atol)
        if diff:
            return diff[0], f"{cmd}: {diff[1]}"
    return "pass", ""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("meshc")
    ap.add_argument("--cases", type=int, default=int(os.environ.get("ONNX_FUZZ_CASES", "300")))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--keep", help="keep every case here (default: only failures, under target/onnx-fuzz-failures)")
    ap.add_argument("--verbose", action="store_true", help="print every case not passing, with why")
    args = ap.parse_args()
    meshc = os.path.abspath(args.meshc)
    failures_dir = args.keep or os.path.abspath("target/onnx-fuzz-failures")
    root = args.keep or tempfile.mkdtemp(prefix="meshc-onnx-fuzz-")
    counts = {"pass": 0, "refused": 0, "invalid": 0, "wrong": 0, "crash": 0}
    try:
        for seed in range(args.seed, args.seed + args.cases):
            case_dir = os.path.join(root, f"case{seed}")
            verdict, detail = run_case(meshc, seed, case_dir)
            counts[verdict] += 1
            if verdict in ("wrong", "crash"):
                kept = os.path.join(failures_dir, f"case{seed}")
                if not args.keep:
                    shutil.rmtree(kept, ignore_errors=True)
                    shutil.copytree(case_dir, kept)
                print(f"{verdict} case {seed} (kept in {kept}): {detail}", flush=True)
            elif args.verbose and verdict != "pass":
                print(f"{verdict} case {seed}: {detail}", flush=True)
            if not args.keep:
                shutil.rmtree(case_dir, ignore_errors=True)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    print(
        f"random ONNX models vs onnxruntime: {args.cases} cases (seeds {args.seed}..{args.seed + args.cases - 1}); "
        + ", ".join(f"{v} {k}" for k, v in counts.items())
    )
    sys.exit(1 if counts["wrong"] or counts["crash"] else 0)


if __name__ == "__main__":
    main()
