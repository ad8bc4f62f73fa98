"""Memory of a loaded target graph with specexport's MatMul and with onnxruntime's (SPECEXPORT_MATMUL=0), each in a
fresh process: RssAnon and RssFile (/proc/self/status) after loading the graph and after one (1, 1) call.
    python experiments/weights_rss.py BUNDLE"""
import json, os, subprocess, sys

CHILD = r"""
import json, sys, numpy as np, onnxruntime as ort
from pathlib import Path
from specexport import kernels
from specexport.backends.ort import fused_feeds, session_options
root = Path(sys.argv[1])
arch = json.loads((root / "manifest.json").read_text())["models"]["target"]["arch"]
rss = lambda: {k: int(v.split()[0]) // 1024 for k, v in (l.split(":") for l in open("/proc/self/status"))
               if k in ("RssAnon", "RssFile")}
sess = ort.InferenceSession(str(root / "target.onnx"), session_options(2, kernels.library(arch["head_dim"])),
                            providers=["CPUExecutionProvider"])
loaded = rss()
L, Hkv, D = arch["num_layers"], arch["num_kv_heads"], arch["head_dim"]
cache = np.zeros((L, 2, 1, Hkv, 64, D), np.float32)
io = sess.io_binding()
for i in range(L):
    for j, kind in enumerate(("key", "value")):
        ov = ort.OrtValue.ortvalue_from_numpy(cache[i, j])
        io.bind_ortvalue_input(f"past_{kind}.{i}", ov)
        io.bind_ortvalue_output(f"present_{kind}.{i}", ov)
f = fused_feeds(np.array([0]), np.array([[1]]), np.array([[0]]), None)
f["logit_rows"] = np.array([0], np.int64)
for k, v in f.items():
    io.bind_cpu_input(k, v)
io.bind_output("logits")
io.bind_output("top_ids")
sess.run_with_iobinding(io)
print(json.dumps({"loaded": loaded, "after a call": rss()}))
"""
for flag, who in (("0", "onnxruntime's MatMul"), ("1", "specexport's MatMul")):
    out = subprocess.run([sys.executable, "-c", CHILD, sys.argv[1]], capture_output=True, text=True, check=True,
                         env={**os.environ, "SPECEXPORT_MATMUL": flag}).stdout
    r = json.loads(out.strip().splitlines()[-1])
    print(f"{who}: " + "; ".join(f"{k}: RssAnon {v['RssAnon']} MB, RssFile {v['RssFile']} MB" for k, v in r.items()))
