"""From Python, meshc beside onnxruntime in the same run (docs/embedding.md):

- the per-call overhead of a 16-float relu: meshc's model(x=...) against onnxruntime's
  InferenceSession.run on the same ONNX graph (target: at most half of onnxruntime's);
- the throughput of 4 threads sharing one meshc model against 1;
- MiniLM-L3's encoder (3 layers, 384 wide, 12 heads, seeded weights; B=1, T=16, written by
  tools/gen_onnx_testdata.py --minilm-l3) called 1000 times, both on 2 threads: the median
  and 90th percentile latency (target: meshc's median at most onnxruntime's).

    target/onnx-venv/bin/python python/bench.py

(needs onnx and onnxruntime, as in target/onnx-venv, and the package built by `make
python`: it is imported from python/.)"""
import os, subprocess, sys, time, threading, numpy as np, onnx, onnxruntime as ort
from onnx import helper, TensorProto
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import meshc
TMP = os.environ.get("TMPDIR", "/tmp") + f"/meshc-bench-{os.getpid()}"
os.makedirs(TMP, exist_ok=True)


def session(path, threads):
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def per_call(fs, n=20000, rounds=7):
    """The median over rounds of the mean time of n calls of each f (us), rounds of the
    two alternating so that both see the same machine (it is shared)."""
    for f in fs:
        for _ in range(n // 10):
            f()
    ts = [[] for _ in fs]
    for _ in range(rounds):
        for f, t in zip(fs, ts):
            t0 = time.perf_counter()
            for _ in range(n):
                f()
            t.append((time.perf_counter() - t0) / n * 1e6)
    return [sorted(t)[rounds // 2] for t in ts]


g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu16",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, [16])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [16])])
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]); m.ir_version = 8
onnx.save(m, f"{TMP}/relu16.onnx")
meshc.compile(f"{TMP}/relu16.onnx", f"{TMP}/relu16.mshc")
model = meshc.load(f"{TMP}/relu16.mshc")
sess = session(f"{TMP}/relu16.onnx", 1)
x = np.linspace(-1, 1, 16, dtype=np.float32)
assert np.array_equal(model(x=x)["y"], sess.run(None, {"x": x})[0])
a, b = per_call([lambda: model(x=x), lambda: sess.run(None, {"x": x})])
print(f"python relu16: meshc model(x=...) {a:.2f} us/call, onnxruntime InferenceSession.run {b:.2f} us/call, ratio {a/b:.2f} (target <= 0.5)")


def threads(k, n=5000):
    def work():
        for _ in range(n):
            model(x=x)
    ts = [threading.Thread(target=work) for _ in range(k)]
    t = time.perf_counter(); [s.start() for s in ts]; [s.join() for s in ts]
    return k * n / (time.perf_counter() - t)


one, four = threads(1), threads(4)
print(f"python relu16 throughput: 1 thread {one:.0f} calls/s, 4 threads {four:.0f} calls/s ({four/one:.2f}x)")

# MiniLM-L3: meshc runs a single-device artifact on every core (2 on the machine this was
# measured on); onnxruntime is given 2 intra-op threads.
subprocess.run([sys.executable, os.path.join(HERE, "..", "tools", "gen_onnx_testdata.py"), "--minilm-l3", TMP], check=True)
d = f"{TMP}/minilm_l3"
meshc.compile(f"{d}/model.onnx", f"{TMP}/minilm_l3.mshc", dims={"batch": 1, "seq": 16})
model = meshc.load(f"{TMP}/minilm_l3.mshc")
sess = session(f"{d}/model.onnx", 2)
feeds = {k: np.load(f"{d}/inputs/{k}.npy") for k in ("hidden_states", "attention_mask")}
want = np.load(f"{d}/expected/last_hidden_state.npy")
np.testing.assert_allclose(model(**feeds)["last_hidden_state"], want, rtol=1e-4, atol=1e-4)


def latencies(fs, n=1000):
    """Each call of each f timed, n times, the calls alternating so that both see the same
    machine (it is shared): the median and 90th percentile of each, in ms."""
    for _ in range(50):
        [f() for f in fs]
    ts = [[] for _ in fs]
    for _ in range(n):
        for f, t in zip(fs, ts):
            t0 = time.perf_counter()
            f()
            t.append((time.perf_counter() - t0) * 1e3)
    return [(sorted(t)[n // 2], sorted(t)[n * 9 // 10]) for t in ts]


(ma, pa), (mb, pb) = latencies([lambda: model(**feeds), lambda: sess.run(None, feeds)])
print(f"python MiniLM-L3 B=1 T=16, 1000 calls: meshc median {ma:.3f} ms (p90 {pa:.3f}), "
      f"onnxruntime median {mb:.3f} ms (p90 {pb:.3f}), ratio {ma/mb:.2f} (target <= 1)")
