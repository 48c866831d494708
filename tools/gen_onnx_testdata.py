#!/usr/bin/env python3
"""Writes testdata/onnx/: small random-weight ONNX models built with onnx.helper, the way
exporters (torch.onnx at opset 17) write them, with inputs and onnxruntime's outputs.

Each model goes to testdata/onnx/NAME/: model.onnx, inputs/INPUT.npy, expected/OUTPUT.npy,
dims.txt (the `--dim NAME=N` arguments its symbolic dims need) and, for a model whose input
dims `--dim` cannot bind, input_shapes.txt (its `--input-shape NAME=D0xD1x...` arguments). tests/all/onnx.rs checks
them through `meshc import`, `interp`, and `run` (1 device and under a layout).

Needs onnx, onnxruntime and numpy; `make onnx-testdata` makes a venv under target/ with them.
`--bench DIR` writes only the bench's models, into DIR: the 6-layer encoder and two whole
convolution networks (YOLOv8n's and ResNet-50's layers at batch 1). `--sizes NAME BxS...`
runs testdata/onnx/NAME's model at other batch and sequence sizes (seeded f32 inputs) and
writes sizes/BxS/inputs and sizes/BxS/expected beside it: what one artifact compiled over
ranged dims must give at each size.
Deterministic: the same packages write the same files.
"""

import functools
import os
import sys

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "testdata", "onnx")
OPSET = 17
rng = np.random.default_rng(17)


def init(name, shape, scale=0.2):
    return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)


def ints(name, values):
    return numpy_helper.from_array(np.array(values, dtype=np.int64), name)


def const(out, array):
    """A Constant node, as torch.onnx writes scalars and shape pieces."""
    return helper.make_node("Constant", [], [out], value=numpy_helper.from_array(np.array(array)), name=out)


def node(op, inputs, outputs, **attrs):
    return helper.make_node(op, inputs, outputs, name="/" + outputs[0].replace("_output_0", ""), **attrs)


def save(name, graph, inputs, dims, opset=OPSET, out=OUT, input_shapes=None, oracle=None):
    """`oracle`, when given, is the graph onnxruntime runs for the expected outputs: one that
    computes what `graph` does with nodes onnxruntime implements."""
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="gen_onnx_testdata")
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    d = os.path.join(out, name)
    os.makedirs(os.path.join(d, "inputs"), exist_ok=True)
    os.makedirs(os.path.join(d, "expected"), exist_ok=True)
    onnx.save(model, os.path.join(d, "model.onnx"))
    run = model
    if oracle is not None:
        run = helper.make_model(oracle, opset_imports=[helper.make_opsetid("", opset)])
        run.ir_version = 8
    sess = ort.InferenceSession(run.SerializeToString(), providers=["CPUExecutionProvider"])
    outs = sess.run(None, inputs)
    for k, v in inputs.items():
        np.save(os.path.join(d, "inputs", k + ".npy"), v)
    for o, v in zip(sess.get_outputs(), outs):
        np.save(os.path.join(d, "expected", o.name + ".npy"), v)
    with open(os.path.join(d, "dims.txt"), "w") as f:
        f.write("".join(f"{k}={v}\n" for k, v in dims.items()))
    if input_shapes:
        with open(os.path.join(d, "input_shapes.txt"), "w") as f:
            f.write("".join(f"{k}={'x'.join(map(str, inputs[k].shape))}\n" for k in input_shapes))


def mlp():
    """Gemm with transB (a torch Linear), Relu, then MatMul with the bias added first (as
    torch writes Add(bias, x)), a Clip with only a min, and an Identity at the end."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])
    nodes = [
        node("Gemm", ["x", "fc1.weight", "fc1.bias"], ["/fc1/Gemm_output_0"], transB=1),
        node("Relu", ["/fc1/Gemm_output_0"], ["/act/Relu_output_0"]),
        node("MatMul", ["/act/Relu_output_0", "fc2.weight"], ["/fc2/MatMul_output_0"]),
        node("Add", ["fc2.bias", "/fc2/MatMul_output_0"], ["/fc2/Add_output_0"]),
        const("/clip/min", np.float32(-0.25)),
        helper.make_node("Clip", ["/fc2/Add_output_0", "/clip/min"], ["/clip/Clip_output_0"], name="/clip/Clip"),
        helper.make_node("Identity", ["/clip/Clip_output_0"], ["y"], name="/Identity"),
    ]
    inits = [init("fc1.weight", [32, 16]), init("fc1.bias", [32]), init("fc2.weight", [32, 8]), init("fc2.bias", [8])]
    g = helper.make_graph(nodes, "mlp", [x], [y], inits)
    save("mlp", g, {"x": rng.standard_normal((4, 16)).astype(np.float32)}, {"batch": 4})


def encoder(name="encoder", hid=32, heads=4, ffn=64, layers=1, batch=2, seq=5, out=OUT, vocab=None):
    """BERT encoder blocks (by default one: hidden 32, 4 heads) with an attention mask,
    written the way torch.onnx writes them: head reshapes whose target shapes come from
    Shape/Gather/Unsqueeze/Concat on the input, the extended mask (1 - mask) * min, erf
    GELU. Layer i > 0 prefixes its node names with /layer.i. With `vocab`, the input is
    `input_ids` and BERT's embeddings come first (word and position tables of that many
    and 512 rows, the token type's first row, a layer norm)."""
    hd = hid // heads
    source = "input_ids" if vocab else "hidden_states"
    if vocab:
        x = helper.make_tensor_value_info(source, TensorProto.INT64, ["batch", "seq"])
    else:
        x = helper.make_tensor_value_info(source, TensorProto.FLOAT, ["batch", "seq", hid])
    m = helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "seq"])
    y = helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, ["batch", "seq", hid])
    n, inits = [], []
    # Shape pieces, as exporters compute them.
    n += [node("Shape", [source], ["/Shape_output_0"]),
          const("/Constant_output_0", np.int64(0)), const("/Constant_1_output_0", np.int64(1)),
          node("Gather", ["/Shape_output_0", "/Constant_output_0"], ["/Gather_output_0"], axis=0),
          node("Gather", ["/Shape_output_0", "/Constant_1_output_0"], ["/Gather_1_output_0"], axis=0),
          const("/axes0", np.array([0], dtype=np.int64)),
          node("Unsqueeze", ["/Gather_output_0", "/axes0"], ["/Unsqueeze_output_0"]),
          node("Unsqueeze", ["/Gather_1_output_0", "/axes0"], ["/Unsqueeze_1_output_0"]),
          const("/heads", np.array([heads, hd], dtype=np.int64)),
          const("/hidden", np.array([hid], dtype=np.int64)),
          node("Concat", ["/Unsqueeze_output_0", "/Unsqueeze_1_output_0", "/heads"], ["/Concat_output_0"], axis=0),
          node("Concat", ["/Unsqueeze_output_0", "/Unsqueeze_1_output_0", "/hidden"], ["/Concat_1_output_0"], axis=0)]
    # The extended attention mask: [batch, 1, 1, seq], 0 where attended, a large negative elsewhere.
    n += [const("/mask_axes", np.array([1, 2], dtype=np.int64)),
          node("Unsqueeze", ["attention_mask", "/mask_axes"], ["/Unsqueeze_2_output_0"]),
          node("Cast", ["/Unsqueeze_2_output_0"], ["/Cast_output_0"], to=TensorProto.FLOAT),
          const("/one", np.float32(1.0)),
          node("Sub", ["/one", "/Cast_output_0"], ["/Sub_output_0"]),
          const("/min", np.float32(np.finfo(np.float32).min)),
          node("Mul", ["/Sub_output_0", "/min"], ["/Mul_output_0"])]
    inp = source
    if vocab:
        e = "embeddings."
        inits += [init(e + "word_embeddings.weight", [vocab, hid], 0.05),
                  init(e + "position_embeddings.weight", [512, hid], 0.05),
                  init(e + "token_type_row", [hid], 0.05),
                  init(e + "LayerNorm.weight", [hid]), init(e + "LayerNorm.bias", [hid])]
        n += [node("Gather", [e + "word_embeddings.weight", source], ["/embeddings/word_output_0"], axis=0),
              node("Slice", [e + "position_embeddings.weight", "/axes0", "/Unsqueeze_1_output_0", "/axes0"],
                   ["/embeddings/position_output_0"]),
              node("Add", ["/embeddings/word_output_0", "/embeddings/position_output_0"], ["/embeddings/sum_output_0"]),
              node("Add", ["/embeddings/sum_output_0", e + "token_type_row"], ["/embeddings/typed_output_0"]),
              node("LayerNormalization", ["/embeddings/typed_output_0", e + "LayerNorm.weight", e + "LayerNorm.bias"],
                   ["/embeddings/output_0"], axis=-1, epsilon=1e-12)]
        inp = "/embeddings/output_0"
    for i in range(layers):
        t = f"/layer.{i}" if i else ""
        p = f"encoder.layer.{i}."
        last = "last_hidden_state" if i + 1 == layers else f"{t}/ln2_output_0"

        def linear(name, inp, din, dout, out):
            inits.extend([init(p + name + ".weight_t", [din, dout]), init(p + name + ".bias", [dout], 0.05)])
            mm = f"{t}/{name}/MatMul_output_0"
            return [node("MatMul", [inp, p + name + ".weight_t"], [mm]), node("Add", [p + name + ".bias", mm], [out])]

        def heads_of(x, out, perm):
            r = f"/{out}/Reshape_output_0"
            return [node("Reshape", [x, "/Concat_output_0"], [r]), node("Transpose", [r], [out], perm=perm)]

        for proj in ["query", "key", "value"]:
            n += linear("attention.self." + proj, inp, hid, hid, f"{t}/{proj}_output_0")
        n += heads_of(f"{t}/query_output_0", f"{t}/q_output_0", [0, 2, 1, 3])
        n += heads_of(f"{t}/key_output_0", f"{t}/kT_output_0", [0, 2, 3, 1])
        n += heads_of(f"{t}/value_output_0", f"{t}/v_output_0", [0, 2, 1, 3])
        n += [node("MatMul", [f"{t}/q_output_0", f"{t}/kT_output_0"], [f"{t}/scores_output_0"]),
              const(f"{t}/scale", np.float32(np.sqrt(hd))),
              node("Div", [f"{t}/scores_output_0", f"{t}/scale"], [f"{t}/scaled_output_0"]),
              node("Add", [f"{t}/scaled_output_0", "/Mul_output_0"], [f"{t}/masked_output_0"]),
              node("Softmax", [f"{t}/masked_output_0"], [f"{t}/probs_output_0"], axis=-1),
              node("MatMul", [f"{t}/probs_output_0", f"{t}/v_output_0"], [f"{t}/context_output_0"]),
              node("Transpose", [f"{t}/context_output_0"], [f"{t}/context_t_output_0"], perm=[0, 2, 1, 3]),
              node("Reshape", [f"{t}/context_t_output_0", "/Concat_1_output_0"], [f"{t}/context_r_output_0"])]
        n += linear("attention.output.dense", f"{t}/context_r_output_0", hid, hid, f"{t}/attn_out_output_0")
        inits += [init(p + "attention.output.LayerNorm.weight", [hid]), init(p + "attention.output.LayerNorm.bias", [hid])]
        n += [node("Add", [f"{t}/attn_out_output_0", inp], [f"{t}/res1_output_0"]),
              node("LayerNormalization", [f"{t}/res1_output_0", p + "attention.output.LayerNorm.weight",
                                          p + "attention.output.LayerNorm.bias"], [f"{t}/ln1_output_0"], axis=-1,
                   epsilon=1e-12)]
        n += linear("intermediate.dense", f"{t}/ln1_output_0", hid, ffn, f"{t}/inter_output_0")
        n += [const(f"{t}/sqrt2", np.float32(np.sqrt(2.0))),
              node("Div", [f"{t}/inter_output_0", f"{t}/sqrt2"], [f"{t}/gelu_div_output_0"]),
              node("Erf", [f"{t}/gelu_div_output_0"], [f"{t}/gelu_erf_output_0"]),
              node("Add", [f"{t}/gelu_erf_output_0", "/one"], [f"{t}/gelu_add_output_0"]),
              node("Mul", [f"{t}/inter_output_0", f"{t}/gelu_add_output_0"], [f"{t}/gelu_mul_output_0"]),
              const(f"{t}/half", np.float32(0.5)),
              node("Mul", [f"{t}/gelu_mul_output_0", f"{t}/half"], [f"{t}/gelu_output_0"])]
        n += linear("output.dense", f"{t}/gelu_output_0", ffn, hid, f"{t}/ffn_out_output_0")
        inits += [init(p + "output.LayerNorm.weight", [hid]), init(p + "output.LayerNorm.bias", [hid])]
        n += [node("Add", [f"{t}/ffn_out_output_0", f"{t}/ln1_output_0"], [f"{t}/res2_output_0"]),
              node("LayerNormalization", [f"{t}/res2_output_0", p + "output.LayerNorm.weight",
                                          p + "output.LayerNorm.bias"], [last], axis=-1, epsilon=1e-12)]
        inp = last
    g = helper.make_graph(n, "encoder", [x, m], [y], inits)
    mask = np.ones((batch, seq), dtype=np.int64)
    if batch > 1:
        mask[1, 3:] = 0  # the second sequence is padding after 3 tokens
    if vocab:
        first = rng.integers(0, vocab, (batch, seq), dtype=np.int64)
    else:
        first = rng.standard_normal((batch, seq, hid)).astype(np.float32)
    save(name, g, {source: first, "attention_mask": mask}, {"batch": batch, "seq": seq}, out=out)


def shapes():
    """Shape subgraphs and semantic traps: Size, ConstantOfShape, Range, Expand, Flatten,
    Squeeze, Slice with INT64_MAX ends, Split, Reshape with 0 (copy the dim), reductions with
    absent axes (all axes) and with noop_with_empty_axes, ReduceSum's axes as an input."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 6])
    shapes = {"flat": ["batch", 6], "total": [], "same": ["batch", 6], "pos": ["batch", 6], "halves": ["batch", 3]}
    outs = [helper.make_tensor_value_info(o, TensorProto.FLOAT, s) for o, s in shapes.items()]
    big = np.iinfo(np.int64).max
    n = [node("Shape", ["x"], ["/Shape_output_0"]),
         node("Size", ["x"], ["/Size_output_0"]),
         node("Cast", ["/Size_output_0"], ["/size_f_output_0"], to=TensorProto.FLOAT),
         # ones of x's shape, then positions 0..6 expanded over the batch.
         helper.make_node("ConstantOfShape", ["/Shape_output_0"], ["/ones_output_0"], name="/ConstantOfShape",
                          value=numpy_helper.from_array(np.array([1.0], dtype=np.float32))),
         const("/start", np.float32(0)), const("/limit", np.float32(6)), const("/delta", np.float32(1)),
         node("Range", ["/start", "/limit", "/delta"], ["/Range_output_0"]),
         node("Expand", ["/Range_output_0", "/Shape_output_0"], ["/Expand_output_0"]),
         node("Mul", ["/Expand_output_0", "/ones_output_0"], ["/posx_output_0"]),
         node("Add", ["/posx_output_0", "x"], ["pos"]),
         # Reshape with 0 copies the batch dim; Flatten back.
         const("/shape3", np.array([0, 3, 2], dtype=np.int64)),
         node("Reshape", ["x", "/shape3"], ["/r3_output_0"]),
         node("Flatten", ["/r3_output_0"], ["flat"], axis=1),
         # A reduction with no axes reduces all; noop_with_empty_axes keeps the input.
         node("ReduceSum", ["x"], ["/sum_all_output_0"], keepdims=0),
         node("Div", ["/sum_all_output_0", "/size_f_output_0"], ["total"]),
         node("ReduceSum", ["x"], ["same"], noop_with_empty_axes=1),
         # A slice to INT64_MAX, a squeeze of a unit axis, and Split into halves.
         const("/starts", np.array([1], dtype=np.int64)), const("/ends", np.array([big], dtype=np.int64)),
         const("/axes1", np.array([1], dtype=np.int64)),
         node("Slice", ["x", "/starts", "/ends", "/axes1"], ["/sl_output_0"]),
         node("ReduceMean", ["/sl_output_0"], ["/rm_output_0"], axes=[1], keepdims=1),
         node("Squeeze", ["/rm_output_0", "/axes1"], ["/sq_output_0"]),
         node("Unsqueeze", ["/sq_output_0", "/axes1"], ["/unsq_output_0"]),
         const("/split", np.array([3, 3], dtype=np.int64)),
         helper.make_node("Split", ["x", "/split"], ["/a_output_0", "/b_output_0"], name="/Split", axis=1),
         node("Sub", ["/a_output_0", "/b_output_0"], ["/ab_output_0"]),
         node("Add", ["/ab_output_0", "/unsq_output_0"], ["halves"])]
    g = helper.make_graph(n, "shapes", [x], outs)
    save("shapes", g, {"x": rng.standard_normal((3, 6)).astype(np.float32)}, {"batch": 3})


def opset_v2():
    """Semantic traps of op set v2's elementwise, logic and reduction ops, against
    onnxruntime: CumSum exclusive and reverse (float) and inclusive (int64); ArgMax with ties
    and select_last_index, ArgMin keeping dims; Mod's two sign rules; Round half to even;
    comparisons and logic on bools; Trilu with k; HardSwish, Softplus, ReduceLogSumExp; a
    softmax cross-entropy with ignore_index and the mean over the counted targets."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 6])
    i = helper.make_tensor_value_info("i", TensorProto.INT64, ["batch", 6])
    labels = helper.make_tensor_value_info("labels", TensorProto.INT64, ["batch"])
    f, b, l = TensorProto.FLOAT, TensorProto.BOOL, TensorProto.INT64
    shapes = {"cumsum": (f, ["batch", 6]), "cumsum_int": (l, ["batch", 6]), "argmax": (l, ["batch"]),
              "argmin": (l, ["batch", 1]), "mod": (l, ["batch", 6]), "fmod": (l, ["batch", 6]),
              "rounded": (f, ["batch", 6]), "mask": (b, ["batch", 6]), "upper": (f, ["batch", 6]),
              "hard_swish": (f, ["batch", 6]), "softplus": (f, ["batch", 6]), "lse": (f, ["batch", 1]),
              "loss": (f, [])}
    outs = [helper.make_tensor_value_info(o, t, s) for o, (t, s) in shapes.items()]
    divisors = numpy_helper.from_array(np.array([3, -3, 4, -4, 7, -1], dtype=np.int64), "divisors")
    n = [const("/axis1", np.array(1, dtype=np.int64)),
         node("CumSum", ["x", "/axis1"], ["cumsum"], exclusive=1, reverse=1),
         node("CumSum", ["i", "/axis1"], ["cumsum_int"]),
         node("ArgMax", ["x"], ["argmax"], axis=1, keepdims=0, select_last_index=1),
         node("ArgMin", ["x"], ["argmin"], axis=1, keepdims=1),
         node("Mod", ["i", "divisors"], ["mod"]),
         node("Mod", ["i", "divisors"], ["fmod"], fmod=1),
         node("Round", ["x"], ["rounded"]),
         const("/one", np.float32(1)), const("/half", np.float32(0.5)),
         node("Less", ["x", "/one"], ["/lt_output_0"]),
         node("Equal", ["x", "/half"], ["/eq_output_0"]),
         node("Not", ["/eq_output_0"], ["/ne_output_0"]),
         node("And", ["/lt_output_0", "/ne_output_0"], ["/and_output_0"]),
         node("GreaterOrEqual", ["x", "rounded"], ["/ge_output_0"]),
         node("Xor", ["/and_output_0", "/ge_output_0"], ["mask"]),
         node("Trilu", ["x", "/axis1"], ["upper"], upper=1),
         node("HardSwish", ["x"], ["hard_swish"]),
         node("Softplus", ["x"], ["softplus"]),
         node("ReduceLogSumExp", ["x"], ["lse"], axes=[1], keepdims=1),
         node("SoftmaxCrossEntropyLoss", ["x", "labels"], ["loss"], ignore_index=2)]
    g = helper.make_graph(n, "opset_v2", [x, i, labels], outs, [divisors])
    xv = np.array([[0.5, 1.5, 2.5, 2.5, -0.5, -2.5],
                   [1.0, -1.0, 1.0, -1.0, 0.0, 0.5],
                   rng.standard_normal(6) * 3], dtype=np.float32)
    iv = np.array([[7, -7, 7, -7, 0, 5], [-9, 9, -8, 8, 13, -13], [1, 2, 3, -4, -5, 6]], dtype=np.int64)
    save("opset_v2", g, {"x": xv, "i": iv, "labels": np.array([1, 2, 5], dtype=np.int64)}, {"batch": 3})


def conv_bn(n, inits, name, inp, out, cin, cout, k, stride=1, group=1, act=None, **attrs):
    """A torch Conv2d (no bias) + BatchNorm2d (+ Relu or ReLU6 as Clip), as torch.onnx
    writes them with training=TrainingMode.PRESERVE (BN kept, not folded)."""
    pads = attrs.pop("pads", [k // 2] * 4) if "auto_pad" not in attrs else None
    extra = {"pads": pads} if pads is not None else {}
    inits += [init(name + ".weight", [cout, cin // group, k, k], (2.0 / (cin // group * k * k)) ** 0.5)]
    conv = f"/{name}/Conv_output_0"
    n.append(node("Conv", [inp, name + ".weight"], [conv], kernel_shape=[k, k], strides=[stride, stride],
                  group=group, **extra, **attrs))
    bn = name.replace("conv", "bn")
    inits += [numpy_helper.from_array((1 + 0.1 * rng.standard_normal(cout)).astype(np.float32), bn + ".weight"),
              numpy_helper.from_array((0.1 * rng.standard_normal(cout)).astype(np.float32), bn + ".bias"),
              numpy_helper.from_array((0.1 * rng.standard_normal(cout)).astype(np.float32), bn + ".running_mean"),
              numpy_helper.from_array((1 + 0.2 * rng.random(cout)).astype(np.float32), bn + ".running_var")]
    bn_out = out if act is None else f"/{bn}/BatchNormalization_output_0"
    n.append(node("BatchNormalization", [conv, bn + ".weight", bn + ".bias", bn + ".running_mean",
                                         bn + ".running_var"], [bn_out], epsilon=1e-5, momentum=0.9))
    if act == "relu":
        n.append(node("Relu", [bn_out], [out]))
    elif act == "silu":
        sig = f"/{bn}/Sigmoid_output_0"
        n += [node("Sigmoid", [bn_out], [sig]), helper.make_node("Mul", [bn_out, sig], [out], name=f"/{bn}/Mul")]
    elif act == "relu6":
        n.append(helper.make_node("Clip", [bn_out, "/zero", "/six"], [out], name=f"/{bn}/Clip"))


def resnet_block():
    """A ResNet stem and basic block (torchvision's resnet18 layers at 1/8 width): conv-BN-
    relu, 3x3/2 max pool, conv-BN-relu-conv-BN + residual, relu, global average pool,
    flatten and the fc Gemm."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 16, 16])
    y = helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])
    n, inits = [], []
    conv_bn(n, inits, "conv1", "x", "/relu/Relu_output_0", 3, 8, 7, stride=2, act="relu", pads=[3, 3, 3, 3])
    n.append(node("MaxPool", ["/relu/Relu_output_0"], ["/maxpool/MaxPool_output_0"], kernel_shape=[3, 3],
                  strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=0))
    conv_bn(n, inits, "layer1.0.conv1", "/maxpool/MaxPool_output_0", "/layer1.0/relu/Relu_output_0", 8, 8, 3,
            act="relu")
    conv_bn(n, inits, "layer1.0.conv2", "/layer1.0/relu/Relu_output_0", "/layer1.0/bn2/BN_output_0", 8, 8, 3)
    n += [node("Add", ["/layer1.0/bn2/BN_output_0", "/maxpool/MaxPool_output_0"], ["/layer1.0/Add_output_0"]),
          node("Relu", ["/layer1.0/Add_output_0"], ["/layer1.0/relu_1/Relu_output_0"]),
          node("GlobalAveragePool", ["/layer1.0/relu_1/Relu_output_0"], ["/avgpool/GlobalAveragePool_output_0"]),
          node("Flatten", ["/avgpool/GlobalAveragePool_output_0"], ["/Flatten_output_0"], axis=1),
          node("Gemm", ["/Flatten_output_0", "fc.weight", "fc.bias"], ["logits"], alpha=1.0, beta=1.0, transB=1)]
    inits += [init("fc.weight", [10, 8]), init("fc.bias", [10], 0.05)]
    g = helper.make_graph(n, "resnet_block", [x], [y], inits)
    save("resnet_block", g, {"x": rng.standard_normal((2, 3, 16, 16)).astype(np.float32)}, {"batch": 2})


def mobilenet_block():
    """MobileNetV2 inverted residuals (torchvision's layout at small width): 1x1 expand +
    BN + ReLU6 (a Clip), 3x3 depthwise + BN + ReLU6, 1x1 project + BN, the residual add;
    then a stride-2 block whose depthwise conv pads with auto_pad SAME_UPPER, as
    TensorFlow exports write it, and an average pool."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8, 12, 12])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 12, 3, 3])
    n = [const("/zero", np.float32(0.0)), const("/six", np.float32(6.0))]
    inits = []
    p = "features.1.conv."
    conv_bn(n, inits, p + "0.conv", "x", "/b1/expand_output_0", 8, 24, 1, act="relu6", pads=[0, 0, 0, 0])
    conv_bn(n, inits, p + "1.conv", "/b1/expand_output_0", "/b1/dw_output_0", 24, 24, 3, group=24, act="relu6")
    conv_bn(n, inits, p + "2.conv", "/b1/dw_output_0", "/b1/project_output_0", 24, 8, 1, pads=[0, 0, 0, 0])
    n.append(node("Add", ["x", "/b1/project_output_0"], ["/b1/Add_output_0"]))
    p = "features.2.conv."
    conv_bn(n, inits, p + "0.conv", "/b1/Add_output_0", "/b2/expand_output_0", 8, 32, 1, act="relu6",
            pads=[0, 0, 0, 0])
    conv_bn(n, inits, p + "1.conv", "/b2/expand_output_0", "/b2/dw_output_0", 32, 32, 3, stride=2, group=32,
            act="relu6", auto_pad="SAME_UPPER")
    conv_bn(n, inits, p + "2.conv", "/b2/dw_output_0", "/b2/project_output_0", 32, 12, 1, pads=[0, 0, 0, 0])
    n.append(node("AveragePool", ["/b2/project_output_0"], ["y"], kernel_shape=[3, 3], strides=[2, 2],
                  pads=[1, 1, 1, 1], count_include_pad=0))
    g = helper.make_graph(n, "mobilenet_block", [x], [y], inits)
    save("mobilenet_block", g, {"x": rng.standard_normal((2, 8, 12, 12)).astype(np.float32)}, {"batch": 2})


def gpt2_block():
    """A GPT-2 decoder block (hidden 32, 4 heads), the full-sequence graph as torch.onnx
    writes it at opset 18: ln_1, one c_attn projection (a Conv1D: MatMul on a [in, out]
    weight, then Add) split in three, heads reshaped and transposed with target shapes from
    Shape/Gather/Concat, the causal mask from Range and Less on the sequence length chosen
    by Where against the float32 minimum, Softmax, c_proj and the residual; ln_2 and the MLP
    with gelu_new (the tanh approximation: Pow, Tanh) and the second residual."""
    hid, heads = 32, 4
    hd = hid // heads
    x = helper.make_tensor_value_info("hidden_states", TensorProto.FLOAT, ["batch", "seq", hid])
    y = helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", "seq", hid])
    p = "h.0."
    n, inits = [], []

    def conv1d(name, inp, din, dout, out):
        inits.extend([init(p + name + ".weight", [din, dout]), init(p + name + ".bias", [dout], 0.05)])
        mm = f"/{name}/MatMul_output_0"
        return [node("MatMul", [inp, p + name + ".weight"], [mm]), node("Add", [p + name + ".bias", mm], [out])]

    def layer_norm(name, inp, out):
        inits.extend([numpy_helper.from_array((1 + 0.1 * rng.standard_normal(hid)).astype(np.float32),
                                              p + name + ".weight"), init(p + name + ".bias", [hid], 0.05)])
        return [node("LayerNormalization", [inp, p + name + ".weight", p + name + ".bias"], [out], axis=-1,
                     epsilon=1e-5)]

    # The sequence length and the head shape, from the input's shape.
    n += [node("Shape", ["hidden_states"], ["/Shape_output_0"]),
          const("/Constant_output_0", np.int64(0)), const("/Constant_1_output_0", np.int64(1)),
          node("Gather", ["/Shape_output_0", "/Constant_output_0"], ["/Gather_output_0"], axis=0),
          node("Gather", ["/Shape_output_0", "/Constant_1_output_0"], ["/Gather_1_output_0"], axis=0),
          const("/axes0", np.array([0], dtype=np.int64)),
          node("Unsqueeze", ["/Gather_output_0", "/axes0"], ["/Unsqueeze_output_0"]),
          node("Unsqueeze", ["/Gather_1_output_0", "/axes0"], ["/Unsqueeze_1_output_0"]),
          const("/heads", np.array([heads, hd], dtype=np.int64)),
          const("/hidden", np.array([hid], dtype=np.int64)),
          node("Concat", ["/Unsqueeze_output_0", "/Unsqueeze_1_output_0", "/heads"], ["/Concat_output_0"], axis=0),
          node("Concat", ["/Unsqueeze_output_0", "/Unsqueeze_1_output_0", "/hidden"], ["/Concat_1_output_0"], axis=0)]
    # The causal mask: key position j is hidden from query position i when i < j.
    n += [const("/zero_i", np.int64(0)), const("/one_i", np.int64(1)),
          node("Range", ["/zero_i", "/Gather_1_output_0", "/one_i"], ["/Range_output_0"]),
          const("/axes1", np.array([1], dtype=np.int64)),
          node("Unsqueeze", ["/Range_output_0", "/axes1"], ["/rows_output_0"]),
          node("Unsqueeze", ["/Range_output_0", "/axes0"], ["/cols_output_0"]),
          node("Less", ["/rows_output_0", "/cols_output_0"], ["/future_output_0"]),
          const("/mask_value", np.float32(np.finfo(np.float32).min))]
    n += layer_norm("ln_1", "hidden_states", "/ln_1/LayerNormalization_output_0")
    n += conv1d("attn.c_attn", "/ln_1/LayerNormalization_output_0", hid, 3 * hid, "/attn/c_attn/Add_output_0")
    n += [const("/split", np.array([hid] * 3, dtype=np.int64)),
          helper.make_node("Split", ["/attn/c_attn/Add_output_0", "/split"],
                           ["/attn/Split_output_0", "/attn/Split_output_1", "/attn/Split_output_2"],
                           name="/attn/Split", axis=2)]
    for i, (t, perm) in enumerate([("q", [0, 2, 1, 3]), ("kT", [0, 2, 3, 1]), ("v", [0, 2, 1, 3])]):
        n += [node("Reshape", [f"/attn/Split_output_{i}", "/Concat_output_0"], [f"/attn/{t}/Reshape_output_0"]),
              node("Transpose", [f"/attn/{t}/Reshape_output_0"], [f"/attn/{t}_output_0"], perm=perm)]
    n += [node("MatMul", ["/attn/q_output_0", "/attn/kT_output_0"], ["/attn/MatMul_output_0"]),
          const("/attn/scale", np.float32(np.sqrt(hd))),
          node("Div", ["/attn/MatMul_output_0", "/attn/scale"], ["/attn/Div_output_0"]),
          node("Where", ["/future_output_0", "/mask_value", "/attn/Div_output_0"], ["/attn/Where_output_0"]),
          node("Softmax", ["/attn/Where_output_0"], ["/attn/Softmax_output_0"], axis=-1),
          node("MatMul", ["/attn/Softmax_output_0", "/attn/v_output_0"], ["/attn/MatMul_1_output_0"]),
          node("Transpose", ["/attn/MatMul_1_output_0"], ["/attn/Transpose_output_0"], perm=[0, 2, 1, 3]),
          node("Reshape", ["/attn/Transpose_output_0", "/Concat_1_output_0"], ["/attn/Reshape_output_0"])]
    n += conv1d("attn.c_proj", "/attn/Reshape_output_0", hid, hid, "/attn/c_proj/Add_output_0")
    n += [node("Add", ["/attn/c_proj/Add_output_0", "hidden_states"], ["/Add_output_0"])]
    n += layer_norm("ln_2", "/Add_output_0", "/ln_2/LayerNormalization_output_0")
    n += conv1d("mlp.c_fc", "/ln_2/LayerNormalization_output_0", hid, 4 * hid, "/mlp/c_fc/Add_output_0")
    # gelu_new: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
    h = "/mlp/c_fc/Add_output_0"
    n += [const("/mlp/act/half", np.float32(0.5)), const("/mlp/act/three", np.float32(3.0)),
          const("/mlp/act/c", np.float32(0.044715)), const("/mlp/act/k", np.float32(np.sqrt(2.0 / np.pi))),
          const("/mlp/act/one", np.float32(1.0)),
          node("Mul", ["/mlp/act/half", h], ["/mlp/act/Mul_output_0"]),
          node("Pow", [h, "/mlp/act/three"], ["/mlp/act/Pow_output_0"]),
          node("Mul", ["/mlp/act/c", "/mlp/act/Pow_output_0"], ["/mlp/act/Mul_1_output_0"]),
          node("Add", [h, "/mlp/act/Mul_1_output_0"], ["/mlp/act/Add_output_0"]),
          node("Mul", ["/mlp/act/k", "/mlp/act/Add_output_0"], ["/mlp/act/Mul_2_output_0"]),
          node("Tanh", ["/mlp/act/Mul_2_output_0"], ["/mlp/act/Tanh_output_0"]),
          node("Add", ["/mlp/act/one", "/mlp/act/Tanh_output_0"], ["/mlp/act/Add_1_output_0"]),
          node("Mul", ["/mlp/act/Mul_output_0", "/mlp/act/Add_1_output_0"], ["/mlp/act/Mul_3_output_0"])]
    n += conv1d("mlp.c_proj", "/mlp/act/Mul_3_output_0", 4 * hid, hid, "/mlp/c_proj/Add_output_0")
    n += [node("Add", ["/Add_output_0", "/mlp/c_proj/Add_output_0"], ["output"])]
    g = helper.make_graph(n, "gpt2_block", [x], [y], inits)
    save("gpt2_block", g, {"hidden_states": rng.standard_normal((2, 6, hid)).astype(np.float32)},
         {"batch": 2, "seq": 6}, opset=18)


def half_weights():
    """Weights stored as f16 and bf16, each read through a Cast to float, as mixed-precision
    exports write them: meshc keeps the half bytes in the weights file and the artifact."""
    r = np.random.default_rng(1616)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])
    w1 = numpy_helper.from_array((r.standard_normal((16, 32)) * 0.2).astype(np.float16), "fc1.weight")
    b1 = numpy_helper.from_array((r.standard_normal(32) * 0.2).astype(np.float16), "fc1.bias")
    # make_tensor rounds the floats to bfloat16 (to nearest even).
    w2 = helper.make_tensor("fc2.weight", TensorProto.BFLOAT16, [32, 8],
                            (r.standard_normal((32, 8)) * 0.2).astype(np.float32).ravel().tolist())
    nodes = [
        node("Cast", ["fc1.weight"], ["/fc1/Cast_output_0"], to=TensorProto.FLOAT),
        node("MatMul", ["x", "/fc1/Cast_output_0"], ["/fc1/MatMul_output_0"]),
        node("Cast", ["fc1.bias"], ["/fc1/Cast_1_output_0"], to=TensorProto.FLOAT),
        node("Add", ["/fc1/MatMul_output_0", "/fc1/Cast_1_output_0"], ["/fc1/Add_output_0"]),
        node("Relu", ["/fc1/Add_output_0"], ["/act/Relu_output_0"]),
        node("Cast", ["fc2.weight"], ["/fc2/Cast_output_0"], to=TensorProto.FLOAT),
        helper.make_node("MatMul", ["/act/Relu_output_0", "/fc2/Cast_output_0"], ["y"], name="/fc2/MatMul"),
    ]
    g = helper.make_graph(nodes, "half_weights", [x], [y], [w1, b1, w2])
    save("half_weights", g, {"x": r.standard_normal((4, 16)).astype(np.float32)}, {"batch": 4})


def torch_names():
    """Weights named as torch.onnx's constant folding names them: a Linear's transposed weight
    becomes a new initializer `onnx::MatMul_N` (`val_N` from the torch.export exporter), read
    by one MatMul. meshc names each after its reader's module scope
    (`encoder.layer.0.attention.self.query.MatMul.B`), which the layout's patterns select; one whose new name another initializer has keeps its own (`onnx__MatMul_9`)."""
    r = np.random.default_rng(1313)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])

    def w(name, shape):
        return numpy_helper.from_array((r.standard_normal(shape) * 0.3).astype(np.float32), name)

    q, d = "/encoder/layer.0/attention/self/query", "/encoder/layer.0/output/dense"
    nodes = [
        helper.make_node("MatMul", ["x", "onnx::MatMul_7"], ["/q_output_0"], name=q + "/MatMul"),
        helper.make_node("Add", ["encoder.layer.0.attention.self.query.bias", "/q_output_0"], ["/qb_output_0"],
                         name=q + "/Add"),
        helper.make_node("Relu", ["/qb_output_0"], ["/act_output_0"], name="/act/Relu"),
        helper.make_node("MatMul", ["/act_output_0", "onnx::MatMul_8"], ["/d_output_0"], name=d + "/MatMul"),
        # The name onnx::MatMul_9 would get is another initializer's: it keeps its own.
        helper.make_node("MatMul", ["/d_output_0", "onnx::MatMul_9"], ["/e_output_0"], name="/extra/MatMul"),
        helper.make_node("MatMul", ["/e_output_0", "extra.MatMul.B"], ["/f_output_0"], name="/other/MatMul"),
        # As the torch.export-based exporter writes it: numbered names, the module path in
        # the node's namespace metadata.
        helper.make_node("MatMul", ["/f_output_0", "val_84"], ["y"], name="node_MatMul_83"),
    ]
    nodes[-1].metadata_props.add(key="namespace", value=": Model/encoder: Encoder/encoder.layer.0: Layer/"
                                 "encoder.layer.0.intermediate.dense: torch.nn.modules.linear.Linear/linear: "
                                 "aten.linear.default")
    inits = [w("onnx::MatMul_7", [8, 16]), w("encoder.layer.0.attention.self.query.bias", [16]),
             w("onnx::MatMul_8", [16, 8]), w("onnx::MatMul_9", [8, 8]), w("extra.MatMul.B", [8, 8]),
             w("val_84", [8, 8])]
    g = helper.make_graph(nodes, "torch_names", [x], [y], inits)
    save("torch_names", g, {"x": r.standard_normal((4, 8)).astype(np.float32)}, {"batch": 4})


def double_consts():
    """Doubles as torch.onnx writes them without constant folding: the attention scale a
    double Constant, its Sqrt computed in double, then Cast to float; a dim of the input
    Cast to double; a double initializer. meshc computes them in f32."""
    r = np.random.default_rng(6464)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 16])
    nodes = [
        const("/scale", np.float64(0.25)),
        node("Sqrt", ["/scale"], ["/Sqrt_output_0"]),
        node("Cast", ["/Sqrt_output_0"], ["/Cast_output_0"], to=TensorProto.FLOAT),
        node("Mul", ["x", "/Cast_output_0"], ["/Mul_output_0"]),
        node("Shape", ["x"], ["/Shape_output_0"]),
        const("/one", np.int64(1)),
        node("Gather", ["/Shape_output_0", "/one"], ["/Gather_output_0"], axis=0),
        node("Cast", ["/Gather_output_0"], ["/Cast_1_output_0"], to=TensorProto.DOUBLE),
        node("Div", ["/Cast_1_output_0", "offset"], ["/Div_output_0"]),
        node("Cast", ["/Div_output_0"], ["/Cast_2_output_0"], to=TensorProto.FLOAT),
        node("Add", ["/Mul_output_0", "/Cast_2_output_0"], ["/Add_output_0"]),
        node("Mul", ["/Add_output_0", "weight"], ["y"]),
    ]
    inits = [numpy_helper.from_array(np.float64(3.0), "offset"),
             numpy_helper.from_array(r.standard_normal(16).astype(np.float32), "weight")]
    g = helper.make_graph(nodes, "double_consts", [x], [y], inits)
    save("double_consts", g, {"x": r.standard_normal((4, 16)).astype(np.float32)}, {"batch": 4})


def outputs():
    """Graph outputs keep their ONNX names when meshc has nothing of its own to compute for
    them: an output the Identity of another output (`z = Add(x, x); y = Identity(z)`, once
    a panic), the graph input itself, no-op Identity, Cast and Expand of an input and of an
    initializer (once named after the initializer, or `x_2`)."""
    r = np.random.default_rng(30)
    f = TensorProto.FLOAT
    x = helper.make_tensor_value_info("x", f, ["batch", 4])
    names = {"y": ["batch", 4], "z": ["batch", 4], "x": ["batch", 4], "x_id": ["batch", 4],
             "x_cast": ["batch", 4], "x_expand": ["batch", 4], "w_id": [3, 4], "w_cast": [3, 4],
             "w_expand": [3, 4]}
    outs = [helper.make_tensor_value_info(o, f, s) for o, s in names.items()]
    n = [helper.make_node("Add", ["x", "x"], ["z"], name="add"),
         helper.make_node("Identity", ["z"], ["y"], name="identity"),
         helper.make_node("Identity", ["x"], ["x_id"], name="x_identity"),
         helper.make_node("Cast", ["x"], ["x_cast"], name="x_cast", to=f),
         helper.make_node("Expand", ["x", "row"], ["x_expand"], name="x_expand"),
         helper.make_node("Identity", ["w"], ["w_id"], name="w_identity"),
         helper.make_node("Cast", ["w"], ["w_cast"], name="w_cast", to=f),
         helper.make_node("Expand", ["w", "row"], ["w_expand"], name="w_expand")]
    w = numpy_helper.from_array(r.standard_normal((3, 4)).astype(np.float32), "w")
    g = helper.make_graph(n, "outputs", [x], outs, [w, ints("row", [1, 4])])
    save("outputs", g, {"x": r.standard_normal((2, 4)).astype(np.float32)}, {"batch": 2})


def numerics():
    """Where the ONNX formulas overflow or ONNX's clamping differs from Python's, against
    onnxruntime: Softplus and Mish of large |x| (x itself above ~88, not inf); LogSoftmax
    of [1000, 0, −1000] ([0, −1000, −2000], not −inf) and a SoftmaxCrossEntropyLoss through
    it (finite); Slice with a negative step from a start before −dim (clamped to 0: the
    first element, not nothing); Pad in wrap mode with a negative pad (the crop comes
    first, and the wrap repeats what is left); a Cast to FLOAT16 (and back), rounded to
    nearest even and infinite beyond 65504 (1e30 is inf, not 1e30); integer Div, exact and
    truncating (2^40 + 1 over 3 is not computed in f32)."""
    r = np.random.default_rng(9)
    f = TensorProto.FLOAT
    x = helper.make_tensor_value_info("x", f, ["batch", 6])
    labels = helper.make_tensor_value_info("labels", TensorProto.INT64, ["batch"])
    shapes = {"softplus": ["batch", 6], "mish": ["batch", 6], "log_softmax": ["batch", 6], "loss": [],
              "log_prob": ["batch", 6], "first": ["batch", 1], "wrap_end": ["batch", 7], "wrap_begin": ["batch", 5],
              "half": ["batch", 6]}
    outs = [helper.make_tensor_value_info(o, f, s) for o, s in shapes.items()]
    outs.append(helper.make_tensor_value_info("quotient", TensorProto.INT64, [4]))
    n = [helper.make_node("Softplus", ["x"], ["softplus"], name="softplus"),
         helper.make_node("Mish", ["x"], ["mish"], name="mish"),
         helper.make_node("LogSoftmax", ["x"], ["log_softmax"], name="log_softmax", axis=1),
         helper.make_node("SoftmaxCrossEntropyLoss", ["x", "labels"], ["loss", "log_prob"], name="sce"),
         helper.make_node("Slice", ["x", "starts", "ends", "axes", "steps"], ["first"], name="slice"),
         helper.make_node("Pad", ["x", "pads_end"], ["wrap_end"], name="wrap_end", mode="wrap"),
         helper.make_node("Pad", ["x", "pads_begin"], ["wrap_begin"], name="wrap_begin", mode="wrap"),
         helper.make_node("Cast", ["x"], ["x_f16"], name="to_f16", to=TensorProto.FLOAT16),
         helper.make_node("Cast", ["x_f16"], ["half"], name="from_f16", to=TensorProto.FLOAT),
         helper.make_node("Div", ["dividend", "divisor"], ["quotient"], name="int_div")]
    inits = [ints("starts", [-10]), ints("ends", [-100]), ints("axes", [1]), ints("steps", [-1]),
             ints("pads_end", [0, -1, 0, 2]), ints("pads_begin", [0, 2, 0, -3]),
             ints("dividend", [2**40 + 1, -7, 7, 9]), ints("divisor", [3, 2, -2, -4])]
    g = helper.make_graph(n, "numerics", [x, labels], outs, inits)
    xv = np.array([[1000.0, 0.0, -1000.0, 100.0, 89.0, -100.0],
                   [20.0, -20.0, 0.5, -0.5, 88.5, 30.0],
                   [-88.5, -1e30, 1e30, 17.0, -17.0, 1e-3],
                   r.standard_normal(6) * 3], dtype=np.float32)
    labels = np.array([1, 2, 0, 5], dtype=np.int64)
    save("numerics", g, {"x": xv, "labels": labels}, {"batch": 4}, opset=18)


def input_default():
    """An input with an initializer of its name: ONNX's IR makes the initializer the input's
    default value, which onnxruntime uses when the input is not fed (as here); meshc imports
    it as that constant, and `--const scale=FILE.npy` gives it another value."""
    r = np.random.default_rng(4)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])
    scale = helper.make_tensor_value_info("scale", TensorProto.FLOAT, [4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])
    n = [helper.make_node("Mul", ["x", "scale"], ["y"], name="mul")]
    default = numpy_helper.from_array(np.array([1, 2, 3, 4], dtype=np.float32), "scale")
    g = helper.make_graph(n, "input_default", [x, scale], [y], [default])
    save("input_default", g, {"x": r.standard_normal((2, 4)).astype(np.float32)}, {"batch": 2})


def bounded():
    """Models onnxruntime runs at once in little memory, which meshc once could not: a
    CumSum over 100,000 elements (once a constant [n, n] mask, 10 GB), a MaxPool and
    AveragePools whose kernel_shape [2^31] is far wider than their input of 4 (once a table
    of 2^31 taps per output), and Einsums of 30 and 60 operands (once one loop over every
    combination of letters, 2^30 points and more). CumSum is now the IR's cumsum, a pool
    reads only the taps that land on its input, an einsum contracts pairwise in a greedy
    order. The long CumSum adds quarters (exact in any order); the short one random floats,
    summed left to right by meshc and onnxruntime alike."""
    r = np.random.default_rng(31)
    f = TensorProto.FLOAT
    n, wide = 100_000, 2**31
    inputs = [helper.make_tensor_value_info(k, f, s) for k, s in
              [("c", [n]), ("c2", [3, 50]), ("p", [1, 1, 4]), ("e", [2]), ("m", [2, 2])]]
    shapes = {"cumsum": [n], "cumsum_rev": [3, 50], "pool_max": [1, 1, 1], "pool_avg": [1, 1, 1],
              "pool_avg_pad": [1, 1, 1], "einsum30": [], "einsum60": []}
    outs = [helper.make_tensor_value_info(o, f, s) for o, s in shapes.items()]
    letters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
    chain = ",".join(letters[i % 51] + letters[i % 51 + 1] for i in range(60))
    pool = dict(kernel_shape=[wide], pads=[2, wide - 6])
    nodes = [const("/axis0", np.array(0, dtype=np.int64)), const("/axis1", np.array(1, dtype=np.int64)),
             node("CumSum", ["c", "/axis0"], ["cumsum"]),
             node("CumSum", ["c2", "/axis1"], ["cumsum_rev"], exclusive=1, reverse=1),
             node("MaxPool", ["p"], ["pool_max"], **pool),
             node("AveragePool", ["p"], ["pool_avg"], **pool),
             node("AveragePool", ["p"], ["pool_avg_pad"], count_include_pad=1, **pool),
             node("Einsum", ["e"] * 30, ["einsum30"], equation=",".join(letters[:30]) + "->"),
             node("Einsum", ["m"] * 60, ["einsum60"], equation=chain + "->")]
    g = helper.make_graph(nodes, "bounded", inputs, outs)
    feeds = {"c": (r.integers(-8, 8, n) / 4).astype(np.float32),
             "c2": r.standard_normal((3, 50)).astype(np.float32),
             "p": np.array([[[1.0, 5.0, -2.0, 3.0]]], dtype=np.float32),
             "e": r.uniform(0.5, 1.5, 2).astype(np.float32),
             "m": r.uniform(0.2, 0.6, (2, 2)).astype(np.float32)}
    save("bounded", g, feeds, {})


def control_if():
    """If nodes whose condition folds at import: one on a fact of the shapes (x's width is 4)
    whose untaken branch holds Tan, which meshc does not import, and one on a constant whose
    taken branch holds an If of its own. The branches read the outer graph's input and
    initializer by name and hold initializers of their own."""
    r = np.random.default_rng(12)
    f = TensorProto.FLOAT

    def weight(name, shape):
        return numpy_helper.from_array(r.standard_normal(shape).astype(np.float32), name)

    x = helper.make_tensor_value_info("x", f, ["batch", 4])
    outs = [helper.make_tensor_value_info(o, f, ["batch", 4]) for o in ("y", "z")]

    def branch(name, nodes, out, inits=()):
        return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info(out, f, None)], list(inits))

    then_y = branch("relu_scaled", [node("Relu", ["x"], ["/relu"]), node("Mul", ["/relu", "w_then"], ["y_then"])],
                    "y_then", [weight("w_then", [4])])
    else_y = branch("tan", [node("Tan", ["x"], ["y_else"])], "y_else")
    inner_then = branch("matmul", [node("MatMul", ["/shifted", "w"], ["z_inner"])], "z_inner")
    inner_else = branch("neg", [node("Neg", ["/shifted"], ["z_neg"])], "z_neg")
    then_z = branch("never", [node("Tan", ["x"], ["z_then"])], "z_then")
    else_z = branch("shifted", [node("Add", ["x", "b"], ["/shifted"]), const("/inner_cond", np.array(True)),
                                helper.make_node("If", ["/inner_cond"], ["z_else"], name="/inner_if",
                                                 then_branch=inner_then, else_branch=inner_else)], "z_else")
    nodes = [node("Shape", ["x"], ["/shape"]), const("/one", np.array(1, dtype=np.int64)),
             node("Gather", ["/shape", "/one"], ["/width"], axis=0), const("/four", np.array(4, dtype=np.int64)),
             node("Equal", ["/width", "/four"], ["/is_four"]),
             helper.make_node("If", ["/is_four"], ["y"], name="/if_width", then_branch=then_y, else_branch=else_y),
             const("/false", np.array(False)),
             helper.make_node("If", ["/false"], ["z"], name="/if_const", then_branch=then_z, else_branch=else_z)]
    g = helper.make_graph(nodes, "control_if", [x], outs, [weight("w", [4, 4]), weight("b", [4])])
    save("control_if", g, {"x": r.standard_normal((3, 4)).astype(np.float32)}, {"batch": 3})


def control_loop():
    """Loops meshc unrolls at import: one of a constant trip count whose body carries a state
    through a MatMul on the outer graph's weight and scans it out, adding its iteration number
    and ending after 2 of its 3 trips when the condition its body gives turns false (the Loop
    has no condition input: ONNX's text calls the body's condition ignored then, onnxruntime
    and ONNX's reference evaluator end the loop on it); one with no trip count that runs while
    its carried counter stays below 5."""
    r = np.random.default_rng(13)
    f, i64 = TensorProto.FLOAT, TensorProto.INT64
    x = helper.make_tensor_value_info("x", f, ["batch", 4])
    outs = [helper.make_tensor_value_info("h", f, ["batch", 4]), helper.make_tensor_value_info("hs", f, [2, "batch", 4]),
            helper.make_tensor_value_info("y", f, ["batch", 4]), helper.make_tensor_value_info("count", i64, [])]
    info = helper.make_tensor_value_info
    body = helper.make_graph(
        [node("MatMul", ["h_in", "w"], ["/mm"]), node("Cast", ["i"], ["/i_f"], to=f),
         const("/tenth", np.array(0.1, np.float32)), node("Mul", ["/i_f", "/tenth"], ["/step"]),
         node("Add", ["/mm", "/step"], ["/pre"]), node("Tanh", ["/pre"], ["h_out"]),
         const("/one", np.array(1, np.int64)), node("Less", ["i", "/one"], ["cond_out"]),
         node("Identity", ["h_out"], ["h_scan"])],
        "step", [info("i", i64, []), info("cond_in", TensorProto.BOOL, []), info("h_in", f, None)],
        [info("cond_out", TensorProto.BOOL, []), info("h_out", f, None), info("h_scan", f, None)])
    counting = helper.make_graph(
        [const("/one", np.array(1, np.int64)), node("Add", ["c_in", "/one"], ["c_out"]),
         const("/five", np.array(5, np.int64)), node("Less", ["c_out", "/five"], ["go"]),
         const("/half", np.array(0.5, np.float32)), node("Mul", ["y_in", "/half"], ["/halved"]),
         node("Add", ["/halved", "x"], ["y_out"])],
        "count", [info("j", i64, []), info("go_in", TensorProto.BOOL, []), info("c_in", i64, []), info("y_in", f, None)],
        [info("go", TensorProto.BOOL, []), info("c_out", i64, []), info("y_out", f, None)])
    nodes = [const("/trips", np.array(3, np.int64)),
             helper.make_node("Loop", ["/trips", "", "x"], ["h", "hs"], name="/loop", body=body),
             const("/true", np.array(True)), const("/zero", np.array(0, np.int64)),
             helper.make_node("Loop", ["", "/true", "/zero", "x"], ["count", "y"], name="/while", body=counting)]
    w = numpy_helper.from_array((r.standard_normal((4, 4)) * 0.5).astype(np.float32), "w")
    g = helper.make_graph(nodes, "control_loop", [x], outs, [w])
    save("control_loop", g, {"x": r.standard_normal((2, 4)).astype(np.float32)}, {"batch": 2})


def control_scan():
    """A Scan meshc unrolls at import: a state carried through a MatMul on the outer graph's
    weight over two scan inputs, one sliced along axis 1 forward and one along axis 0
    backward; one scan output stacked along axis 0, the other along axis 2 in reverse."""
    r = np.random.default_rng(17)
    f = TensorProto.FLOAT
    info = helper.make_tensor_value_info
    body = helper.make_graph(
        [node("Add", ["x_t", "y_t"], ["/s"]), node("MatMul", ["h_in", "w"], ["/mm"]),
         node("Add", ["/mm", "/s"], ["/pre"]), node("Tanh", ["/pre"], ["h_out"]),
         node("Identity", ["h_out"], ["h_scan"]), node("Identity", ["/s"], ["s_scan"])],
        "step", [info("h_in", f, None), info("x_t", f, None), info("y_t", f, None)],
        [info("h_out", f, None), info("h_scan", f, None), info("s_scan", f, None)])
    scan = helper.make_node("Scan", ["h0", "xs", "ys"], ["h", "hs", "ss"], name="/scan", body=body,
                            num_scan_inputs=2, scan_input_axes=[1, 0], scan_input_directions=[0, 1],
                            scan_output_axes=[0, 2], scan_output_directions=[0, 1])
    w = numpy_helper.from_array((r.standard_normal((4, 4)) * 0.5).astype(np.float32), "w")
    g = helper.make_graph(
        [scan], "control_scan",
        [info("h0", f, ["batch", 4]), info("xs", f, ["batch", 3, 4]), info("ys", f, [3, 4])],
        [info("h", f, ["batch", 4]), info("hs", f, [3, "batch", 4]), info("ss", f, ["batch", 4, 3])], [w])
    inputs = {"h0": r.standard_normal((2, 4)).astype(np.float32), "xs": r.standard_normal((2, 3, 4)).astype(np.float32),
              "ys": r.standard_normal((3, 4)).astype(np.float32)}
    save("control_scan", g, inputs, {"batch": 2})


def control_runtime():
    """Control flow decided at run time: two Ifs on whether x sums above 0 and below it (one
    takes its then branch, the other its else branch, in the same run), a Loop of 6 trips
    whose body's condition (the shrinking state's largest magnitude above 0.2) ends it after
    4 of them, and a Loop whose condition input (x sums below 0) is false at run time, so that
    it runs no iteration."""
    r = np.random.default_rng(23)
    f, i64, b = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL
    info = helper.make_tensor_value_info
    x = info("x", f, ["batch", 4])
    outs = [info("y", f, ["batch", 4]), info("z", f, ["batch", 4]), info("h", f, ["batch", 4]),
            info("steps", i64, []), info("k", f, ["batch", 4])]

    def branch(name, nodes, out, inits=()):
        return helper.make_graph(nodes, name, [], [info(out, f, None)], list(inits))

    def weight(name, shape, scale=1.0):
        return numpy_helper.from_array((r.standard_normal(shape) * scale).astype(np.float32), name)

    relu = branch("relu_scaled", [node("Relu", ["x"], ["/r"]), node("Mul", ["/r", "w_then"], ["o_then"])],
                  "o_then", [weight("w_then", [4])])
    tanh = branch("tanh_shifted", [node("Tanh", ["x"], ["/t"]), node("Add", ["/t", "b"], ["o_else"])], "o_else")
    relu2 = branch("relu", [node("Relu", ["x"], ["o2_then"])], "o2_then")
    neg2 = branch("neg", [node("Neg", ["x"], ["o2_else"])], "o2_else")
    body = helper.make_graph(
        [node("MatMul", ["h_in", "w"], ["/mm"]), node("Tanh", ["/mm"], ["h_out"]),
         const("/one", np.array(1, np.int64)), node("Add", ["c_in", "/one"], ["c_out"]),
         node("Abs", ["h_out"], ["/size"]), node("ReduceMax", ["/size"], ["/top"], keepdims=0),
         const("/limit", np.array(0.2, np.float32)), node("Greater", ["/top", "/limit"], ["go"])],
        "step", [info("i", i64, []), info("go_in", b, []), info("h_in", f, None), info("c_in", i64, [])],
        [info("go", b, []), info("h_out", f, None), info("c_out", i64, [])])
    halve = helper.make_graph(
        [const("/half", np.array(0.5, np.float32)), node("Mul", ["k_in", "/half"], ["k_out"]),
         node("Identity", ["go_in2"], ["go2"])],
        "halve", [info("j", i64, []), info("go_in2", b, []), info("k_in", f, None)],
        [info("go2", b, []), info("k_out", f, None)])
    nodes = [node("ReduceSum", ["x"], ["/sum"], keepdims=0), const("/zero", np.array(0, np.float32)),
             node("Greater", ["/sum", "/zero"], ["/positive"]), node("Less", ["/sum", "/zero"], ["/negative"]),
             helper.make_node("If", ["/positive"], ["y"], name="/if_positive", then_branch=relu, else_branch=tanh),
             helper.make_node("If", ["/negative"], ["z"], name="/if_negative", then_branch=relu2, else_branch=neg2),
             const("/trips", np.array(6, np.int64)), const("/true", np.array(True)),
             const("/count0", np.array(0, np.int64)),
             helper.make_node("Loop", ["/trips", "/true", "x", "/count0"], ["h", "steps"], name="/until", body=body),
             const("/three", np.array(3, np.int64)),
             helper.make_node("Loop", ["/three", "/negative", "x"], ["k"], name="/never", body=halve)]
    g = helper.make_graph(nodes, "control_runtime", [x], outs, [weight("w", [4, 4], 0.4), weight("b", [4])])
    feeds = {"x": (r.standard_normal((3, 4)) + 0.5).astype(np.float32)}
    save("control_runtime", g, feeds, {"batch": 3})
    steps = int(np.load(os.path.join(OUT, "control_runtime", "expected", "steps.npy")))
    assert 1 < steps < 6, f"the loop should end at run time, before its trip count: {steps} steps"
    assert feeds["x"].sum() > 0, "one If takes each branch"


def same_node_names():
    """Two Constant nodes of one name holding different weights, as silero's OpenVINO export
    names every Constant `F0::anon`: ONNX requires unique value names, not unique node names
    (meshc once read the second as the first's param)."""
    r = np.random.default_rng(19)
    f = TensorProto.FLOAT
    anon = [helper.make_node("Constant", [], [out], name="F0::anon",
                             value=numpy_helper.from_array(r.standard_normal(4).astype(np.float32)))
            for out in ("shift", "scale")]
    g = helper.make_graph(
        anon + [node("Add", ["x", "shift"], ["/add_output_0"]), node("Mul", ["/add_output_0", "scale"], ["y"])],
        "same_node_names", [helper.make_tensor_value_info("x", f, ["batch", 4])],
        [helper.make_tensor_value_info("y", f, ["batch", 4])])
    save("same_node_names", g, {"x": r.standard_normal((4, 4)).astype(np.float32)}, {"batch": 4})


def unsized_dims():
    """An input whose batch dim is -1 and whose height and width have neither a size nor a
    name, as Paddle2ONNX writes an OCR model's image: only `--input-shape x=1x3x6x10` can
    give them sizes."""
    r = np.random.default_rng(5)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [-1, 3, None, None])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [-1, 4, None, None])
    w = numpy_helper.from_array((r.standard_normal((4, 3, 3, 3)) * 0.3).astype(np.float32), "conv.weight")
    bias = numpy_helper.from_array((r.standard_normal(4) * 0.1).astype(np.float32), "conv.bias")
    n = [node("Conv", ["x", "conv.weight", "conv.bias"], ["/conv/Conv_output_0"], pads=[1, 1, 1, 1]),
         node("Relu", ["/conv/Conv_output_0"], ["y"])]
    g = helper.make_graph(n, "unsized_dims", [x], [y], [w, bias])
    save("unsized_dims", g, {"x": r.standard_normal((1, 3, 6, 10)).astype(np.float32)}, {}, input_shapes=["x"])


def shared_dim_name():
    """Unrelated dims that share one name, as silero VAD's export names every dynamic dim
    `?`: `input` is [?, ?] and `state` [2, ?, 8], the first ? a batch of 1, the second 64
    samples. No one `--dim ?=N` fits both; an `--input-shape` for each input does."""
    r = np.random.default_rng(6)
    inp = helper.make_tensor_value_info("input", TensorProto.FLOAT, ["?", "?"])
    state = helper.make_tensor_value_info("state", TensorProto.FLOAT, [2, "?", 8])
    out = helper.make_tensor_value_info("out", TensorProto.FLOAT, [2, "?", 8])
    w = numpy_helper.from_array((r.standard_normal((64, 8)) * 0.2).astype(np.float32), "proj.weight")
    n = [node("MatMul", ["input", "proj.weight"], ["/proj/MatMul_output_0"]),
         node("Add", ["state", "/proj/MatMul_output_0"], ["/Add_output_0"]),
         node("Tanh", ["/Add_output_0"], ["out"])]
    g = helper.make_graph(n, "shared_dim_name", [inp, state], [out], [w])
    feeds = {"input": r.standard_normal((1, 64)).astype(np.float32),
             "state": r.standard_normal((2, 1, 8)).astype(np.float32)}
    save("shared_dim_name", g, feeds, {}, input_shapes=["input", "state"])


def sequence_first(graph):
    """`graph` with each recurrent node of layout 1 (batch first, which onnxruntime's CPU
    kernels refuse) as transposes around the same node of layout 0: the graph onnxruntime
    runs for the expected outputs of a batch-first layer."""
    nodes = []
    for n in graph.node:
        if not any(a.name == "layout" and a.i == 1 for a in n.attribute):
            nodes.append(n)
            continue
        ins, outs = list(n.input), list(n.output)
        for k in (0, 5, 6):
            if k < len(ins) and ins[k]:
                nodes.append(helper.make_node("Transpose", [ins[k]], [ins[k] + ".seq_first"], perm=[1, 0, 2]))
                ins[k] += ".seq_first"
        for k, perm in ((0, [2, 0, 1, 3]), (1, [1, 0, 2]), (2, [1, 0, 2])):
            if k < len(outs) and outs[k]:
                nodes.append(helper.make_node("Transpose", [outs[k] + ".seq_first"], [outs[k]], perm=perm))
                outs[k] += ".seq_first"
        attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute if a.name != "layout"}
        nodes.append(helper.make_node(n.op_type, ins, outs, name=n.name, **attrs))
    return helper.make_graph(nodes, graph.name, graph.input, graph.output, graph.initializer)


def normal(r, name, shape, scale=0.6):
    """An initializer `name` of normal values from `r`, times `scale`."""
    return numpy_helper.from_array((r.standard_normal(shape) * scale).astype(np.float32), name)


def recurrent_lstm():
    """LSTMs as the voice-activity and OCR models use them, with every input and attribute
    the unrolling implements: a bidirectional one with biases, run-time sequence lengths
    (rows shorter than the sequence), initial states, peepholes and a clip that bites (below
    the cell states, which it must leave alone); a batch-first one (layout 1) with
    input_forget, other activations with alpha/beta, and its Y_h output omitted."""
    r = np.random.default_rng(41)
    f = TensorProto.FLOAT
    seq, batch, inp, hid = 5, 4, 3, 6
    info = helper.make_tensor_value_info
    w = functools.partial(normal, r)

    inits = [w("lstm.W", (2, 4 * hid, inp)), w("lstm.R", (2, 4 * hid, hid)), w("lstm.B", (2, 8 * hid), 0.3),
             w("lstm.P", (2, 3 * hid), 0.4), w("lstm2.W", (1, 4 * hid, inp)), w("lstm2.R", (1, 4 * hid, hid))]
    nodes = [
        helper.make_node("LSTM", ["x", "lstm.W", "lstm.R", "lstm.B", "lens", "h0", "c0", "lstm.P"], ["y", "y_h", "y_c"],
                         name="/lstm", direction="bidirectional", hidden_size=hid, clip=0.7),
        helper.make_node("LSTM", ["x_bf", "lstm2.W", "lstm2.R"], ["y2", "", "y2_c"], name="/lstm2", hidden_size=hid,
                         layout=1, input_forget=1, activations=["HardSigmoid", "Tanh", "ScaledTanh"],
                         activation_alpha=[0.3, 0.9], activation_beta=[0.4, 1.2]),
    ]
    ins = [info("x", f, [seq, "batch", inp]), info("lens", TensorProto.INT32, ["batch"]),
           info("h0", f, [2, "batch", hid]), info("c0", f, [2, "batch", hid]), info("x_bf", f, ["batch", seq, inp])]
    outs = [info("y", f, [seq, 2, "batch", hid]), info("y_h", f, [2, "batch", hid]), info("y_c", f, [2, "batch", hid]),
            info("y2", f, ["batch", seq, 1, hid]), info("y2_c", f, ["batch", 1, hid])]
    g = helper.make_graph(nodes, "recurrent_lstm", ins, outs, inits)
    feeds = {"x": r.standard_normal((seq, batch, inp)).astype(np.float32),
             "lens": np.array([5, 2, 4, 1], np.int32),
             "h0": (r.standard_normal((2, batch, hid)) * 0.5).astype(np.float32),
             "c0": (r.standard_normal((2, batch, hid)) * 0.5).astype(np.float32),
             "x_bf": r.standard_normal((batch, seq, inp)).astype(np.float32)}
    save("recurrent_lstm", g, feeds, {"batch": batch}, oracle=sequence_first(g))


def recurrent_gru_rnn():
    """GRUs and an RNN: a reverse GRU with linear_before_reset, biases, sequence lengths and
    an initial state; a batch-first GRU without biases; a bidirectional RNN with a Relu
    direction, a clip and only its Y_h output."""
    r = np.random.default_rng(42)
    f = TensorProto.FLOAT
    seq, batch, inp, hid = 4, 2, 3, 5
    info = helper.make_tensor_value_info
    w = functools.partial(normal, r)

    inits = [w("gru.W", (1, 3 * hid, inp)), w("gru.R", (1, 3 * hid, hid)), w("gru.B", (1, 6 * hid), 0.3),
             w("gru2.W", (1, 3 * hid, inp)), w("gru2.R", (1, 3 * hid, hid)),
             w("rnn.W", (2, hid, inp)), w("rnn.R", (2, hid, hid)), w("rnn.B", (2, 2 * hid), 0.3)]
    nodes = [
        helper.make_node("GRU", ["x", "gru.W", "gru.R", "gru.B", "lens", "h0"], ["y", "y_h"], name="/gru",
                         direction="reverse", hidden_size=hid, linear_before_reset=1),
        helper.make_node("GRU", ["x_bf", "gru2.W", "gru2.R"], ["y2", "y2_h"], name="/gru2", hidden_size=hid, layout=1),
        helper.make_node("RNN", ["x", "rnn.W", "rnn.R", "rnn.B"], ["", "y3_h"], name="/rnn", hidden_size=hid,
                         direction="bidirectional", activations=["Relu", "Tanh"], clip=1.0),
    ]
    ins = [info("x", f, [seq, "batch", inp]), info("lens", TensorProto.INT32, ["batch"]),
           info("h0", f, [1, "batch", hid]), info("x_bf", f, ["batch", seq, inp])]
    outs = [info("y", f, [seq, 1, "batch", hid]), info("y_h", f, [1, "batch", hid]),
            info("y2", f, ["batch", seq, 1, hid]), info("y2_h", f, ["batch", 1, hid]), info("y3_h", f, [2, "batch", hid])]
    g = helper.make_graph(nodes, "recurrent_gru_rnn", ins, outs, inits)
    feeds = {"x": r.standard_normal((seq, batch, inp)).astype(np.float32),
             "lens": np.array([3, 4], np.int32),
             "h0": (r.standard_normal((1, batch, hid)) * 0.5).astype(np.float32),
             "x_bf": r.standard_normal((batch, seq, inp)).astype(np.float32)}
    save("recurrent_gru_rnn", g, feeds, {"batch": batch}, oracle=sequence_first(g))


def quantized():
    """An MLP quantized as onnxruntime's quantize_dynamic writes one: x quantized at run time
    (DynamicQuantizeLinear), an int8 weight multiplied in integers (MatMulInteger) and the
    product scaled back; then a QuantizeLinear/DequantizeLinear pair on the activation (as
    quantize_static writes them) and a per-channel int8 weight dequantized for a MatMul. Its
    own generator, so the models before it keep their bytes."""
    r = np.random.default_rng(88)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])
    a_q = helper.make_tensor_value_info("act_quantized", TensorProto.UINT8, ["batch", 32])
    w1 = numpy_helper.from_array(r.integers(-127, 128, (16, 32)).astype(np.int8), "fc1.weight_quantized")
    w2 = numpy_helper.from_array(r.integers(-127, 128, (32, 8)).astype(np.int8), "fc2.weight_quantized")
    scalar = lambda name, v, t: numpy_helper.from_array(np.array(v, dtype=t), name)
    inits = [
        w1, scalar("fc1.weight_scale", 0.2 / 127, np.float32), scalar("fc1.weight_zero_point", 0, np.int8),
        numpy_helper.from_array((r.standard_normal(32) * 0.1).astype(np.float32), "fc1.bias"),
        scalar("act_scale", 0.01, np.float32), scalar("act_zero_point", 3, np.uint8),
        w2, numpy_helper.from_array((r.uniform(0.5, 2.0, 8) * 0.2 / 127).astype(np.float32), "fc2.weight_scale"),
        numpy_helper.from_array(r.integers(-4, 5, 8).astype(np.int8), "fc2.weight_zero_point"),
    ]
    nodes = [
        node("DynamicQuantizeLinear", ["x"], ["x_quantized", "x_scale", "x_zero_point"]),
        node("MatMulInteger", ["x_quantized", "fc1.weight_quantized", "x_zero_point", "fc1.weight_zero_point"],
             ["/fc1/MatMulInteger_output_0"]),
        node("Cast", ["/fc1/MatMulInteger_output_0"], ["/fc1/Cast_output_0"], to=TensorProto.FLOAT),
        node("Mul", ["x_scale", "fc1.weight_scale"], ["/fc1/scale_output_0"]),
        node("Mul", ["/fc1/Cast_output_0", "/fc1/scale_output_0"], ["/fc1/Mul_output_0"]),
        node("Add", ["/fc1/Mul_output_0", "fc1.bias"], ["/fc1/Add_output_0"]),
        node("Relu", ["/fc1/Add_output_0"], ["/act/Relu_output_0"]),
        node("QuantizeLinear", ["/act/Relu_output_0", "act_scale", "act_zero_point"], ["act_quantized"]),
        node("DequantizeLinear", ["act_quantized", "act_scale", "act_zero_point"], ["/act/DequantizeLinear_output_0"]),
        node("DequantizeLinear", ["fc2.weight_quantized", "fc2.weight_scale", "fc2.weight_zero_point"],
             ["/fc2/weight_output_0"], axis=1),
        helper.make_node("MatMul", ["/act/DequantizeLinear_output_0", "/fc2/weight_output_0"], ["y"], name="/fc2/MatMul"),
    ]
    g = helper.make_graph(nodes, "quantized", [x], [y, a_q], inits)
    save("quantized", g, {"x": r.standard_normal((4, 16)).astype(np.float32)}, {"batch": 4}, opset=13)


def integer_products():
    """MatMulInteger and QLinearMatMul whose products the integer GEMM runs: a u8 × i8
    product with a per-column weight zero point over K = 1100 (K·255·255 > 2^24: no f32 GEMM
    would be provably exact), an i8 × i8 one, and a u8 × u8 QLinearMatMul requantized to u8; activations at the ends of
    their range (255 × −128) as often as not. Its own generator, so the models before it keep
    their bytes."""
    r = np.random.default_rng(35)
    k = 1100
    a = helper.make_tensor_value_info("a", TensorProto.UINT8, ["batch", k])
    s = helper.make_tensor_value_info("s", TensorProto.INT8, ["batch", 64])
    outs = [helper.make_tensor_value_info("y_u8s8", TensorProto.INT32, ["batch", 40]),
            helper.make_tensor_value_info("y_s8s8", TensorProto.INT32, ["batch", 21]),
            helper.make_tensor_value_info("y_qlinear", TensorProto.UINT8, ["batch", 24])]
    ends = lambda lo, hi, shape, t: np.where(r.random(shape) < 0.5, r.choice([lo, hi], shape),  # noqa: E731
                                             r.integers(lo, hi + 1, shape)).astype(t)
    arr = numpy_helper.from_array
    inits = [
        arr(ends(-128, 127, (k, 40), np.int8), "w"), arr(np.uint8(131), "a_zp"),
        arr(r.integers(-128, 128, 40).astype(np.int8), "w_zp"),
        arr(ends(-128, 127, (64, 21), np.int8), "v"), arr(np.int8(-5), "s_zp"),
        arr(ends(0, 255, (k, 24), np.uint8), "u"), arr(np.float32(0.02), "a_scale"),
        arr(np.float32(0.003), "u_scale"), arr(np.uint8(128), "u_zp"), arr(np.float32(900.0), "y_scale"),
        arr(np.uint8(100), "y_zp"),
    ]
    nodes = [
        helper.make_node("MatMulInteger", ["a", "w", "a_zp", "w_zp"], ["y_u8s8"], name="u8s8"),
        helper.make_node("MatMulInteger", ["s", "v", "s_zp"], ["y_s8s8"], name="s8s8"),
        helper.make_node("QLinearMatMul", ["a", "a_scale", "a_zp", "u", "u_scale", "u_zp", "y_scale", "y_zp"],
                         ["y_qlinear"], name="qlinear"),
    ]
    g = helper.make_graph(nodes, "integer_products", [a, s], outs, inits)
    feeds = {"a": ends(0, 255, (4, k), np.uint8), "s": ends(-128, 127, (4, 64), np.int8)}
    save("integer_products", g, feeds, {"batch": 4}, opset=13)


def bad():
    """Bad inputs for testdata/bad/ (tests/all/golden.rs pins each one-line error)."""
    d = os.path.join(OUT, "..", "bad")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])

    def write(name, nodes, inits=(), inputs=None, opset=OPSET, ort_refuses=False, ort_fails=None):
        g = helper.make_graph(nodes, name, inputs or [x], [y] if ort_fails is None else [], list(inits))
        if ort_fails is not None:
            g.output.append(helper.make_tensor_value_info("y", TensorProto.FLOAT, None))
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
        if ort_refuses:
            # meshc validates as onnxruntime does: each of these it refuses too.
            try:
                ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
            except Exception:
                pass
            else:
                raise AssertionError(f"onnxruntime runs onnx-{name}")
        if ort_fails is not None:
            # onnxruntime cannot run these either: it refuses them, or fails to allocate
            # (`ort_fails` feeds it).
            try:
                sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
                sess.run(None, ort_fails)
            except Exception:
                pass
            else:
                raise AssertionError(f"onnxruntime runs onnx-{name}")
        with open(os.path.join(d, f"onnx-{name}.onnx"), "wb") as f:
            f.write(m.SerializeToString())

    with open(os.path.join(OUT, "encoder", "model.onnx"), "rb") as f:
        whole = f.read()
    with open(os.path.join(d, "onnx-truncated.onnx"), "wb") as f:
        f.write(whole[: len(whole) // 2])
    write("unknown-op", [helper.make_node("NonZero", ["x"], ["y"], name="nz")])
    write("unknown-domain", [helper.make_node("FusedMatMul", ["x", "x"], ["y"], name="fused", domain="com.microsoft")])
    dyn = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])
    write("unbound-dim", [helper.make_node("Relu", ["x"], ["y"])], inputs=[dyn])
    # Dims `--dim` cannot bind (Paddle2ONNX's -1, a dim with neither size nor name): the
    # error says which `--input-shape` would.
    for what, shape in [("negative-dim", [-1, 4]), ("unnamed-dim", [2, None])]:
        unsized = helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)
        write(what, [helper.make_node("Relu", ["x"], ["y"])], inputs=[unsized])
    short = numpy_helper.from_array(np.zeros((4, 4), np.float32), "w")
    short.raw_data = short.raw_data[:48]  # 12 of the 16 floats its dims say
    write("initializer-size", [helper.make_node("MatMul", ["x", "w"], ["y"])], [short])
    # int8 is storage: arithmetic on it is refused (a quantized model dequantizes first).
    write("int8", [helper.make_node("Add", ["x", "q"], ["y"])], [numpy_helper.from_array(np.zeros(4, np.int8), "q")])
    write("cycle", [helper.make_node("Relu", ["h"], ["y"], name="a"), helper.make_node("Relu", ["y"], ["h"], name="b")])
    # An If on a condition known only at run time (whether x sums above 0).
    sums = [helper.make_node("ReduceSum", ["x"], ["s"], name="sum", keepdims=0),
            helper.make_node("Greater", ["s", "zero"], ["c"], name="positive")]
    def arm(op):
        return helper.make_graph([helper.make_node(op, ["x"], ["o"])], op.lower(), [],
                                 [helper.make_tensor_value_info("o", TensorProto.FLOAT, None)])

    # Loops meshc cannot unroll: a condition known only at run time, too many iterations.
    def body(cond_nodes, cond):
        return helper.make_graph(
            cond_nodes + [helper.make_node("Relu", ["h"], ["h2"])], "body",
            [helper.make_tensor_value_info("i", TensorProto.INT64, []),
             helper.make_tensor_value_info("c", TensorProto.BOOL, []),
             helper.make_tensor_value_info("h", TensorProto.FLOAT, None)],
            [helper.make_tensor_value_info(cond, TensorProto.BOOL, []),
             helper.make_tensor_value_info("h2", TensorProto.FLOAT, None)])

    run_time = body([helper.make_node("ReduceSum", ["h"], ["hs"], keepdims=0),
                     helper.make_node("Greater", ["hs", "zero"], ["more"])], "more")
    write("loop-run-time", [helper.make_node("Loop", ["", "go", "x"], ["y"], name="loop", body=run_time)],
          [numpy_helper.from_array(np.array(0, np.float32), "zero"), numpy_helper.from_array(np.array(True), "go")])
    write("loop-too-long", [helper.make_node("Loop", ["trips", "", "x"], ["y"], name="loop", body=body([], "c"))],
          [numpy_helper.from_array(np.array(5000, np.int64), "trips")])
    # Loops nested four deep, 1000 trips each: a trillion body imports, unless the bound on
    # the body nodes unrolled over the whole model stops it.
    def level(depth, nodes):
        i, c, h = f"i{depth}", f"c{depth}", f"h{depth}"
        return helper.make_graph(
            nodes(h) + [helper.make_node("Identity", [c], [f"{c}o"])], f"level{depth}",
            [helper.make_tensor_value_info(i, TensorProto.INT64, []),
             helper.make_tensor_value_info(c, TensorProto.BOOL, []),
             helper.make_tensor_value_info(h, TensorProto.FLOAT, None)],
            [helper.make_tensor_value_info(f"{c}o", TensorProto.BOOL, []),
             helper.make_tensor_value_info(f"{h}o", TensorProto.FLOAT, None)])

    nested = level(0, lambda h: [helper.make_node("Relu", [h], [f"{h}o"])])
    for depth in range(1, 4):
        nested = level(depth, lambda h, inner=nested: [
            helper.make_node("Loop", ["trips", "", h], [f"{h}o"], name=f"loop{depth}", body=inner)])
    # Two scan inputs, one of 2 slices and one of 4: onnxruntime fails on it at run time.
    add = helper.make_graph(
        [helper.make_node("Add", ["a_t", "b_t"], ["s_t"])], "add",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [4]) for n in ("a_t", "b_t")],
        [helper.make_tensor_value_info("s_t", TensorProto.FLOAT, [4])])
    write("scan-ragged", [helper.make_node("Scan", ["x", "four"], ["y"], name="scan", body=add, num_scan_inputs=2)],
          [numpy_helper.from_array(np.ones((4, 4), np.float32), "four")],
          ort_fails={"x": np.ones((2, 4), np.float32)})
    # A Scan whose body is empty (its output is its input) inside a Loop: no loop-body node
    # to count, but each Scan is 2,049 nodes (a gather and a reshape a slice, a concat), and
    # 1024 trips of it two million; the bound on all the nodes of a model stops it.
    vi = helper.make_tensor_value_info
    passing = helper.make_graph([], "pass", [vi("s_in", TensorProto.FLOAT, [4])], [vi("s_in", TensorProto.FLOAT, [4])])
    scanning = helper.make_graph(
        [helper.make_node("Scan", ["rows"], ["scanned"], name="scan", body=passing, num_scan_inputs=1),
         helper.make_node("Identity", ["c"], ["co"]), helper.make_node("Identity", ["h"], ["ho"])],
        "scanning", [vi("i", TensorProto.INT64, []), vi("c", TensorProto.BOOL, []), vi("h", TensorProto.FLOAT, None)],
        [vi("co", TensorProto.BOOL, []), vi("ho", TensorProto.FLOAT, None)])
    write("scan-in-loop", [helper.make_node("Loop", ["trips", "", "x"], ["y"], name="loop", body=scanning)],
          [numpy_helper.from_array(np.array(1024, np.int64), "trips"),
           numpy_helper.from_array(np.ones((1024, 4), np.float32), "rows")])
    write("loop-nested", [helper.make_node("Loop", ["trips", "", "x"], ["y"], name="loop", body=nested)],
          [numpy_helper.from_array(np.array(1000, np.int64), "trips")])
    # An If decided at run time whose branches give values of different shapes: no `where`
    # selects between them (onnxruntime runs it; the output's shape depends on the data).
    reduced = helper.make_graph([helper.make_node("ReduceSum", ["x"], ["o"], keepdims=0)], "sum", [],
                                [helper.make_tensor_value_info("o", TensorProto.FLOAT, None)])
    write("if-branches-differ", sums + [helper.make_node("If", ["c"], ["y"], name="if", then_branch=arm("Relu"),
                                                         else_branch=reduced)],
          [numpy_helper.from_array(np.array(0, np.float32), "zero")])
    # A Loop whose condition is decided at run time and that scans out a value each
    # iteration: the scan output's length would depend on the data.
    scanning_body = helper.make_graph(
        [helper.make_node("ReduceSum", ["h"], ["hs"], keepdims=0), helper.make_node("Greater", ["hs", "zero"], ["more"]),
         helper.make_node("Relu", ["h"], ["h2"]), helper.make_node("Identity", ["h2"], ["h_scan"])], "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("c", TensorProto.BOOL, []),
         helper.make_tensor_value_info("h", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("more", TensorProto.BOOL, []),
         helper.make_tensor_value_info("h2", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("h_scan", TensorProto.FLOAT, None)])
    write("loop-run-time-scan", [helper.make_node("Loop", ["trips", "go", "x"], ["y", "ys"], name="loop",
                                                  body=scanning_body)],
          [numpy_helper.from_array(np.array(0, np.float32), "zero"), numpy_helper.from_array(np.array(4, np.int64), "trips"),
           numpy_helper.from_array(np.array(True), "go")])
    # Found by tests/all/onnx_fuzz.rs: an op given fewer inputs than it takes panicked in
    # shape inference.
    write("concat-no-inputs", [helper.make_node("Concat", [], ["y"], name="cat", axis=0)])
    # Add before opset 7 broadcast only with its `broadcast` attribute: not numpy's rules.
    write("opset-6-add", [helper.make_node("Add", ["x", "x"], ["y"], name="add")], opset=6)
    write("opset-29", [helper.make_node("Relu", ["x"], ["y"])], opset=29)
    # Invalid models meshc once imported with a meaning of its own guessing (a float or
    # string axis as the default, extra inputs ignored, a second definition renamed).
    def refused(name, nodes, **kw):
        write(name, nodes, ort_refuses=True, **kw)

    refused("float-axis", [helper.make_node("Softmax", ["x"], ["y"], name="softmax", axis=1.0)])
    refused("string-axis", [helper.make_node("Softmax", ["x"], ["y"], name="softmax", axis="1")])
    untyped = helper.make_node("Softmax", ["x"], ["y"], name="softmax", axis=1)
    untyped.attribute[0].type = onnx.AttributeProto.UNDEFINED
    refused("untyped-attribute", [untyped])
    refused("add-one-input", [helper.make_node("Add", ["x"], ["y"], name="add")])
    refused("add-three-inputs", [helper.make_node("Add", ["x", "x", "x"], ["y"], name="add")])
    refused("relu-two-inputs", [helper.make_node("Relu", ["x", "x"], ["y"], name="relu")])
    refused("relu-two-outputs", [helper.make_node("Relu", ["x"], ["y", "y2"], name="relu")])
    refused("unknown-attribute", [helper.make_node("Relu", ["x"], ["y"], name="relu", alpha=0.5)])
    refused("missing-attribute", [helper.make_node("Cast", ["x"], ["y"], name="cast")])
    refused("defined-twice", [helper.make_node("Relu", ["x"], ["y"], name="relu"),
                              helper.make_node("Neg", ["x"], ["y"], name="neg")])
    refused("overwrites-input", [helper.make_node("Relu", ["x"], ["x"], name="relu"),
                                 helper.make_node("Neg", ["x"], ["y"], name="neg")])
    refused("deprecated", [helper.make_node("Scatter", ["x", "idx", "x"], ["y"], name="scatter")],
            inits=[numpy_helper.from_array(np.zeros((2, 4), np.int64), "idx")])
    refused("too-new", [helper.make_node("Gelu", ["x"], ["y"], name="gelu")])
    # Sizes a tiny file asks for that no memory holds, refused in one line by the memory
    # budget (golden.rs checks them under --max-memory 1G) where meshc once hung, aborted or
    # grew for minutes.
    x4 = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 2, 4])
    feeds = {"x": np.ones((1, 1, 2, 4), np.float32)}
    resize = helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], name="resize")
    write("resize-huge-sizes", [resize], [ints("sizes", [1, 1, 2**40, 4])], inputs=[x4], ort_fails=feeds)
    for what, scale in [("infinite", np.inf), ("huge", 1e30)]:
        resize = helper.make_node("Resize", ["x", "", "scales"], ["y"], name="resize")
        scales = numpy_helper.from_array(np.array([1, 1, scale, 1], np.float32), "scales")
        write(f"resize-{what}-scale", [resize], [scales], inputs=[x4], ort_fails=feeds)
    tile = helper.make_node("Tile", ["x", "repeats"], ["y"], name="tile")
    write("tile-huge", [tile], [ints("repeats", [2**40, 1, 1, 1])], inputs=[x4], ort_fails=feeds)
    # Its input alone would be 64 GiB: onnxruntime cannot be given one to show it fails.
    big = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2**17, 2**17])
    write("eyelike-huge", [helper.make_node("EyeLike", ["x"], ["y"], name="eye")], inputs=[big])
    # Graphs nested 200 deep through If's then_branch: past prost's recursion limit, whose
    # error once named every level (a 2 KB line). Written as raw protobuf: the Python
    # protobuf library refuses to build messages this deep.
    def varint(n):
        out = b""
        while True:
            low, n = n & 0x7F, n >> 7
            if not n:
                return out + bytes([low])
            out += bytes([low | 0x80])

    def field(number, payload):
        return varint(number << 3 | 2) + varint(len(payload)) + payload

    g = b""
    for _ in range(200):
        attr = field(1, b"then_branch") + field(6, g) + varint(20 << 3) + varint(onnx.AttributeProto.GRAPH)
        g = field(1, field(4, b"If") + field(5, attr))
    with open(os.path.join(d, "onnx-deeply-nested.onnx"), "wb") as f:
        f.write(varint(1 << 3) + varint(8) + field(7, g))
    # Quantization parameters no quantizer writes: a scale that is zero, negative or not
    # finite, per-axis scales or zero points of the wrong length, and a uint8 zero point
    # whose int32_data holds 300. Each error names the tensor.
    def dequantize(name, scale, zp=None, axis=None, opset=13, x_type=TensorProto.UINT8, dims=(2, 4)):
        xq = helper.make_tensor_value_info("x", x_type, list(dims))
        ins = ["x", "scale"] + (["zp"] if zp is not None else [])
        attrs = {} if axis is None else {"axis": axis}
        inits = [numpy_helper.from_array(np.asarray(scale, np.float32), "scale")] + ([zp] if zp is not None else [])
        write(name, [helper.make_node("DequantizeLinear", ins, ["y"], name="dq", **attrs)], inits, inputs=[xq],
              opset=opset)

    u8 = lambda v, name="zp": numpy_helper.from_array(np.asarray(v, np.uint8), name)  # noqa: E731
    dequantize("dequantize-zero-scale", np.float32(0))
    dequantize("dequantize-negative-scale", [0.5, -0.25, 1, 1], u8([0, 0, 0, 0]), axis=1)
    dequantize("dequantize-nan-scale", np.float32(np.nan))
    dequantize("dequantize-infinite-scale", [1, np.inf], u8([0, 0]), axis=0)
    dequantize("dequantize-axis-length", [0.5, 0.5, 0.5], u8([0, 0, 0]), axis=1)
    dequantize("dequantize-zero-point-length", [0.5, 0.5, 0.5, 0.5], u8([0, 0]), axis=1)
    dequantize("dequantize-zero-point-type", np.float32(0.5), numpy_helper.from_array(np.int8(0), "zp"))
    dequantize("dequantize-opset-10-per-axis", [0.5, 0.5, 0.5, 0.5], u8([0, 0, 0, 0]), opset=10)
    wide = helper.make_tensor("zp", TensorProto.UINT8, [], [0])
    wide.int32_data[:] = [300]  # one value per entry, as the format stores 8-bit ints
    dequantize("dequantize-zero-point-range", np.float32(0.5), wide)
    quantize = helper.make_node("QuantizeLinear", ["x", "scale", "zp"], ["y"], name="q")
    write("quantize-zero-scale", [quantize], [numpy_helper.from_array(np.float32(0), "scale"), u8(3)])
    mmi = helper.make_node("MatMulInteger", ["a", "b", "a_zp"], ["y"], name="mmi")
    a_u8 = helper.make_tensor_value_info("a", TensorProto.UINT8, [2, 4])
    write("matmulinteger-zero-point-length", [mmi], [u8(np.zeros((4, 3)), "b"), u8([1, 2, 3], "a_zp")],
          inputs=[a_u8])
    qmm = helper.make_node("QLinearMatMul", ["a", "s", "a_zp", "b", "s", "b_zp", "y_s", "a_zp"], ["y"], name="qmm")
    # A ConvInteger whose sums (64·9 = 576 products of up to 248·255) can pass 2^24: no
    # integer conv to run it exactly.
    x4u8 = helper.make_tensor_value_info("x", TensorProto.UINT8, [1, 64, 5, 5])
    write("convinteger-wide", [helper.make_node("ConvInteger", ["x", "w", "x_zp"], ["y"], name="convi")],
          [u8(np.full((2, 64, 3, 3), 255), "w"), u8(7, "x_zp")], inputs=[x4u8])
    write("qlinearmatmul-negative-scale", [qmm], [u8(np.zeros((4, 3)), "b"), u8(0, "a_zp"), u8(0, "b_zp"),
          numpy_helper.from_array(np.float32(0.5), "s"), numpy_helper.from_array(np.float32(-1), "y_s")],
          inputs=[a_u8])


def positions():
    """Lengths read from shapes, as BERT exports take their positions: the position table
    sliced to Shape(input_ids)[1] (BertEmbeddings' absolute positions), a position_ids
    buffer sliced so and gathered (transformers' exports), Range(0, seq) gathered, and a
    Reshape to Concat(Shape[0], Shape[1], [2, 4]). Imported with seq ranged, each length is
    the sequence's at every size, not the number it is at the example. Its own generator, so
    that the other models' bytes stay as they were."""
    r = np.random.default_rng(33)
    table = lambda name, shape: numpy_helper.from_array((r.standard_normal(shape) * 0.5).astype(np.float32), name)
    ids = helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"])
    outs = [helper.make_tensor_value_info("emb", TensorProto.FLOAT, ["batch", "seq", 8]),
            helper.make_tensor_value_info("pairs", TensorProto.FLOAT, ["batch", "seq", 2])]
    inits = [table("word", (40, 8)), table("position", (24, 8)), table("position2", (24, 8)), table("ranged", (24, 8)),
             ints("position_ids", np.arange(24).reshape(1, 24))]
    n = [node("Shape", ["input_ids"], ["/Shape_output_0"]),
         const("/zero", np.int64(0)), const("/one", np.int64(1)), const("/axes0", np.array([0], dtype=np.int64)),
         node("Gather", ["/Shape_output_0", "/zero"], ["/batch_output_0"], axis=0),
         node("Gather", ["/Shape_output_0", "/one"], ["/seq_output_0"], axis=0),
         node("Unsqueeze", ["/batch_output_0", "/axes0"], ["/batch1_output_0"]),
         node("Unsqueeze", ["/seq_output_0", "/axes0"], ["/seq1_output_0"]),
         node("Gather", ["word", "input_ids"], ["/words_output_0"], axis=0),
         node("Slice", ["position", "/axes0", "/seq1_output_0", "/axes0"], ["/absolute_output_0"]),
         const("/axes1", np.array([1], dtype=np.int64)),
         node("Slice", ["position_ids", "/axes0", "/seq1_output_0", "/axes1"], ["/ids_output_0"]),
         node("Gather", ["position2", "/ids_output_0"], ["/buffered_output_0"], axis=0),
         node("Range", ["/zero", "/seq_output_0", "/one"], ["/range_output_0"]),
         node("Gather", ["ranged", "/range_output_0"], ["/by_range_output_0"], axis=0),
         node("Add", ["/words_output_0", "/absolute_output_0"], ["/sum1_output_0"]),
         node("Add", ["/sum1_output_0", "/buffered_output_0"], ["/sum2_output_0"]),
         node("Add", ["/sum2_output_0", "/by_range_output_0"], ["emb"]),
         const("/split", np.array([2, 4], dtype=np.int64)),
         node("Concat", ["/batch1_output_0", "/seq1_output_0", "/split"], ["/target_output_0"], axis=0),
         node("Reshape", ["emb", "/target_output_0"], ["/split4_output_0"]),
         const("/minus1", np.array([-1], dtype=np.int64)),
         node("ReduceSum", ["/split4_output_0", "/minus1"], ["pairs"], keepdims=0)]
    g = helper.make_graph(n, "positions", [ids], outs, inits)
    save("positions", g, {"input_ids": r.integers(0, 40, (3, 7), dtype=np.int64)}, {"batch": 3, "seq": 7})


def filled():
    """Constants of a shape read from a tensor, as exporters write masks and default
    states: ConstantOfShape(Shape(x)) and Expand of a vector and of a scalar to Shape(x).
    Imported with batch and seq ranged, each follows x's shape at every size (a
    broadcast_like of x), not the shape it has at the example. Its own generator, so that
    the other models' bytes stay as they were."""
    r = np.random.default_rng(34)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 4])
    outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", 4]),
            helper.make_tensor_value_info("count", TensorProto.INT64, ["batch", "seq", 4])]
    inits = [numpy_helper.from_array((r.standard_normal(4) * 0.5).astype(np.float32), "bias")]
    n = [node("Shape", ["x"], ["/Shape_output_0"]),
         helper.make_node("ConstantOfShape", ["/Shape_output_0"], ["/half_output_0"], name="/ConstantOfShape",
                          value=numpy_helper.from_array(np.array([0.5], dtype=np.float32))),
         node("Expand", ["bias", "/Shape_output_0"], ["/bias_output_0"]),
         const("/two", np.float32(2.0)),
         node("Expand", ["/two", "/Shape_output_0"], ["/twos_output_0"]),
         node("Mul", ["x", "/half_output_0"], ["/scaled_output_0"]),
         node("Add", ["/scaled_output_0", "/bias_output_0"], ["/biased_output_0"]),
         node("Sub", ["/biased_output_0", "/twos_output_0"], ["y"]),
         helper.make_node("ConstantOfShape", ["/Shape_output_0"], ["/ones_output_0"], name="/ConstantOfShape_1",
                          value=numpy_helper.from_array(np.array([1], dtype=np.int64))),
         const("/steps", np.arange(4, dtype=np.int64)),
         node("Expand", ["/steps", "/Shape_output_0"], ["/steps_output_0"]),
         node("Add", ["/ones_output_0", "/steps_output_0"], ["count"])]
    g = helper.make_graph(n, "filled", [x], outs, inits)
    save("filled", g, {"x": r.standard_normal((3, 5, 4)).astype(np.float32)}, {"batch": 3, "seq": 5})


def other_sizes(name, sizes):
    """onnxruntime's outputs of testdata/onnx/NAME at each `BxS` (its `batch` and `seq`
    dims), for inputs drawn from a generator seeded by the size."""
    d = os.path.join(OUT, name)
    model = onnx.load(os.path.join(d, "model.onnx"))
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for size in sizes:
        b, s = map(int, size.split("x"))
        r = np.random.default_rng(b * 1000 + s)
        inputs = {}
        for i in model.graph.input:
            dims = [{"batch": b, "seq": s}.get(x.dim_param, x.dim_value) for x in i.type.tensor_type.shape.dim]
            inputs[i.name] = r.standard_normal(dims).astype(np.float32)
        at = os.path.join(d, "sizes", size)
        for sub, names, values in [("inputs", inputs, inputs.values()),
                                   ("expected", [o.name for o in sess.get_outputs()], sess.run(None, inputs))]:
            os.makedirs(os.path.join(at, sub), exist_ok=True)
            for k, v in zip(names, values):
                np.save(os.path.join(at, sub, k + ".npy"), v)


def yolov8n(out, size=640):
    """YOLOv8n's layers (ultralytics' yolov8.yaml at width 0.25, depth 0.33) at batch 1:
    Conv = conv-BN-SiLU (Sigmoid and Mul, as torch.onnx writes SiLU), C2f blocks (a 1x1
    conv split in two, bottlenecks on the last half, all halves concatenated into a 1x1
    conv), SPPF (three chained 5x5 max pools), the upsample-and-concat neck and the detect
    head: per level a box branch (64 = 4 sides x 16 bins) and a class branch (80), their
    outputs concatenated over the levels, the bins' softmax expectation (DFL, a 1x1 conv of
    weights 0..15) and the class sigmoids."""
    x = helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, size, size])
    n, inits = [], []

    def conv(name, inp, cin, cout, k, stride=1):
        o = f"/{name}/act/Mul_output_0"
        conv_bn(n, inits, name + ".conv", inp, o, cin, cout, k, stride=stride, act="silu")
        return o

    def c2f(name, inp, cin, cout, blocks, shortcut):
        c = cout // 2
        a = conv(name + ".cv1", inp, cin, 2 * c, 1)
        halves = [f"/{name}/Split_output_0", f"/{name}/Split_output_1"]
        n.append(helper.make_node("Split", [a, f"{name}.split"], halves, axis=1, name=f"/{name}/Split"))
        inits.append(ints(f"{name}.split", [c, c]))
        ys = list(halves)
        for i in range(blocks):
            m = f"{name}.m.{i}"
            h = conv(m + ".cv2", conv(m + ".cv1", ys[-1], c, c, 3), c, c, 3)
            if shortcut:
                s = f"/{m}/Add_output_0"
                n.append(node("Add", [ys[-1], h], [s]))
                h = s
            ys.append(h)
        cat = f"/{name}/Concat_output_0"
        n.append(node("Concat", ys, [cat], axis=1))
        return conv(name + ".cv2", cat, (2 + blocks) * c, cout, 1)

    def up(name, inp):
        o = f"/{name}/Resize_output_0"
        n.append(helper.make_node("Resize", [inp, "", "/up_scales"], [o], mode="nearest",
                                  coordinate_transformation_mode="asymmetric", nearest_mode="floor", name=f"/{name}"))
        return o

    def cat(name, ins, axis=1):
        o = f"/{name}/Concat_output_0"
        n.append(node("Concat", ins, [o], axis=axis))
        return o

    inits.append(numpy_helper.from_array(np.array([1, 1, 2, 2], dtype=np.float32), "/up_scales"))
    b0 = conv("model.0", "images", 3, 16, 3, 2)
    b1 = conv("model.1", b0, 16, 32, 3, 2)
    b2 = c2f("model.2", b1, 32, 32, 1, True)
    b3 = conv("model.3", b2, 32, 64, 3, 2)
    p3 = c2f("model.4", b3, 64, 64, 2, True)
    b5 = conv("model.5", p3, 64, 128, 3, 2)
    p4 = c2f("model.6", b5, 128, 128, 2, True)
    b7 = conv("model.7", p4, 128, 256, 3, 2)
    b8 = c2f("model.8", b7, 256, 256, 1, True)
    s1 = conv("model.9.cv1", b8, 256, 128, 1)
    pools = [s1]
    for i in range(3):
        o = f"/model.9/m_{i}/MaxPool_output_0"
        n.append(node("MaxPool", [pools[-1]], [o], kernel_shape=[5, 5], strides=[1, 1], pads=[2, 2, 2, 2]))
        pools.append(o)
    p5 = conv("model.9.cv2", cat("model.9", pools), 512, 256, 1)
    h12 = c2f("model.12", cat("model.11", [up("model.10", p5), p4]), 384, 128, 1, False)
    h15 = c2f("model.15", cat("model.14", [up("model.13", h12), p3]), 192, 64, 1, False)
    h18 = c2f("model.18", cat("model.17", [conv("model.16", h15, 64, 64, 3, 2), h12]), 192, 128, 1, False)
    h21 = c2f("model.21", cat("model.20", [conv("model.19", h18, 128, 128, 3, 2), p5]), 384, 256, 1, False)
    levels = []
    for i, (f, c) in enumerate([(h15, 64), (h18, 128), (h21, 256)]):
        branches = []
        for cv, width, outs in [("cv2", 64, 64), ("cv3", 80, 80)]:
            name = f"model.22.{cv}.{i}"
            h = conv(name + ".1", conv(name + ".0", f, c, width, 3), width, width, 3)
            o = f"/{name}/2/Conv_output_0"
            inits += [init(name + ".2.weight", [outs, width, 1, 1], width ** -0.5),
                      init(name + ".2.bias", [outs], 0.1)]
            n.append(node("Conv", [h, name + ".2.weight", name + ".2.bias"], [o], kernel_shape=[1, 1]))
            branches.append(o)
        lv = cat(f"model.22.level{i}", branches)
        r = f"/model.22/Reshape_{i}_output_0"
        n.append(node("Reshape", [lv, "/head_shape"], [r]))
        levels.append(r)
    inits += [ints("/head_shape", [1, 144, -1]), ints("/head_split", [64, 80]),
              ints("/dfl_shape", [1, 4, 16, -1]), ints("/box_shape", [1, 4, -1]),
              numpy_helper.from_array(np.arange(16, dtype=np.float32).reshape(1, 16, 1, 1), "model.22.dfl.conv.weight")]
    heads = cat("model.22.levels", levels, axis=2)
    n += [helper.make_node("Split", [heads, "/head_split"], ["/model.22/box", "/model.22/cls"], axis=1,
                           name="/model.22/Split"),
          node("Reshape", ["/model.22/box", "/dfl_shape"], ["/model.22/dfl/Reshape_output_0"]),
          node("Transpose", ["/model.22/dfl/Reshape_output_0"], ["/model.22/dfl/Transpose_output_0"],
               perm=[0, 2, 1, 3]),
          node("Softmax", ["/model.22/dfl/Transpose_output_0"], ["/model.22/dfl/Softmax_output_0"], axis=1),
          node("Conv", ["/model.22/dfl/Softmax_output_0", "model.22.dfl.conv.weight"],
               ["/model.22/dfl/conv/Conv_output_0"], kernel_shape=[1, 1]),
          node("Reshape", ["/model.22/dfl/conv/Conv_output_0", "/box_shape"], ["boxes"]),
          node("Sigmoid", ["/model.22/cls"], ["scores"])]
    anchors = sum((size // s) ** 2 for s in (8, 16, 32))
    y = [helper.make_tensor_value_info("boxes", TensorProto.FLOAT, [1, 4, anchors]),
         helper.make_tensor_value_info("scores", TensorProto.FLOAT, [1, 80, anchors])]
    g = helper.make_graph(n, "yolov8n", [x], y, inits)
    save("yolov8n", g, {"images": rng.random((1, 3, size, size)).astype(np.float32)}, {}, out=out)


def resnet50(out, size=224):
    """torchvision's ResNet-50 (v1.5: the stride on the 3x3 conv) at batch 1: the 7x7/2
    stem, a 3x3/2 max pool, bottlenecks (1x1, 3x3, 1x1 x4, each conv-BN, the first of a
    stage with a strided 1x1 conv-BN downsample) in stages of 3, 4, 6 and 3, global average
    pool and the 1000-way fc."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, size, size])
    y = helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 1000])
    n, inits = [], []
    conv_bn(n, inits, "conv1", "x", "/relu/Relu_output_0", 3, 64, 7, stride=2, act="relu", pads=[3, 3, 3, 3])
    n.append(node("MaxPool", ["/relu/Relu_output_0"], ["/maxpool/MaxPool_output_0"], kernel_shape=[3, 3],
                  strides=[2, 2], pads=[1, 1, 1, 1]))
    h, cin = "/maxpool/MaxPool_output_0", 64
    for layer, (blocks, width, stride) in enumerate([(3, 64, 1), (4, 128, 2), (6, 256, 2), (3, 512, 2)], 1):
        for b in range(blocks):
            p = f"layer{layer}.{b}"
            s = stride if b == 0 else 1
            conv_bn(n, inits, p + ".conv1", h, f"/{p}/relu/Relu_output_0", cin, width, 1, act="relu")
            conv_bn(n, inits, p + ".conv2", f"/{p}/relu/Relu_output_0", f"/{p}/relu_1/Relu_output_0", width, width, 3,
                    stride=s, act="relu")
            conv_bn(n, inits, p + ".conv3", f"/{p}/relu_1/Relu_output_0", f"/{p}/bn3/BN_output_0", width, 4 * width, 1)
            skip = h
            if b == 0:
                skip = f"/{p}/downsample/BN_output_0"
                conv_bn(n, inits, p + ".downsample.0.conv", h, skip, cin, 4 * width, 1, stride=s, pads=[0, 0, 0, 0])
            n += [node("Add", [f"/{p}/bn3/BN_output_0", skip], [f"/{p}/Add_output_0"]),
                  node("Relu", [f"/{p}/Add_output_0"], [f"/{p}/relu_2/Relu_output_0"])]
            h, cin = f"/{p}/relu_2/Relu_output_0", 4 * width
    n += [node("GlobalAveragePool", [h], ["/avgpool/GlobalAveragePool_output_0"]),
          node("Flatten", ["/avgpool/GlobalAveragePool_output_0"], ["/Flatten_output_0"], axis=1),
          node("Gemm", ["/Flatten_output_0", "fc.weight", "fc.bias"], ["logits"], alpha=1.0, beta=1.0, transB=1)]
    inits += [init("fc.weight", [1000, 2048], 2048 ** -0.5), init("fc.bias", [1000], 0.05)]
    g = helper.make_graph(n, "resnet50", [x], [y], inits)
    save("resnet50", g, {"x": rng.standard_normal((1, 3, size, size)).astype(np.float32)}, {}, out=out)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--bench":
        # The bench's 6-layer, 384-wide encoder (all-MiniLM-L6-v2's shapes), too big to
        # commit (11 M weights): `cargo bench --bench onnx` writes it under target/.
        encoder("encoder_6x384", hid=384, heads=12, ffn=1536, layers=6, batch=2, seq=32, out=sys.argv[2])
        yolov8n(sys.argv[2])
        resnet50(sys.argv[2])
        sys.exit(0)
    if len(sys.argv) >= 4 and sys.argv[1] == "--sizes":
        other_sizes(sys.argv[2], sys.argv[3:])
        sys.exit(0)
    if len(sys.argv) == 3 and sys.argv[1] == "--minilm-l6":
        # all-MiniLM-L6-v2's shapes whole: BERT's embeddings (30522 words) and 6 layers,
        # seeded weights: `cargo bench --bench int8` compares its artifact in each
        # --weights-dtype.
        encoder("minilm_l6", hid=384, heads=12, ffn=1536, layers=6, batch=2, seq=32, out=sys.argv[2], vocab=30522)
        sys.exit(0)
    if len(sys.argv) == 3 and sys.argv[1] == "--minilm-l3":
        # paraphrase-MiniLM-L3-v2's encoder shapes (3 layers, 384 wide, 12 heads, seeded
        # weights) at B=1, T=16: python/bench.py calls it from Python beside onnxruntime.
        encoder("minilm_l3", hid=384, heads=12, ffn=1536, layers=3, batch=1, seq=16, out=sys.argv[2])
        sys.exit(0)
    mlp()
    encoder()
    shapes()
    after_shapes = rng.bit_generator.state
    opset_v2()
    # The CNN blocks were first written by a generator without opset_v2: their weights and
    # inputs draw from where shapes() left off, so that regenerating keeps their bytes.
    rng.bit_generator.state = after_shapes
    resnet_block()
    mobilenet_block()
    gpt2_block()
    half_weights()
    torch_names()
    double_consts()
    outputs()
    numerics()
    input_default()
    bounded()
    control_if()
    control_loop()
    control_scan()
    control_runtime()
    same_node_names()
    unsized_dims()
    shared_dim_name()
    recurrent_lstm()
    recurrent_gru_rnn()
    quantized()
    integer_products()
    positions()
    filled()
    bad()
    total = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(OUT) for f in fs)
    print(f"wrote {OUT} ({total} bytes)", file=sys.stderr)
