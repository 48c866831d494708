#!/usr/bin/env python3
"""Exports real PyTorch models with torch.onnx (the TorchScript exporter, dynamo=False) into
target/torch-models/: torchvision's ResNet-18/50 and MobileNetV2/V3, and transformers'
BERT, DistilBERT, RoBERTa, a MiniLM-shaped BERT and GPT-2 (the full-sequence graph with its
causal mask), and a small decoder whose causal mask is a Trilu; each built from its config
with random weights (nothing is downloaded) and kept small except where the shape is the
point (ResNet-50, MiniLM). Some are exported again without constant folding, and with
the torch.export-based exporter (dynamo=True).

Each export goes to OUT/NAME-opN/ (NAME-nofold-opN, NAME-dynamo-opN) in testdata/onnx's layout: model.onnx, inputs/*.npy,
expected/*.npy (onnxruntime's outputs), dims.txt (the `--dim NAME=N` its dynamic axes need)
and, for some, layouts/*.json. tools/check_torch_models.py runs them through meshc.

Needs torch, torchvision, transformers, onnx, onnxscript and onnxruntime: `make onnx-models` makes a
venv under target/ with them. Usage: export_torch_models.py [OUT] [--only NAME,...]
"""

import argparse
import inspect
import json
import os
import sys
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import torch

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "target", "torch-models")


def returning_tuple(model, input_names, output_names):
    """Makes a transformers model take its inputs positionally and return plain tensors (the
    exporter traces positional inputs and tuple outputs). Its forward is replaced on the
    instance rather than wrapped in another module, which would prefix every weight's name."""
    forward = model.forward

    def positional(*args):
        out = forward(**dict(zip(input_names, args)), return_dict=True)
        return tuple(out[k] for k in output_names)

    model.forward = positional
    return model


def vision(factory, size):
    """A torchvision classifier (random weights, 10 classes), input [batch, 3, size, size]."""

    def build(opset):
        import torchvision

        model = getattr(torchvision.models, factory)(weights=None, num_classes=10)
        # Fresh batch norms (mean 0, variance 1) leave a deep random net's logits near 1e-10,
        # which would hide any error: their statistics are gathered from random batches as
        # training gathers them, and their affine parameters drawn, so activations stay O(1).
        for bn in (m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)):
            bn.momentum = None
            bn.weight.data.uniform_(0.5, 1.5)
            bn.bias.data.normal_(0, 0.2)
        model.train()
        with torch.no_grad():
            for _ in range(2):
                model(torch.randn(4, 3, size, size))
        return model, lambda batch: {"x": torch.randn(batch, 3, size, size)}, ["logits"], \
            {"x": {0: "batch"}, "logits": {0: "batch"}}, {"batch": 2}

    return build


def text(cls_name, config_name, output_names, token_types=False, **config):
    """A transformers model from a config (random weights), inputs [batch, seq] of token ids
    (and token types), an attention mask padding the ends of rows 1 and 2; its default (sdpa) attention, or the
    eager one where the opset has no export of sdpa."""

    def build(opset):
        import transformers

        # scaled_dot_product_attention exports from opset 14; before it, the eager attention.
        cfg = getattr(transformers, config_name)(**config, attn_implementation="sdpa" if opset >= 14 else "eager")
        model = getattr(transformers, cls_name)(cfg)
        batch, seq = 3, 9

        def inputs(batch, seq=seq):
            ids = torch.randint(3, cfg.vocab_size, (batch, seq))
            mask = torch.ones(batch, seq, dtype=torch.int64)
            mask[1:, seq - 2:] = 0
            mask[2:, 3:] = 0
            feeds = {"input_ids": ids, "attention_mask": mask}
            if token_types:
                types = torch.zeros(batch, seq, dtype=torch.int64)
                types[:, 4:] = 1
                feeds["token_type_ids"] = types
            return feeds

        names = list(inputs(1))
        axes = {k: {0: "batch", 1: "seq"} for k in names}
        for o in output_names:
            axes[o] = {0: "batch"} if o == "pooler_output" else {0: "batch", 1: "seq"}
        # The trace (batch - 1) is also shorter.
        make = lambda b: inputs(b, seq if b == batch else seq - 2)  # noqa: E731
        return returning_tuple(model, names, output_names), make, output_names, axes, {"batch": batch, "seq": seq}

    return build


class Block(torch.nn.Module):
    """A pre-norm decoder block: attention through scaled_dot_product_attention with an
    additive mask, then a GELU (tanh form) MLP. torch.nn.MultiheadAttention is not used: its
    TorchScript export bakes the traced sequence length into its reshapes."""

    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln_1, self.ln_2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.qkv, self.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.fc, self.out = torch.nn.Linear(d, 2 * d), torch.nn.Linear(2 * d, d)

    def forward(self, x, mask):
        b, s, d = x.shape
        q, k, v = (t.reshape(b, s, self.heads, -1).transpose(1, 2) for t in self.qkv(self.ln_1(x)).chunk(3, -1))
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, d))
        return x + self.out(torch.nn.functional.gelu(self.fc(self.ln_2(x)), approximate="tanh"))


class CausalLM(torch.nn.Module):
    """A decoder-only language model whose causal mask is made the way
    nn.Transformer.generate_square_subsequent_mask makes it: triu of a [seq, seq] tensor of
    -inf above the diagonal (Trilu, which torch exports from opset 14, and an infinite
    ConstantOfShape)."""

    def __init__(self, vocab=512, d=64, heads=4, layers=2):
        super().__init__()
        self.embed, self.pos = torch.nn.Embedding(vocab, d), torch.nn.Embedding(64, d)
        self.blocks = torch.nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.head = torch.nn.Linear(d, vocab)

    def forward(self, input_ids):
        seq = input_ids.shape[1]
        mask = torch.triu(torch.full((seq, seq), float("-inf")), diagonal=1)
        h = self.embed(input_ids) + self.pos(torch.arange(seq))
        for block in self.blocks:
            h = block(h, mask)
        return self.head(h)


def causal_lm(opset):
    """CausalLM, as `vision` and `text` build theirs: (model, inputs of a batch size,
    output names, dynamic axes, the dims checked)."""
    make = lambda b: {"input_ids": torch.randint(0, 512, (b, 9 if b == 3 else 7))}  # noqa: E731
    axes = {"input_ids": {0: "batch", 1: "seq"}, "logits": {0: "batch", 1: "seq"}}
    return CausalLM(), make, ["logits"], axes, {"batch": 3, "seq": 9}


SMALL_BERT = dict(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                  intermediate_size=128, max_position_embeddings=64)
# Megatron-style tensor parallelism: the Q/K/V and first FFN projections split by output
# column, the attention output and second FFN projection by input row. torch.onnx writes the
# transposed Linear weights as new initializers; meshc names them after the MatMul reading
# them (NODE.B).
MEGATRON_BERT = {
    "encoder.layer.*.attention.self.*.MatMul.B": [None, "model"],
    "encoder.layer.*.intermediate.dense.MatMul.B": [None, "model"],
    "encoder.layer.*.attention.output.dense.MatMul.B": ["model", None],
    "encoder.layer.*.output.dense.MatMul.B": ["model", None],
}

# name: (builder, opsets, layouts {file stem: spec})
MODELS = {
    "resnet18": (vision("resnet18", 64), [13, 17, 18],
                 {"dp-2": {"mesh": {"shape": [2], "axes": ["data"]}, "rules": {"batch": "data"}}}),
    "resnet50": (vision("resnet50", 64), [17], {}),
    "mobilenet_v2": (vision("mobilenet_v2", 64), [13, 17], {}),
    "mobilenet_v3_small": (vision("mobilenet_v3_small", 64), [15, 16, 17, 18], {}),
    "mobilenet_v3_large": (vision("mobilenet_v3_large", 64), [17], {}),
    "bert": (text("BertModel", "BertConfig", ["last_hidden_state", "pooler_output"], token_types=True,
                  **SMALL_BERT), [13, 14, 15, 16, 17, 18], {}),
    "distilbert": (text("DistilBertModel", "DistilBertConfig", ["last_hidden_state"], vocab_size=512, dim=64,
                        n_layers=2, n_heads=4, hidden_dim=128, max_position_embeddings=64), [13, 17], {}),
    "roberta": (text("RobertaModel", "RobertaConfig", ["last_hidden_state"], **SMALL_BERT), [17, 18], {}),
    "minilm": (text("BertModel", "BertConfig", ["last_hidden_state"], token_types=True, vocab_size=1024,
                    hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536,
                    max_position_embeddings=128), [17],
               {"megatron-4": {"mesh": {"shape": [4], "axes": ["model"]}, "layouts": MEGATRON_BERT}}),
    "gpt2": (text("GPT2LMHeadModel", "GPT2Config", ["logits"], vocab_size=512, n_embd=64, n_layer=2, n_head=4,
                  n_positions=64, use_cache=False), [13, 14, 15, 16, 17, 18], {}),
    "causal_lm": (causal_lm, [14, 17, 18], {}),
}


# Exported a second time without the exporter's constant folding (`-nofold`), as
# `do_constant_folding=False` writes them: batch norms as BatchNormalization nodes, Linear
# weights behind Transposes, the attention scale as a double Sqrt.
NO_FOLDING = {"resnet18": 17, "mobilenet_v3_small": 17, "bert": 17, "distilbert": 13, "gpt2": 18, "causal_lm": 17}
# And with the torch.export-based exporter (`-dynamo`, torch.onnx's default since 2.9): its
# own decompositions (GatherND, Max, ReduceMean for pooling), dims named s21, s50, ...,
# weights it made named val_N.
DYNAMO = {"resnet18": 18, "mobilenet_v3_small": 18, "bert": 20, "gpt2": 18, "roberta": 18, "minilm": 18,
          "causal_lm": 18}


def export(name, opset, out, variant=""):
    """One export into OUT/NAME[-VARIANT]-opOPSET; variant is "", "nofold" or "dynamo"."""
    build, _, layouts = MODELS[name]
    torch.manual_seed(sum(map(ord, name)))
    model, make_inputs, output_names, axes, dims = build(opset)
    model.eval()
    # Traced at other sizes than the checked ones, so that a size the trace baked in
    # shows up as a wrong result rather than passing by coincidence.
    trace = make_inputs(dims["batch"] - 1)
    inputs = make_inputs(dims["batch"])
    d = os.path.join(out, f"{name}{'-' + variant if variant else ''}-op{opset}")
    for sub in ["inputs", "expected", "layouts"]:
        os.makedirs(os.path.join(d, sub), exist_ok=True)
    path = os.path.join(d, "model.onnx")
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        if variant == "dynamo":
            # Every axis named in `axes` dynamic; a model taking *args (`returning_tuple`)
            # gets them as its one parameter.
            shapes = [{i: torch.export.Dim.AUTO for i in axes[k]} for k in trace]
            params = list(inspect.signature(model.forward).parameters.values())
            var = params[0].kind == inspect.Parameter.VAR_POSITIONAL
            dynamic = {params[0].name: tuple(shapes)} if var else dict(zip((p.name for p in params), shapes))
            torch.onnx.export(model, tuple(trace.values()), path, dynamo=True, opset_version=opset,
                              input_names=list(trace), output_names=output_names, dynamic_shapes=dynamic,
                              external_data=False, verbose=False)
        else:
            torch.onnx.export(model, tuple(trace.values()), path, dynamo=False, opset_version=opset,
                              input_names=list(trace), output_names=output_names, dynamic_axes=axes,
                              do_constant_folding=variant != "nofold")
    exported = onnx.load(path)
    onnx.checker.check_model(exported, full_check=True)
    feeds = {k: v.numpy() for k, v in inputs.items()}
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    for k, v in feeds.items():
        np.save(os.path.join(d, "inputs", k + ".npy"), v)
    for o, v in zip(sess.get_outputs(), sess.run(None, feeds)):
        np.save(os.path.join(d, "expected", o.name + ".npy"), v)
    # The dims as the model names them (torch.export names its own: s21, s50, ...).
    named = {}
    for i in exported.graph.input:
        if i.name in feeds:
            for dim, size in zip(i.type.tensor_type.shape.dim, feeds[i.name].shape):
                if dim.dim_param:
                    named[dim.dim_param] = size
    assert set(named.values()) <= set(dims.values()), (named, dims)
    with open(os.path.join(d, "dims.txt"), "w") as f:
        f.write("".join(f"{k}={v}\n" for k, v in named.items()))
    for stem, spec in layouts.items():
        # A rule names a dim as the checked dims do (batch); torch.export names it its own way.
        if "rules" in spec:
            rules = {k: axis for dim, axis in spec["rules"].items() for k, n in named.items() if n == dims[dim]}
            spec = {**spec, "rules": rules}
        with open(os.path.join(d, "layouts", stem + ".json"), "w") as f:
            json.dump({"format": "meshc-layout/1", **spec}, f, indent=1)
    return d


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out", nargs="?", default=OUT)
    ap.add_argument("--only", help="comma-separated model names")
    args = ap.parse_args()
    names = args.only.split(",") if args.only else list(MODELS)
    for name in names:
        exports = [(opset, "") for opset in MODELS[name][1]]
        exports += [(NO_FOLDING[name], "nofold")] if name in NO_FOLDING else []
        exports += [(DYNAMO[name], "dynamo")] if name in DYNAMO else []
        for opset, variant in exports:
            d = export(name, opset, args.out, variant)
            size = os.path.getsize(os.path.join(d, "model.onnx"))
            print(f"exported {d} ({size / 1e6:.1f} MB)", file=sys.stderr)


if __name__ == "__main__":
    main()
