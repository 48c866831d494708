"""Per-call overhead from Python: a 16-float relu through meshc (model(x=...)) beside
onnxruntime's InferenceSession.run on the same ONNX graph, in the same run, and the
throughput of 4 threads sharing one meshc model against 1 (docs/embedding.md).

    MESHC=target/release/meshc target/onnx-venv/bin/python python/bench.py

(needs onnx and onnxruntime, as in target/onnx-venv, and the package built by `make
python`: it is imported from python/.)"""
import sys, time, threading, numpy as np, onnx, onnxruntime as ort
from onnx import helper, TensorProto
sys.path.insert(0, __file__.rsplit("/", 1)[0])
import meshc
g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu16",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, [16])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [16])])
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]); m.ir_version = 8
onnx.save(m, "/tmp/relu16.onnx")
meshc.compile("/tmp/relu16.onnx", "/tmp/relu16.mshc")
model = meshc.load("/tmp/relu16.mshc")
so = ort.SessionOptions(); so.intra_op_num_threads = 1
sess = ort.InferenceSession("/tmp/relu16.onnx", so, providers=["CPUExecutionProvider"])
x = np.linspace(-1, 1, 16, dtype=np.float32)
assert np.array_equal(model(x=x)["y"], sess.run(None, {"x": x})[0])
def per_call(f, n=20000, rounds=7):
    for _ in range(n // 10): f()
    ts = []
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(n): f()
        ts.append((time.perf_counter() - t) / n * 1e6)
    return sorted(ts)[rounds // 2]
a = per_call(lambda: model(x=x)); b = per_call(lambda: sess.run(None, {"x": x}))
print(f"python relu16: meshc model(x=...) {a:.2f} us/call, onnxruntime InferenceSession.run {b:.2f} us/call, ratio {a/b:.2f} (target <= 0.5)")
def threads(k, n=5000):
    def work():
        for _ in range(n): model(x=x)
    ts = [threading.Thread(target=work) for _ in range(k)]
    t = time.perf_counter(); [s.start() for s in ts]; [s.join() for s in ts]
    return k * n / (time.perf_counter() - t)
one, four = threads(1), threads(4)
print(f"python relu16 throughput: 1 thread {one:.0f} calls/s, 4 threads {four:.0f} calls/s ({four/one:.2f}x)")
