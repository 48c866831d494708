#!/usr/bin/env python3
"""Runs the real torch.onnx exports of tools/export_torch_models.py through meshc and compares
every result with onnxruntime's: `meshc import` (to JSON, weights beside it), `meshc interp`
(the reference interpreter), `meshc compile` then `meshc run` of the artifact on one device,
and `meshc run` under each of the model's layouts (also compared with the 1-device run).

Prints one line per model and step, then a table: model, opset, import, interp, run, layouts,
the largest absolute difference from onnxruntime, and the time. Exits 1 if any step failed
or any result is off by more than atol + rtol·|expected| (atol and rtol 1e-4, atol scaled by
the largest expected magnitude, as float32 sums of a few thousand terms round).

Usage: check_torch_models.py MESHC [DIR] [--only NAME,...]   (DIR: target/torch-models)
Needs numpy only.
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "target", "torch-models")
RTOL = ATOL = 1e-4
TIMEOUT = 900


class Failed(Exception):
    pass


def meshc(binary, args):
    """Runs meshc; a non-zero exit or a time-out is a failure carrying its last stderr line."""
    try:
        p = subprocess.run([binary, *args], capture_output=True, text=True, timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        raise Failed(f"timed out after {TIMEOUT} s")
    if p.returncode != 0:
        lines = (p.stderr or p.stdout).strip().splitlines()
        raise Failed(f"exit {p.returncode}: {lines[-1] if lines else ''}")


def diff(want_dir, got_dir):
    """The largest absolute difference over every expected output; a failure if any output
    is missing, of another shape, or off by more than the tolerance."""
    worst = 0.0
    for f in sorted(os.listdir(want_dir)):
        want = np.load(os.path.join(want_dir, f))
        path = os.path.join(got_dir, f)
        if not os.path.exists(path):
            raise Failed(f"no output {f}")
        got = np.load(path)
        if got.shape != want.shape:
            raise Failed(f"{f}: shape {got.shape}, expected {want.shape}")
        d = np.abs(got.astype(np.float64) - want.astype(np.float64))
        worst = max(worst, float(d.max(initial=0.0)))
        atol = ATOL * max(1.0, float(np.abs(want).max(initial=0.0)))
        if not np.all(d <= atol + RTOL * np.abs(want)):
            i = np.unravel_index(np.argmax(d - RTOL * np.abs(want)), d.shape)
            raise Failed(f"{f}{list(i)}: {got[i]} vs {want[i]} (max diff {worst:.2e})")
    return worst


def check(binary, d, tmp):
    """One export through every step: {step: result string}, the worst difference, success."""
    model = os.path.join(d, "model.onnx")
    with open(os.path.join(d, "dims.txt")) as f:
        dims = [a for line in f.read().split() for a in ("--dim", line)]
    inputs = [a for f in sorted(os.listdir(os.path.join(d, "inputs")))
              for a in ("--input", f"{f[:-4]}={os.path.join(d, 'inputs', f)}")]
    expected = os.path.join(d, "expected")
    row, worst, ok = {}, 0.0, True

    def step(name, fn):
        nonlocal worst, ok
        t = time.monotonic()
        try:
            w = fn()
            if w is not None:
                worst = max(worst, w)
            row[name] = f"ok {time.monotonic() - t:.1f}s"
        except Failed as e:
            ok = False
            row[name] = "FAIL"
            print(f"  {os.path.basename(d)} {name}: {e}", file=sys.stderr)

    def run_to(out, args):
        meshc(binary, [*args, *inputs, "--output-dir", out])
        return diff(expected, out)

    step("import", lambda: meshc(binary, ["import", model, "-o", os.path.join(tmp, "graph.json"), *dims]))
    step("interp", lambda: run_to(os.path.join(tmp, "interp"), ["interp", model, *dims]))
    art = os.path.join(tmp, "model.mshc")

    def compiled():
        meshc(binary, ["compile", model, "-o", art, *dims])
        return run_to(os.path.join(tmp, "run"), ["run", art])

    step("run", compiled)
    layouts = os.path.join(d, "layouts")
    for spec in sorted(os.listdir(layouts)) if os.path.isdir(layouts) else []:
        out = os.path.join(tmp, spec)

        def laid_out():
            w = run_to(out, ["run", model, *dims, "--layout", os.path.join(layouts, spec)])
            if "run" in row and row["run"].startswith("ok"):
                diff(os.path.join(tmp, "run"), out)
            return w

        step(spec[:-5], laid_out)
    return row, worst, ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("meshc")
    ap.add_argument("dir", nargs="?", default=DIR)
    ap.add_argument("--only", help="comma-separated export names (NAME-opN) or model names")
    args = ap.parse_args()
    names = sorted(n for n in os.listdir(args.dir) if os.path.isfile(os.path.join(args.dir, n, "model.onnx")))
    if args.only:
        want = args.only.split(",")
        names = [n for n in names if n in want or n.rsplit("-op", 1)[0] in want]
    if not names:
        sys.exit(f"no exports under {args.dir}: run tools/export_torch_models.py first")
    rows, failed = [], 0
    for n in names:
        t = time.monotonic()
        with tempfile.TemporaryDirectory() as tmp:
            row, worst, ok = check(args.meshc, os.path.join(args.dir, n), tmp)
        failed += not ok
        model, opset = n.rsplit("-op", 1)
        rows.append((model, opset, row, worst, time.monotonic() - t))
        print(f"{n}: {'ok' if ok else 'FAILED'} (max diff {worst:.1e})", file=sys.stderr)
    print(f"| model | opset | import | interp | run | layouts | max abs diff | time |")
    print("|---|---|---|---|---|---|---|---|")
    for model, opset, row, worst, secs in rows:
        lay = ", ".join(f"{k} {v}" for k, v in row.items() if k not in ("import", "interp", "run")) or "-"
        print(f"| {model} | {opset} | {row['import']} | {row['interp']} | {row['run']} | {lay} | {worst:.1e} "
              f"| {secs:.0f}s |")
    print(f"{len(rows) - failed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
