"""One MatMulNBits node (int4 weights, blocks of 32) on SmolLM2-135M's shapes, specexport's kernel
(kernels/matmul4.c) against onnxruntime's int8-activation one, at M rows: medians of the call times and the
int8 multiply-adds per second they reach. Weights are random; only the time is read.

    python experiments/matmul4_micro.py [--rows 1,9,64,256] [--calls 30] [--threads 2]
"""
import argparse
import os
import statistics
import tempfile
import time

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from specexport import kernels
from specexport.backends.ort import session_options

SHAPES = [(576, 960), (576, 576), (576, 3072), (1536, 576)]  # (K, N): qkv, o, gate+up, down (SmolLM2-135M)


def session(path, K, N, nbits, threads):
    rng = np.random.default_rng(0)
    nb = K // 32
    B = rng.integers(0, 256, (N, nb, 16), dtype=np.uint8)
    S = (rng.random((N, nb)) * 0.02 + 1e-3).astype(np.float32)
    node = helper.make_node("MatMulNBits", ["A", "B", "S"], ["Y"], domain="com.microsoft", K=K, N=N, bits=4,
                            block_size=32, accuracy_level=4)
    g = helper.make_graph([node], "mm4", [helper.make_tensor_value_info("A", TensorProto.FLOAT, ["M", K])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["M", N])],
                          [numpy_helper.from_array(B, "B"), numpy_helper.from_array(S, "S")])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]),
              path)
    so = session_options(threads, kernels.library(64), "float32", nbits)
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="1,9,64,256")
    ap.add_argument("--calls", type=int, default=30)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--only", choices=["specexport", "onnxruntime"])
    a = ap.parse_args()
    tmp = tempfile.mkdtemp()
    rows = [int(r) for r in a.rows.split(",")]
    names = [n for n in ("specexport", "onnxruntime") if a.only in (None, n)]
    for K, N in SHAPES:
        sess = {n: session(os.path.join(tmp, f"{K}-{N}-{n}.onnx"), K, N, n == "specexport", a.threads) for n in names}
        for M in rows:
            x = np.random.default_rng(1).standard_normal((M, K)).astype(np.float32)
            times = {n: [] for n in sess}
            for _ in range(a.calls):
                for n, s in sess.items():
                    t = time.perf_counter()
                    s.run(None, {"A": x})
                    times[n].append(time.perf_counter() - t)
            cells = []
            for n in sess:
                med = statistics.median(times[n][3:])
                cells.append(f"{n} {med * 1e3:7.3f} ms {M * K * N / med / 1e9:6.1f} GMAC/s")
            print(f"K={K:5d} N={N:5d} M={M:4d}  " + "  ".join(cells), flush=True)


if __name__ == "__main__":
    main()
