import time, numpy as np, onnx, onnxruntime as ort
from onnx import helper, TensorProto, numpy_helper
from specexport.backends.ort import session_options
M, K, N, reps = 256, 576, 1536, 20
W = np.random.randn(K, N).astype(np.float32)
# 10 chained matmuls with separate weights to mimic a layer stack (output N->K alternating)
nodes, inits = [], []
x = "x"; dims = [(K, N), (N, K)] * 5
for i, (a, b) in enumerate(dims):
    w = numpy_helper.from_array(np.random.randn(a, b).astype(np.float32) * 0.05, f"w{i}"); inits.append(w)
    nodes.append(helper.make_node("MatMul", [x, f"w{i}"], [f"y{i}"])); x = f"y{i}"
g = helper.make_graph(nodes, "mm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [M, K])],
                      [helper.make_tensor_value_info(x, TensorProto.FLOAT, [M, K])], inits)
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
s = ort.InferenceSession(m.SerializeToString(), session_options(2), providers=["CPUExecutionProvider"])
xin = np.random.randn(M, K).astype(np.float32)
for _ in range(3): s.run(None, {"x": xin})
t = time.perf_counter()
for _ in range(reps): s.run(None, {"x": xin})
dt = (time.perf_counter() - t) / reps
fl = 2 * M * K * N * 10
print(f"ORT: {dt*1e3:.1f} ms, {fl/dt/1e9:.0f} GFLOP/s")
import openvino as ov
core = ov.Core()
cm = core.compile_model(core.read_model(m.SerializeToString(), b""), "CPU", {"INFERENCE_NUM_THREADS": 2, "INFERENCE_PRECISION_HINT": "f32"})
r = cm.create_infer_request()
for _ in range(3): r.infer({0: xin})
t = time.perf_counter()
for _ in range(reps): r.infer({0: xin})
dt = (time.perf_counter() - t) / reps
print(f"OV:  {dt*1e3:.1f} ms, {fl/dt/1e9:.0f} GFLOP/s")
