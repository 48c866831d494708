#!/usr/bin/env python3
"""Exports two tiny decoders as people export them for generation: one decode step with the
KV cache as `past_key_values.N.key/value` inputs and `present.N.key/value` outputs (the
naming of optimum's exports), through torch.onnx's TorchScript exporter. Each is built from a
transformers config with seeded random weights (nothing is downloaded):

- gpt2: GPT2LMHeadModel, learned positions, tied embeddings;
- llama: LlamaForCausalLM, rotary positions, grouped-query attention (4 query heads over 2
  key/value heads), RMSNorm and a SwiGLU MLP.

For each, OUT/NAME/ gets model.onnx, layouts/heads-2.json (and heads-2-hosts.json, its
devices over two MPI hosts), prompt.npy (int64 [2, 5]) and greedy.npy: the 32 ids
transformers' `generate()` picks greedily on torch with its own KV cache. The script checks
that onnxruntime, stepping the exported file with past/present, picks the same ids, and that
at every step the top logit leads the next by more than 1e-3 (so f32 rounding in another
order cannot flip a pick). tests/all/generate.rs runs `meshc generate` on each file.

Needs torch, transformers, onnx and onnxruntime: the venv of `make onnx-models`.
Usage: export_decoders.py [OUT]
"""

import json
import os
import sys
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import torch
import transformers

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "testdata", "onnx_decoders")
NEW_TOKENS = 32
PROMPT = (2, 5)
MARGIN = 1e-3

# Megatron-style head splits over two devices, naming the weights as meshc imports them:
# the caches by heads, q/k/v by columns, the output projection and the MLP's second
# projection by rows.
HEADS_2 = {
    "gpt2": {
        "model.transformer.h.*.attn.c_attn.weight": [None, "model"],
        "model.transformer.h.*.attn.c_proj.weight": ["model", None],
        "model.transformer.h.*.mlp.c_fc.weight": [None, "model"],
        "model.transformer.h.*.mlp.c_proj.weight": ["model", None],
        "past_key_values.*": [None, "model", None, None],
    },
    "llama": {
        "model.model.layers.*.self_attn.[qkv]_proj.MatMul.B": [None, "model"],
        "model.model.layers.*.self_attn.o_proj.MatMul.B": ["model", None],
        "model.model.layers.*.mlp.gate_proj.MatMul.B": [None, "model"],
        "model.model.layers.*.mlp.up_proj.MatMul.B": [None, "model"],
        "model.model.layers.*.mlp.down_proj.MatMul.B": ["model", None],
        "past_key_values.*": [None, "model", None, None],
    },
}

CONFIGS = {
    "gpt2": lambda: transformers.GPT2Config(
        vocab_size=128, n_embd=64, n_layer=2, n_head=4, n_positions=64, initializer_range=0.2,
        attn_implementation="eager"),
    "llama": lambda: transformers.LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, rope_theta=10000.0, initializer_range=0.2,
        tie_word_embeddings=False, attn_implementation="eager"),
}


class Step(torch.nn.Module):
    """One decode step with the cache as plain tensors: (ids, mask, positions, k0, v0, k1, ...)
    in, (logits, present k0, v0, ...) out."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, position_ids, *past):
        cache = transformers.DynamicCache(config=self.model.config)
        # The layers are filled by hand: `update` on an empty layer would trace a concat
        # with an empty tensor before the model's own.
        for i, layer in enumerate(cache.layers):
            layer.keys, layer.values = past[2 * i], past[2 * i + 1]
            layer.device, layer.dtype, layer.is_initialized = past[2 * i].device, past[2 * i].dtype, True
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         past_key_values=cache, use_cache=True, return_dict=True)
        present = [t for layer in out.past_key_values.layers for t in (layer.keys, layer.values)]
        return (out.logits, *present)


def names(layers):
    past = [f"past_key_values.{i}.{kv}" for i in range(layers) for kv in ("key", "value")]
    present = [f"present.{i}.{kv}" for i in range(layers) for kv in ("key", "value")]
    return past, present


def export(model, path):
    cfg = model.config
    layers, kv_heads = cfg.num_hidden_layers, getattr(cfg, "num_key_value_heads", cfg.num_attention_heads)
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    past_names, present_names = names(layers)
    # Traced at batch 3 and a past of 4, with one row padded on the left, so that the mask
    # path is traced and no size of the checked runs is baked in by coincidence.
    batch, past_len = 3, 4
    mask = torch.ones(batch, past_len + 1, dtype=torch.int64)
    mask[1, 0] = 0
    args = (torch.randint(0, cfg.vocab_size, (batch, 1)), mask, torch.full((batch, 1), past_len),
            *[torch.randn(batch, kv_heads, past_len, head_dim) for _ in past_names])
    axes = {"input_ids": {0: "batch_size", 1: "sequence_length"},
            "attention_mask": {0: "batch_size", 1: "total_sequence_length"},
            "position_ids": {0: "batch_size", 1: "sequence_length"},
            "logits": {0: "batch_size", 1: "sequence_length"}}
    axes.update({n: {0: "batch_size", 2: "past_sequence_length"} for n in past_names})
    axes.update({n: {0: "batch_size", 2: "total_sequence_length"} for n in present_names})
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        # In eval mode: the exporter puts back the mode of the module it is given, through
        # every submodule, and a fresh Step is in training mode (GPT-2's dropout on).
        torch.onnx.export(Step(model).eval(), args, path, dynamo=False, opset_version=17,
                          input_names=["input_ids", "attention_mask", "position_ids", *past_names],
                          output_names=["logits", *present_names], dynamic_axes=axes)
    onnx.checker.check_model(onnx.load(path), full_check=True)


def torch_greedy(model, prompt):
    """transformers' generate(), greedy, with its KV cache; and each step's top-two margin."""
    with torch.no_grad():
        out = model.generate(torch.from_numpy(prompt), attention_mask=torch.ones(prompt.shape, dtype=torch.int64),
                             max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False,
                             output_scores=True, return_dict_in_generate=True, pad_token_id=0)
    ids = out.sequences[:, prompt.shape[1]:].numpy()
    margins = [float(np.min(np.diff(np.sort(s.numpy(), axis=1)[:, -2:], axis=1))) for s in out.scores]
    return ids, min(margins)


def ort_greedy(path, cfg, prompt):
    """The exported step run by onnxruntime the way its users loop over it: the prompt one
    token a step, then each pick fed back, present becoming past."""
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    layers, kv_heads = cfg.num_hidden_layers, getattr(cfg, "num_key_value_heads", cfg.num_attention_heads)
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    past_names, _ = names(layers)
    batch, plen = prompt.shape
    past = {n: np.zeros((batch, kv_heads, 0, head_dim), np.float32) for n in past_names}
    token, picks = prompt[:, :1], []
    for pos in range(plen + NEW_TOKENS - 1):
        feeds = {"input_ids": token, "attention_mask": np.ones((batch, pos + 1), np.int64),
                 "position_ids": np.full((batch, 1), pos, np.int64), **past}
        logits, *present = sess.run(None, feeds)
        past = dict(zip(past_names, present))
        if pos + 1 < plen:
            token = prompt[:, pos + 1:pos + 2]
        else:
            token = logits[:, -1].argmax(-1).astype(np.int64)[:, None]
            picks.append(token)
    return np.concatenate(picks, axis=1)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else OUT
    for name, config in CONFIGS.items():
        torch.manual_seed(sum(map(ord, name)))
        model = getattr(transformers, "GPT2LMHeadModel" if name == "gpt2" else "LlamaForCausalLM")(config())
        model.eval()
        d = os.path.join(out, name)
        os.makedirs(d, exist_ok=True)
        path = os.path.join(d, "model.onnx")
        export(model, path)
        prompt = torch.randint(0, model.config.vocab_size, PROMPT).numpy().astype(np.int64)
        ids, margin = torch_greedy(model, prompt)
        assert margin > MARGIN, f"{name}: a step's top two logits are {margin} apart"
        by_ort = ort_greedy(path, model.config, prompt)
        assert (by_ort == ids).all(), (name, by_ort, ids)
        if name in HEADS_2:
            os.makedirs(os.path.join(d, "layouts"), exist_ok=True)
            spec = {"format": "meshc-layout/1", "mesh": {"shape": [2], "axes": ["model"]}, "layouts": HEADS_2[name]}
            with open(os.path.join(d, "layouts", "heads-2.json"), "w") as f:
                json.dump(spec, f, indent=1)
            # The same split with each of the two devices its own MPI host (issue 37's
            # 2x1; tests/all/mpi.rs).
            with open(os.path.join(d, "layouts", "heads-2-hosts.json"), "w") as f:
                json.dump({**spec, "hosts": {"axis": "model"}}, f, indent=1)
        np.save(os.path.join(d, "prompt.npy"), prompt)
        np.save(os.path.join(d, "greedy.npy"), ids.astype(np.int64))
        print(f"{d}: {os.path.getsize(path) / 1e3:.0f} kB, margin {margin:.3g}", file=sys.stderr)


if __name__ == "__main__":
    main()
