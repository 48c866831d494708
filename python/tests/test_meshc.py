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
    assert model.inputs == [("x", "float32", x.shape, "[-, -]")]
    assert [o[0] for o in model.outputs] == ["y"]


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
