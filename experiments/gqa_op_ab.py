"""The attention op's time alone: onnxruntime's profiler over the GroupQueryAttention nodes of decode calls (B, 1)
at 300+ cached tokens, git revision REV's kernel library against the working tree's, interleaved (order swapped
each round), ROUNDS rounds; per call shape the median and interquartile range of the nodes' time per call (the
first two calls dropped). A whole call's A/B (gqa_kernel_ab.py) buries a change of the attention in the MatMuls'
noise on a shared machine; this measures the op alone.
    python experiments/gqa_op_ab.py BUNDLE [ROUNDS] [REV]   (default 20, HEAD)"""
import bisect, json, os, statistics, sys, tempfile
import numpy as np, onnxruntime as ort
from specexport import kernels
from fused_calls import fused_call, rev_library  # experiments/
from specexport.backends.ort import session_options
from pathlib import Path
root = Path(sys.argv[1])
R = int(sys.argv[2]) if len(sys.argv) > 2 else 20
rev = sys.argv[3] if len(sys.argv) > 3 else "HEAD"
arch = json.loads((root / "manifest.json").read_text())["models"]["target"]["arch"]
L, Hkv, D, V, S = arch["num_layers"], arch["num_kv_heads"], arch["head_dim"], arch["vocab_size"], 2048
os.environ["SPECEXPORT_MATMUL"] = "0"
libs = {rev: rev_library(rev), "new": kernels.library(D)}
sess = {}
for who, lib in libs.items():
    so = session_options(2, lib, "float32")
    so.enable_profiling = True
    so.profile_file_prefix = os.path.join(tempfile.gettempdir(), f"gqa_op_ab_{who}")
    sess[who] = ort.InferenceSession(str(root / "target.onnx"), so, providers=["CPUExecutionProvider"])
cache = {w: np.random.default_rng(0).standard_normal((L, 2, 16, Hkv, S, D), dtype=np.float32) * 0.5 for w in sess}
Bs = (1, 8, 16)
order = []
for r in range(R):
    for B in Bs:
        for who in (sess if r % 2 else list(sess)[::-1]):
            fused_call(sess[who], cache[who], 300 + 5 * np.arange(B), 1, V)
            order.append((who, B))
for who, s in sess.items():
    ev = json.load(open(s.end_profiling()))
    runs = [e for e in ev if e.get("name") == "model_run"]
    starts = [e["ts"] for e in runs]
    gqa = [0.0] * len(runs)
    for e in ev:
        if (e.get("cat") == "Node" and e["name"].endswith("_kernel_time")
                and e["args"].get("op_name") == "GroupQueryAttention"):
            gqa[bisect.bisect_right(starts, e["ts"]) - 1] += e["dur"] / 1e3
    mine = [B for w, B in order if w == who]
    for B in Bs:
        xs = [g for g, b in zip(gqa, mine) if b == B][2:]
        lo, hi = np.percentile(xs, 25), np.percentile(xs, 75)
        print(f"{who} ({B},1): attention {statistics.median(xs):.2f} ms (IQR {lo:.2f}-{hi:.2f})")
