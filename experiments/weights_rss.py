"""Memory of a loaded target graph with onnxruntime's MatMul (SPECEXPORT_MATMUL=0), specexport's, and specexport's
with bfloat16 weights (backend onnxruntime-bf16), each in a fresh process: RssAnon and RssFile
(/proc/self/status) after loading the graph and after one (1, 1) call (experiments/fused_calls.py).
    python experiments/weights_rss.py BUNDLE"""
import json, os, subprocess, sys
from pathlib import Path

CHILD = r"""
import json, sys, numpy as np, onnxruntime as ort
from pathlib import Path
sys.path.insert(0, sys.argv[2])
from fused_calls import fused_call
from specexport import kernels
from specexport.backends.ort import session_options
root, weights = Path(sys.argv[1]), sys.argv[3]
arch = json.loads((root / "manifest.json").read_text())["models"]["target"]["arch"]
rss = lambda: {k: int(v.split()[0]) // 1024 for k, v in (l.split(":") for l in open("/proc/self/status"))
               if k in ("RssAnon", "RssFile")}
sess = ort.InferenceSession(str(root / "target.onnx"), session_options(2, kernels.library(arch["head_dim"]), weights),
                            providers=["CPUExecutionProvider"])
loaded = rss()
cache = np.zeros((arch["num_layers"], 2, 1, arch["num_kv_heads"], 64, arch["head_dim"]), np.float32)
fused_call(sess, cache, np.array([0]), 1, arch["vocab_size"])
print(json.dumps({"loaded": loaded, "after a call": rss()}))
"""
here = str(Path(__file__).parent)
for flag, weights, who in (("0", "float32", "onnxruntime's MatMul"), ("1", "float32", "specexport's MatMul"),
                           ("1", "bf16", "specexport's MatMul, bfloat16 weights")):
    out = subprocess.run([sys.executable, "-c", CHILD, sys.argv[1], here, weights], capture_output=True, text=True,
                         check=True, env={**os.environ, "SPECEXPORT_MATMUL": flag}).stdout
    r = json.loads(out.strip().splitlines()[-1])
    print(f"{who}: " + "; ".join(f"{k}: RssAnon {v['RssAnon']} MB, RssFile {v['RssFile']} MB" for k, v in r.items()))
