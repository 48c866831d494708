#!/usr/bin/env python3
"""Runs the ONNX backend node tests through meshc: every case of the installed onnx
package (`onnx.backend.test.case.node.collect_testcases()`, the cases the wheel does not
ship as files) is written out as model.onnx plus .npy inputs, then given to `meshc run`
(import, compile, run) and to `meshc interp`, and each output is compared with the case's
expected one under the case's own tolerances.

    python3 tools/onnx_conformance.py target/release/meshc [--filter SUBSTRING] [--keep DIR] [--verbose]

Each case is one of: pass (both paths agree with ONNX), wrong (ran, but an output differs:
the first differing element is shown), refused (meshc said no in one line with exit 1:
an op, attribute or dtype it does not claim; also a case whose output ONNX gives as a
half float, which meshc writes as f32) and crash (anything else: a panic, a signal,
a hang past the timeout). A case refused because an input that gives a shape (pads,
scales, a depth) is not known at import time is run again with the inputs after the first
fixed by --const. It prints a line per op, then the totals; it exits 1 when
anything crashed or computed a wrong result: a crash is a bug whatever the input, and a
wrong result on a case meshc accepts is one too (the cases then serve as regression tests,
e.g. test_mean_* and test_training_dropout_*, which this run found wrong once). `make onnx-conformance` runs
it in a venv with the onnx package.
"""

import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
import warnings

import numpy as np

TIMEOUT_S = 60


def sanitize(name):
    """The file name meshc gives an output named `name` (onnx/src/builder.rs `sanitise`:
    characters outside [A-Za-z0-9_.] become _, leading _ and . are dropped, a leading digit
    gets a t)."""
    s = re.sub(r"[^A-Za-z0-9.]", "_", name).lstrip("_.")
    return "t" if not s else ("t" + s if s[0].isdigit() else s)


def run_meshc(cmd, case_dir):
    """(kind, detail): kind is ok, refused or crash."""
    try:
        p = subprocess.run(cmd, cwd=case_dir, capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return "crash", f"no answer in {TIMEOUT_S} s"
    if p.returncode == 0:
        return "ok", ""
    lines = p.stderr.strip().splitlines()
    if p.returncode == 1 and len(lines) == 1:
        return "refused", lines[0]
    return "crash", f"exit {p.returncode}: {' | '.join(lines[:3])[:300]}"


def compare(out_dir, outputs, expected, rtol, atol):
    """None when every output matches, else the verdict and what differs first."""
    for name, want in zip(outputs, expected):
        path = os.path.join(out_dir, sanitize(name) + ".npy")
        if not os.path.exists(path):
            return "wrong", f"output {name} not written"
        got = np.load(path)
        want = np.asarray(want)
        # meshc computes in f32 and writes no half results (docs/onnx.md: a Cast to a half is
        # a cast to f32): a case whose output ONNX gives as a half is not one it claims.
        if want.dtype.itemsize == 2 and want.dtype.kind in "fV" and got.dtype == np.float32:
            return "refused", f"output {name}: ONNX gives {want.dtype}, meshc computes in f32"
        if got.shape != want.shape:
            return "wrong", f"output {name}: shape {got.shape}, want {want.shape}"
        if want.dtype == np.bool_ or np.issubdtype(want.dtype, np.integer):
            bad = np.flatnonzero(got.astype(want.dtype).ravel() != want.ravel())
        else:
            g, w = got.astype(np.float64).ravel(), want.astype(np.float64).ravel()
            close = np.isclose(g, w, rtol=rtol, atol=atol, equal_nan=True)
            bad = np.flatnonzero(~close)
        if bad.size:
            i = bad[0]
            return "wrong", f"output {name}[{i}]: got {got.ravel()[i]}, want {want.ravel()[i]} ({bad.size} differ)"
    return None


def as_array(value):
    """A case's input or output as numpy: the Cast and CastLike cases give TensorProtos."""
    from onnx import TensorProto, numpy_helper

    return numpy_helper.to_array(value) if isinstance(value, TensorProto) else value


def run_case(meshc, case, case_dir, in_names, out_names, bind):
    """(verdict, detail) of one case over all its data sets; with `bind`, the inputs after
    the first are given as --const instead of --input."""
    verdict, detail = "pass", ""
    for k, (inputs, expected) in enumerate(case.data_sets):
        flags = []
        inputs = [as_array(v) for v in inputs]
        expected = [as_array(v) for v in expected]
        for j, (name, value) in enumerate(zip(in_names, inputs)):
            # Sequences, maps and optionals are no tensors: nothing meshc takes.
            if isinstance(value, (list, dict)) or value is None or np.asarray(value).dtype == object:
                return "refused", f"input {name} is not a tensor (a sequence, map or optional)"
            path = os.path.join(case_dir, f"in{k}_{j}.npy")
            np.save(path, np.asarray(value))
            flags += ["--const" if bind and j > 0 else "--input", f"{name}={path}"]
        for cmd in ("run", "interp"):
            out_dir = os.path.join(case_dir, f"out{k}_{cmd}")
            shutil.rmtree(out_dir, ignore_errors=True)
            kind, why = run_meshc([meshc, cmd, "model.onnx", *flags, "--output-dir", out_dir], case_dir)
            if kind != "ok":
                return ("refused" if kind == "refused" else "crash"), f"{cmd}: {why}"
            diff = compare(out_dir, out_names, expected, case.rtol, case.atol)
            if diff:
                return diff[0], f"{cmd}: {diff[1]}"
    return verdict, detail


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("meshc")
    ap.add_argument("--filter", default="")
    ap.add_argument("--keep", help="write the cases here and keep them")
    ap.add_argument("--verbose", action="store_true", help="print every case not passing, with why")
    args = ap.parse_args()
    meshc = os.path.abspath(args.meshc)

    import onnx
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = [c for c in collect_testcases() if args.filter in c.name]
    root = args.keep or tempfile.mkdtemp(prefix="meshc-onnx-conformance-")
    per_op = collections.defaultdict(collections.Counter)
    examples = {}
    try:
        for case in cases:
            op = case.model.graph.node[0].op_type if case.model.graph.node else "?"
            case_dir = os.path.join(root, case.name)
            os.makedirs(case_dir, exist_ok=True)
            onnx.save(case.model, os.path.join(case_dir, "model.onnx"))
            inits = {i.name for i in case.model.graph.initializer}
            in_names = [i.name for i in case.model.graph.input if i.name not in inits]
            out_names = [o.name for o in case.model.graph.output]
            verdict, detail = run_case(meshc, case, case_dir, in_names, out_names, bind=False)
            # Inputs that give a shape, pads, scales or a depth must be known when meshc
            # imports the model: a refusal saying so is retried with every input after the
            # first fixed to its value (--const), as a user with such a model binds them.
            if verdict == "refused" and "must be known at import time" in detail:
                verdict, detail = run_case(meshc, case, case_dir, in_names, out_names, bind=True)
            per_op[op][verdict] += 1
            if args.verbose and verdict != "pass":
                print(f"{verdict:<8} {case.name}: {detail}", flush=True)
            if verdict != "pass":
                examples.setdefault((op, verdict), f"{case.name}: {detail}")
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)

    kinds = ["pass", "wrong", "refused", "crash"]
    print(f"{'op':<28}" + "".join(f"{k:>9}" for k in kinds) + "  first problem")
    for op in sorted(per_op):
        c = per_op[op]
        first = next((examples[(op, k)] for k in ["crash", "wrong", "refused"] if (op, k) in examples), "")
        print(f"{op:<28}" + "".join(f"{c[k]:>9}" for k in kinds) + f"  {first[:160]}")
    total = collections.Counter()
    for c in per_op.values():
        total.update(c)
    n = sum(total.values())
    claimed = total["pass"] + total["wrong"] + total["crash"]
    share = 100.0 * total["pass"] / claimed if claimed else 0.0
    print(
        f"onnx node tests: {n} cases; {total['pass']} pass, {total['wrong']} wrong, {total['refused']} refused, "
        f"{total['crash']} crash; {share:.1f}% of the cases meshc does not refuse pass; "
        f"those are {100.0 * claimed / n if n else 0:.1f}% of all cases"
    )
    sys.exit(1 if total["crash"] or total["wrong"] else 0)


if __name__ == "__main__":
    main()
