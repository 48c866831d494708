"""The Python package on real artifacts: every testdata graph compiled by the meshc binary
and run through meshc.load against numpy's expected outputs, 4 threads calling one model at
once, and wrong inputs refused with the runner's messages. Run by `make test-python`."""

import os
import pathlib
import threading

import numpy as np
import pytest

import meshc

ROOT = pathlib.Path(__file__).resolve().parents[2]
TESTDATA = ROOT / "testdata"
GRAPHS = sorted(p.parent.name for p in TESTDATA.glob("*/graph.json"))


@pytest.fixture(scope="session")
def artifacts(tmp_path_factory):
    out = tmp_path_factory.mktemp("artifacts")
    return {name: meshc.compile(TESTDATA / name / "graph.json", out / f"{name}.mshc") for name in GRAPHS}


def npys(d):
    return {p.stem: np.load(p) for p in sorted(d.glob("*.npy"))} if d.is_dir() else {}


def assert_expected(name, got):
    want = npys(TESTDATA / name / "expected")
    assert sorted(got) == sorted(want)
    for k, w in want.items():
        g = got[k]
        assert g.dtype == w.dtype and g.shape == w.shape, k
        if w.dtype.kind == "f":
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5, err_msg=f"{name} {k}")
        else:
            np.testing.assert_array_equal(g, w, err_msg=f"{name} {k}")


@pytest.mark.parametrize("name", GRAPHS)
def test_every_testdata_artifact_matches_numpy(artifacts, name):
    model = meshc.load(artifacts[name])
    inputs = npys(TESTDATA / name / "inputs")
    assert {i[0] for i in model.inputs} == set(inputs)
    assert_expected(name, model(**inputs))
    assert_expected(name, model.run(inputs))


def test_metadata(artifacts):
    model = meshc.load(artifacts["mlp"])
    x = np.load(TESTDATA / "mlp" / "inputs" / "x.npy")
    assert model.inputs == [("x", "float32", x.shape, "[-, -]", ("batch", "embed"))]
    (y,) = model.outputs
    assert isinstance(y, meshc.TensorInfo)
    # The output's names are the ones inference carries from x through the matmuls.
    assert (y.name, y.shape, y.dims) == ("y", (16, 64), ("batch", "embed"))


def test_dims_are_none_where_the_graph_names_none(artifacts, tmp_path):
    model = meshc.load(artifacts["transformer"])
    dims = [(i.name, i.dims) for i in model.inputs]
    assert dims == [("ids", ("batch", "seq")), ("mask", ("batch", None, None, "seq"))]
    # A graph without names: every dim None, one per dimension.
    graph = tmp_path / "plain.json"
    graph.write_text("""{"format": "meshc-graph/1", "name": "plain",
  "inputs": [{"name": "x", "dtype": "f32", "shape": [2, 3]}],
  "nodes": [{"name": "y", "op": "relu", "inputs": ["x"]}], "outputs": ["y"]}""")
    plain = meshc.load(meshc.compile(graph, tmp_path / "plain.mshc"))
    assert [i.dims for i in plain.inputs + plain.outputs] == [(None, None), (None, None)]


def test_an_onnx_models_dim_params_are_its_dim_names(tmp_path):
    onnx = TESTDATA / "onnx" / "encoder" / "model.onnx"
    model = meshc.load(meshc.compile(onnx, tmp_path / "encoder.mshc", dims={"batch": 2, "seq": 5}))
    dims = {i.name: i.dims for i in model.inputs + model.outputs}
    assert dims["hidden_states"][:2] == ("batch", "seq"), dims
    assert dims["last_hidden_state"][:2] == ("batch", "seq"), dims


def test_non_contiguous_inputs_are_copied_and_give_the_same_answer(artifacts):
    model = meshc.load(artifacts["mlp"])
    x = np.load(TESTDATA / "mlp" / "inputs" / "x.npy")
    strided = np.asfortranarray(x)
    assert not strided.flags.c_contiguous
    np.testing.assert_array_equal(model(x=strided)["y"], model(x=x)["y"])


def test_four_threads_share_one_model(artifacts):
    model = meshc.load(artifacts["mlp"])
    x = np.load(TESTDATA / "mlp" / "inputs" / "x.npy")
    xs = [x * (k + 1) for k in range(4)]
    want = [model(x=v)["y"] for v in xs]
    errors = []

    def work(k):
        try:
            for _ in range(50):
                np.testing.assert_array_equal(model(x=xs[k])["y"], want[k])
        except Exception as e:  # reported below, from the main thread
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_bad_inputs_raise_the_runners_messages(artifacts):
    model = meshc.load(artifacts["mlp"])
    x = np.load(TESTDATA / "mlp" / "inputs" / "x.npy")
    with pytest.raises(meshc.MismatchError, match=r"^the graph has no input 'X' \(did you mean 'x'\?\) \(its inputs: x\)$"):
        model(X=x)
    with pytest.raises(meshc.MismatchError, match=r"^missing input 'x' "):
        model()
    with pytest.raises(meshc.MismatchError, match=r"^input 'x' is i32\["):
        model(x=x.astype(np.int32))
    with pytest.raises(meshc.MismatchError, match=r"^input 'x' is f32\[.*the graph expects "):
        model(x=x[:1])
    with pytest.raises(meshc.MismatchError, match="float64 array, which meshc does not take"):
        model(x=x.astype(np.float64))
    with pytest.raises(meshc.MeshcError, match="No such file"):
        meshc.load(ROOT / "nope.mshc")
    assert_expected("mlp", model(x=x))


def test_a_training_artifact_steps_as_the_reference_does(tmp_path):
    art = meshc.compile(TESTDATA / "train" / "classifier.json", tmp_path / "train.mshc",
                        extra=["--loss", "loss", "--optimizer", "sgd:0.1"])
    model = meshc.load(art)
    assert model.state_names and set(model.state_names) <= {i[0] for i in model.inputs}
    x, labels = (np.load(TESTDATA / "train" / "data" / f"{n}.npy") for n in ("x", "labels"))
    want = np.load(TESTDATA / "train" / "expected" / "sgd.npy")
    with pytest.raises(meshc.MeshcError, match="no state on the devices: call set_state first"):
        model.step(x=x[0], labels=labels[0])
    init = model.initial_state()
    assert sorted(init) == sorted(model.state_names)
    model.set_state(init)
    for step in range(5):
        out = model.step(x=x[step], labels=labels[step])
        assert sorted(out) == ["loss"]
        np.testing.assert_allclose(out["loss"], want[step], rtol=1e-4)
    # The state read back has moved; written back, stepping on gives what it gave before.
    now = model.state()
    assert any(not np.array_equal(now[k], init[k]) for k in init)
    after = model.step(x=x[5], labels=labels[5])["loss"]
    model.set_state(now)
    np.testing.assert_array_equal(model.step(x=x[5], labels=labels[5])["loss"], after)
    with pytest.raises(meshc.MeshcError, match=r"^state: "):
        model.set_state({k: v[..., :1] if v.ndim else v for k, v in now.items()})


def test_a_decoder_generates_numpys_greedy_ids(tmp_path):
    """testdata/decoder is one decode step with its KV cache as state (docs/generation.md)."""
    model = meshc.load(meshc.compile(TESTDATA / "decoder" / "graph.json", tmp_path / "decoder.mshc"))
    prompt = np.load(TESTDATA / "decoder" / "generate" / "prompt.npy")
    greedy = np.load(TESTDATA / "decoder" / "generate" / "greedy.npy")
    ids = model.generate(prompt, 14, 16)
    assert ids.dtype == np.int64
    np.testing.assert_array_equal(ids, greedy)
    np.testing.assert_array_equal(model.generate(prompt.tolist(), 4, 16, sample="top-k:1"), greedy[:, :4])
    a = model.generate(prompt, 6, 16, sample="temperature:1.5", seed=5)
    np.testing.assert_array_equal(a, model.generate(prompt, 6, 16, sample="temperature:1.5", seed=5))
    stop = int(greedy[0, 3])
    assert stop not in greedy[1, :6] and stop not in greedy[0, :3]
    got = model.generate(prompt, 6, 16, stop=[stop])
    np.testing.assert_array_equal(got[0], list(greedy[0, :4]) + [-1, -1])
    np.testing.assert_array_equal(got[1], greedy[1, :6])
    with pytest.raises(meshc.MeshcError, match="beyond the context of 16"):
        model.generate(prompt, 15, 16)
    with pytest.raises(meshc.MeshcError, match="top-k:0: K must be a whole number above 0"):
        model.generate(prompt, 2, 16, sample="top-k:0")


def test_an_onnx_llama_generates_torchs_greedy_ids_with_its_prefill(tmp_path):
    """testdata/onnx_decoders/llama: transformers' Llama exported with past/present KV, its
    decode step and the prefill of prompts of up to 5 ids compiled from the one file."""
    d = TESTDATA / "onnx_decoders" / "llama"
    sizes = ["--decode-context", "40", "--decode-batch", "2"]
    step = meshc.load(meshc.compile(d / "model.onnx", tmp_path / "step.mshc", extra=sizes))
    prefill = meshc.load(meshc.compile(d / "model.onnx", tmp_path / "prefill.mshc", extra=sizes + ["--decode-prefill", "5"]))
    prompt, greedy = np.load(d / "prompt.npy"), np.load(d / "greedy.npy")
    np.testing.assert_array_equal(step.generate(prompt, 32, 40, prefill=prefill), greedy)
    np.testing.assert_array_equal(step.generate(prompt, 32, 40), greedy)
    # A shorter prompt runs through the same prefill, padded after its end; a longer one is
    # refused.
    short = np.ascontiguousarray(prompt[:, :3])
    np.testing.assert_array_equal(step.generate(short, 12, 40, prefill=prefill), step.generate(short, 12, 40))
    longer = np.ones((2, 6), np.int64)
    with pytest.raises(meshc.MeshcError, match=r"the prefill takes ids i64\[2,5\]: prompts of at most 5 ids, where the prompt is \[2, 6\]"):
        step.generate(longer, 2, 40, prefill=prefill)


def test_an_inference_artifact_has_no_state(artifacts):
    model = meshc.load(artifacts["mlp"])
    assert model.state_names == []
    with pytest.raises(meshc.MeshcError, match="the artifact holds no state"):
        model.initial_state()


HALF = """{"format": "meshc-graph/1", "name": "half",
  "inputs": [{"name": "x", "dtype": "f16", "shape": [2, 4]}, {"name": "b", "dtype": "bf16", "shape": [2, 4]}],
  "params": [],
  "nodes": [{"name": "xf", "op": "cast", "inputs": ["x"], "attrs": {"to": "f32"}},
            {"name": "bf", "op": "cast", "inputs": ["b"], "attrs": {"to": "f32"}},
            {"name": "s", "op": "add", "inputs": ["xf", "bf"]}],
  "outputs": ["s", "x", "b"]}"""


def test_f16_and_bf16_cross_as_numpy_float16_and_bfloat16_bits(tmp_path):
    """f16 is numpy's float16; bf16 is ml_dtypes' bfloat16 where that package is installed,
    else uint16 arrays holding the bits (what the package gives and takes)."""
    (tmp_path / "half.json").write_text(HALF)
    model = meshc.load(meshc.compile(tmp_path / "half.json", tmp_path / "half.mshc"))
    assert [i[:2] for i in model.inputs] == [("x", "float16"), ("b", "bfloat16")]
    x = np.array([[0.5, -1.25, 3.0, 65504.0], [1e-3, 0.0, -2.0, 7.5]], np.float16)
    f = np.array([[1.0, 2.5, -3.0, 0.25], [100.0, -0.5, 1e-2, 3.0]], np.float32)
    try:
        import ml_dtypes
        b = f.astype(ml_dtypes.bfloat16)
        b_f32 = b.astype(np.float32)
    except ImportError:
        b = (f.view(np.uint32) >> 16).astype(np.uint16)  # f truncated to bf16
        b_f32 = (b.astype(np.uint32) << 16).view(np.float32)
    out = model(x=x, b=b)
    assert out["x"].dtype == x.dtype and out["b"].dtype == b.dtype
    np.testing.assert_array_equal(out["x"], x)
    np.testing.assert_array_equal(out["b"], b)
    np.testing.assert_array_equal(out["s"], x.astype(np.float32) + b_f32)
    with pytest.raises(meshc.MismatchError, match=r"^input 'x' is f32\[2,4\], the graph expects f16\[2,4\]$"):
        model(x=x.astype(np.float32), b=b)


def test_compile_in_process_writes_the_clis_artifact_and_errors(tmp_path):
    """meshc.compile runs the compiler in this process: the bytes `meshc compile` writes
    (the binary $MESHC, which make test-python builds), and its one-line errors."""
    import subprocess
    graph, layout = TESTDATA / "mlp" / "graph.json", TESTDATA / "mlp" / "layouts" / "mp-2x4.json"
    meshc.compile(graph, tmp_path / "py.mshc", layout=layout)
    subprocess.run([os.environ["MESHC"], "compile", graph, "--layout", layout, "-o", tmp_path / "cli.mshc"], check=True)
    assert (tmp_path / "py.mshc").read_bytes() == (tmp_path / "cli.mshc").read_bytes()
    with pytest.raises(meshc.MeshcError, match=r"nope\.json"):
        meshc.compile(tmp_path / "nope.json", tmp_path / "x.mshc")
    with pytest.raises(meshc.MeshcError, match="unexpected argument '--no-such-flag'"):
        meshc.compile(graph, tmp_path / "x.mshc", extra=["--no-such-flag"])
    with pytest.raises(meshc.MeshcError, match=r"symbolic dims compile for one device for now"):
        meshc.compile(graph, tmp_path / "x.mshc", layout=layout, dims={"batch": "1..64"})
    assert not (tmp_path / "x.mshc").exists()


def test_one_artifact_over_a_range_of_batch_sizes_runs_at_each(tmp_path):
    """meshc.compile with a range builds one artifact for every batch size within it: each
    call's outputs have that call's batch, and each row is the row of a static artifact's
    output for the same input row; a batch outside the range is one MeshcError."""
    graph = TESTDATA / "mlp" / "graph.json"
    model = meshc.load(meshc.compile(graph, tmp_path / "dyn.mshc", dims={"batch": "1..64"}))
    rng = np.random.default_rng(3)
    for b in [1, 5, 64]:
        x = rng.standard_normal((b, 64), dtype=np.float32)
        y = model.run({"x": x})["y"]
        assert y.shape == (b, 64)
        static = meshc.load(meshc.compile(graph, tmp_path / f"s{b}.mshc", dims={"batch": b}))
        np.testing.assert_allclose(y, static.run({"x": x})["y"], rtol=1e-5, atol=1e-6)
    with pytest.raises(meshc.MeshcError, match=r"input x: dim 0 \(batch\) is 65, outside 1\.\.64"):
        model.run({"x": np.zeros((65, 64), np.float32)})


def test_the_getting_started_python_runs_as_written(tmp_path, monkeypatch):
    """docs/getting-started.md's Python block, run from a directory holding the artifact its
    step 4 compiles (and the repository's testdata), gives onnxruntime's output."""
    doc = (ROOT / "docs" / "getting-started.md").read_text()
    block = doc.split("```python\n", 1)[1].split("```", 1)[0]
    encoder = TESTDATA / "onnx" / "encoder"
    meshc.compile(encoder / "model.onnx", tmp_path / "enc.mshc", layout=encoder / "layouts" / "megatron-rules.json",
                  dims={"batch": 2, "seq": 5})
    (tmp_path / "testdata").symlink_to(TESTDATA)
    monkeypatch.chdir(tmp_path)
    scope = {}
    exec(compile(block, "getting-started.md", "exec"), scope)
    want = np.load(encoder / "expected" / "last_hidden_state.npy")
    np.testing.assert_allclose(scope["y"], want, rtol=1e-4, atol=1e-5)
