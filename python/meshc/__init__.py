"""meshc from Python (docs/embedding.md).

    import meshc, numpy as np
    model = meshc.load("mlp.mshc")
    print(model.inputs)                 # [('x', 'float32', (8, 16), '[-, -]')]
    y = model(x=np.ones((8, 16), np.float32))["y"]

Calls run with the GIL released; several threads may call one model (their calls are
queued on its runner). Inputs that are C-contiguous with the model's dtype are read in
place; other layouts are copied first; a wrong dtype or shape raises MismatchError with the
line meshc prints.
"""

import os
import shutil
import subprocess

from ._meshc import MeshcError, MismatchError, Model, load

__all__ = ["Model", "MeshcError", "MismatchError", "compile", "load"]


def compile(graph, output, layout=None, dims=None, extra=()):
    """Compiles a graph file or ONNX model into the artifact `output` with the meshc
    compiler (the `meshc` on PATH, or $MESHC): `layout` a layout spec file, `dims` the
    ONNX model's symbolic dims as {"batch": 8}. Returns `output`; a failure raises
    MeshcError with meshc's message. (The compiler runs as its own process: this package
    holds the runtime only.)"""
    meshc = os.environ.get("MESHC") or shutil.which("meshc")
    if meshc is None:
        raise MeshcError("the meshc compiler is not on PATH (set MESHC to its path)")
    args = [meshc, "compile", str(graph), "-o", str(output)]
    if layout is not None:
        args += ["--layout", str(layout)]
    for name, value in (dims or {}).items():
        args += ["--dim", f"{name}={value}"]
    args += list(extra)
    run = subprocess.run(args, capture_output=True, text=True)
    if run.returncode != 0:
        raise MeshcError(run.stderr.strip().removeprefix("error: "))
    return output
