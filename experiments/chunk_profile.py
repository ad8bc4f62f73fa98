"""onnxruntime profile of one prefill call of T tokens at n cached: ms per op type, on the attention kernel the
runtime picks (specexport's where it builds; SPECEXPORT_KERNELS=0 for onnxruntime's).
  python experiments/chunk_profile.py BUNDLE T n [float32|bf16|bf16dot]   (the MatMul kernel's weight format)"""
import collections, json, os, re, statistics, sys, tempfile
from pathlib import Path
import numpy as np, onnxruntime as ort

import specexport
bundle, T, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
t = specexport.load(bundle, threads=2).target
from specexport.backends.ort import session_options
so = session_options(None, t.kernel, sys.argv[4] if len(sys.argv) > 4 else "float32", getattr(t, "nbits", False))
so.enable_profiling = True
so.profile_file_prefix = os.path.join(tempfile.gettempdir(), "chunk_profile")
t.session = ort.InferenceSession(str(Path(bundle) / t.entry.graph), so, providers=["CPUExecutionProvider"])
rng = np.random.default_rng(0)
def call():
    c = t.new_cache(); c.reserve(n + T); c.n = n
    return t.step(c, rng.integers(100, 40000, T).tolist(), n, rows=[T - 1]).run_s
for _ in range(2): call()
secs = [call() for _ in range(5)]
print("median", statistics.median(secs)*1e3, "ms; attention kernel:", "specexport" if t.kernel else "onnxruntime")
path = t.session.end_profiling()
ops = collections.Counter(); shapes = {}
for e in json.load(open(path)):
    if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
        nm = e["name"].replace("_kernel_time", "")
        import re
        key = e["args"]["op_name"] + ":" + re.sub(r"\d+", "#", nm)
        ops[key] += e["dur"]
        shapes[key] = str(e["args"].get("input_type_shape"))[:150]
os.remove(path)
tot = sum(ops.values())
for k, us in ops.most_common(14):
    print(f"{us/7/1e3:7.2f} ms {100*us/tot:5.1f}% {k[:70]} {shapes[k]}")
