#!/usr/bin/env python3
"""The anchors of `cargo bench --bench generate`: a GPT-2-small-shaped and a small-Llama-shaped
decoder, built from transformers configs with seeded random weights (nothing is downloaded),
exported by tools/export_decoders.py's `export`, and timed at batch 1, greedy, on 2 threads:

- transformers' generate() on torch, with its KV cache;
- onnxruntime stepping the exported file in a Python loop, present fed back as past, the
  prompt fed in one call (prefill).

The time per new token is (t(33 new tokens) - t(1)) / 32 after an 8-token prompt, the median
of 3: the prompt and the first token cancel out. The time to first token is taken with a
128-token prompt. One JSON object per model goes to stdout, with the prompt (the per-token
runs use its first 8 ids), torch's 33 greedy ids after those 8, and how many weights a step
reads.

Needs the venv of `make onnx-models`.
Usage: bench_decoders.py [OUT]    (default target/bench-decoders; OUT/NAME/model.onnx is
exported only when missing: a 124M-parameter export takes minutes)
"""

import json
import os
import sys
import time

import numpy as np
import onnxruntime as ort
import torch
import transformers

from export_decoders import export, names

OUT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "target", "bench-decoders"))
PROMPT, NEW, TTFT_PROMPT = 8, 32, 128
THREADS = 2
# Five times the configs' default: with 0.02, the top two logits of 50257 can come within
# the rounding by which torch's and onnxruntime's orders of summation differ.
INIT = 0.1

# Eager attention, as export_decoders.py exports: the exporter traces it into plain ops.
MODELS = {
    "gpt2-small": lambda: transformers.GPT2LMHeadModel(transformers.GPT2Config(
        initializer_range=INIT, attn_implementation="eager")),
    "llama-small": lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=12, num_attention_heads=12,
        num_key_value_heads=4, max_position_embeddings=2048, tie_word_embeddings=False, initializer_range=INIT,
        attn_implementation="eager")),
}


def timed(run, *args):
    start = time.perf_counter()
    run(*args)
    return time.perf_counter() - start


def ms_per_token(run, prompt):
    run(prompt, 2)
    return 1e3 * float(np.median([(timed(run, prompt, NEW + 1) - timed(run, prompt, 1)) / NEW for _ in range(3)]))


def ttft_ms(run, prompt):
    return 1e3 * float(np.median([timed(run, prompt, 1) for _ in range(3)]))


def torch_generate(model, prompt, new):
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.int64),
                             max_new_tokens=new, do_sample=False, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def ort_generate(sess, cfg, prompt, new):
    kv_heads = getattr(cfg, "num_key_value_heads", cfg.num_attention_heads)
    past_names, _ = names(cfg.num_hidden_layers)
    past = {n: np.zeros((1, kv_heads, 0, cfg.hidden_size // cfg.num_attention_heads), np.float32) for n in past_names}
    ids, seen, picks = np.array([prompt], np.int64), 0, []
    for _ in range(new):
        fed = ids.shape[1]
        feeds = {"input_ids": ids, "attention_mask": np.ones((1, seen + fed), np.int64),
                 "position_ids": np.arange(seen, seen + fed, dtype=np.int64)[None], **past}
        logits, *present = sess.run(None, feeds)
        past, seen = dict(zip(past_names, present)), seen + fed
        ids = logits[:, -1:].argmax(-1).astype(np.int64)
        picks.append(int(ids[0, 0]))
    return picks


def weights_read(model):
    """The weights a decode step reads whole: all but the embedding tables it gathers one row
    of (a table that is also the head is read whole)."""
    head = id(model.get_output_embeddings().weight)
    gathered = {id(p) for m in model.modules() if isinstance(m, torch.nn.Embedding) for p in m.parameters()}
    return sum(p.numel() for p in model.parameters() if id(p) not in gathered or id(p) == head)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else OUT
    torch.set_num_threads(THREADS)
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = THREADS, 1
    for name, build in MODELS.items():
        torch.manual_seed(sum(map(ord, name)))
        model = build().eval()
        # No pick ends a generation early: every run makes the tokens it is timed for.
        model.generation_config.eos_token_id = None
        path = os.path.join(out, name, "model.onnx")
        if not os.path.exists(path):
            os.makedirs(os.path.dirname(path), exist_ok=True)
            print(f"exporting {path}", file=sys.stderr)
            export(model, path + ".part")
            os.replace(path + ".part", path)
        # Timed with transformers' default attention, as generate() runs out of the box.
        model.set_attn_implementation("sdpa")
        sess = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        cfg = model.config
        prompt = [i * 97 % cfg.vocab_size for i in range(TTFT_PROMPT)]
        by_ort = lambda p, new: ort_generate(sess, cfg, p, new)
        by_torch = lambda p, new: torch_generate(model, p, new)
        greedy = by_torch(prompt[:PROMPT], NEW + 1)
        result = {"model": name,
                  "torch_ms_per_token": ms_per_token(by_torch, prompt[:PROMPT]),
                  "ort_ms_per_token": ms_per_token(by_ort, prompt[:PROMPT]),
                  "torch_ttft_ms": ttft_ms(by_torch, prompt),
                  "ort_ttft_ms": ttft_ms(by_ort, prompt),
                  "onnx": os.path.abspath(path), "weights_read": weights_read(model),
                  "prompt": prompt, "greedy": greedy}
        differ = [i for i, (a, b) in enumerate(zip(greedy, by_ort(prompt[:PROMPT], NEW + 1))) if a != b]
        if differ:
            result["warning"] = f"onnxruntime's greedy ids differ from torch's from new token {differ[0]}"
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
