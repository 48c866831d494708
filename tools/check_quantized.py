#!/usr/bin/env python3
"""A model quantized by onnxruntime's `quantize_dynamic` through meshc: paraphrase-MiniLM-L3-v2's
encoder (its shapes, seeded weights: tools/gen_onnx_testdata.py --minilm-l3) with int8
weights — DynamicQuantizeLinear, MatMulInteger and the Casts and Muls that scale the products
back — given to `meshc interp` and to `meshc run` (compiled: the integer products by the
integer GEMM) and compared with onnxruntime on the same quantized file. meshc computes what
onnxruntime does (the integer products exactly), so each must agree far within the error
quantization itself makes, onnxruntime's quantized outputs against its f32 ones: within a
hundredth of it.

    python3 tools/check_quantized.py target/release/meshc [--keep DIR]

`make onnx-quantized` runs it in the onnx venv (onnx, onnxruntime). Exits 1 on a mismatch.
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("meshc")
    ap.add_argument("--keep", help="write the models and outputs here and keep them")
    args = ap.parse_args()
    import onnx
    import onnxruntime as ort
    from onnxruntime.quantization import QuantType, quantize_dynamic

    root = args.keep or tempfile.mkdtemp(prefix="meshc-quantized-")
    try:
        subprocess.run([sys.executable, os.path.join(HERE, "gen_onnx_testdata.py"), "--minilm-l3", root], check=True)
        d = os.path.join(root, "minilm_l3")
        f32_path, q_path = os.path.join(d, "model.onnx"), os.path.join(root, "minilm_l3_int8.onnx")
        quantize_dynamic(f32_path, q_path, weight_type=QuantType.QInt8)
        ops = sorted({n.op_type for n in onnx.load(q_path).graph.node})
        print(f"quantize_dynamic wrote {', '.join(ops)}")
        names = ("hidden_states", "attention_mask")
        feeds = {k: np.load(os.path.join(d, "inputs", k + ".npy")) for k in names}
        run = lambda path: ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, feeds)[0]  # noqa: E731
        want, f32 = run(q_path), run(f32_path)
        int8_err = float(np.abs(want - f32).max())
        flags = [x for k in names for x in ("--input", f"{k}={os.path.join(d, 'inputs', k + '.npy')}")]
        failed = False
        for cmd in ("interp", "run"):
            out = os.path.join(root, f"out_{cmd}")
            shutil.rmtree(out, ignore_errors=True)
            p = subprocess.run([args.meshc, cmd, q_path, "--dim", "batch=1", "--dim", "seq=16", *flags,
                                "--output-dir", out], capture_output=True, text=True)
            if p.returncode != 0:
                lines = p.stderr.strip().splitlines()
                print(f"meshc {cmd}: FAILED: {' | '.join(lines[:3])}")
                failed = True
                continue
            got = np.load(os.path.join(out, "last_hidden_state.npy"))
            err = float(np.abs(got - want).max())
            ok = err <= int8_err / 100
            failed |= not ok
            print(f"meshc {cmd}: max |meshc - onnxruntime| {err:.3g} on the int8 model, whose own error "
                  f"against f32 is {int8_err:.3g}: {'ok' if ok else 'TOO FAR'}")
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
