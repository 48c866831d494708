"""meshc from Python (docs/embedding.md).

    import meshc, numpy as np
    model = meshc.load("mlp.mshc")
    print(model.inputs)                 # [TensorInfo(name='x', dtype='float32', shape=(8, 16),
                                        #             layout='[-, -]', dims=('batch', None))]
    y = model(x=np.ones((8, 16), np.float32))["y"]

Calls run with the GIL released; several threads may call one model (their calls are
queued on its runner). Inputs that are C-contiguous with the model's dtype are read in
place; other layouts are copied first; a wrong dtype or shape raises MismatchError with the
line meshc prints.
"""

from ._meshc import MeshcError, MismatchError, Model, TensorInfo, load
from ._meshc import compile as _compile

__all__ = ["Model", "MeshcError", "MismatchError", "TensorInfo", "compile", "load"]


def compile(graph, output, layout=None, dims=None, extra=()):
    """Compiles a graph file or ONNX model into the artifact `output`, in this process, as
    `meshc compile GRAPH -o OUTPUT` does: `layout` a layout spec file, `dims` the ONNX
    model's symbolic dims as {"batch": 8}, `extra` more of compile's flags (["--loss",
    "loss", "--optimizer", "sgd:0.1"]). Returns `output`; a failure raises MeshcError with
    meshc's message. The GIL is released while it compiles."""
    flags = []
    if layout is not None:
        flags += ["--layout", str(layout)]
    for name, value in (dims or {}).items():
        flags += ["--dim", f"{name}={value}"]
    flags += [str(f) for f in extra]
    _compile(str(graph), str(output), flags)
    return output
