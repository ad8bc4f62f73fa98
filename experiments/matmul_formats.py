"""One weight MatMul alone (A [M, K] x W [K, N], W a random initializer) in specexport's three weight formats,
float32, bf16 and bf16dot (kernels/matmul.c), interleaved: ms and GFLOP/s per row count.
    python experiments/matmul_formats.py [K N ROUNDS]      (default 576 12288 15: eight SmolLM2 up-projections)"""
import statistics, sys, tempfile, time
from pathlib import Path
import numpy as np, onnx, onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper
from specexport import kernels
from specexport.backends.ort import session_options

K, N, ROUNDS = (int(a) for a in (sys.argv[1:4] if len(sys.argv) > 3 else (576, 12288, 15)))
W = np.random.default_rng(0).standard_normal((K, N), dtype=np.float32)
g = helper.make_graph([helper.make_node("MatMul", ["A", "B"], ["Y"])], "mm",
                      [helper.make_tensor_value_info("A", TensorProto.FLOAT, ["M", K])],
                      [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)], [numpy_helper.from_array(W, "B")])
path = Path(tempfile.mkdtemp()) / "mm.onnx"
onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)]), path)
lib = kernels.library(64)
formats = ("float32", "bf16") + (("bf16dot",) if kernels.matmul_dot(lib) else ())
S = {w: ort.InferenceSession(str(path), session_options(2, lib, w), providers=["CPUExecutionProvider"]) for w in formats}
T: dict = {}
for r in range(ROUNDS):
    for M in (1, 6, 9, 12, 64, 256):
        x = np.random.default_rng(M).standard_normal((M, K), dtype=np.float32)
        for w in (formats if r % 2 else formats[::-1]):
            t = time.perf_counter()
            S[w].run(None, {"A": x})
            T.setdefault((M, w), []).append(time.perf_counter() - t)
for M in (1, 6, 9, 12, 64, 256):
    print(f"M={M}: " + "  ".join(f"{w} {statistics.median(T[M, w]) * 1e3:.2f} ms "
                                  f"({2 * M * K * N / statistics.median(T[M, w]) / 1e9:.0f} GFLOP/s)" for w in formats))
