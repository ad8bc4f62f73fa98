"""What the fused graph's new_kv output costs: the same graph with new_kv (and the nodes only it needs)
removed, interleaved against the original: decode calls at B = 1 and 8 rows, a 5-token verify, a 256-token chunk.
  python experiments/new_kv_probe.py BUNDLE   (a fused bundle with batch size 8; writes and removes target.nokv.onnx)"""
import sys, time, statistics, numpy as np, onnx, onnxruntime as ort
from pathlib import Path
import specexport
from specexport.backends.ort import session_options, fused_feeds, bind_cache, logit_rows
bundle = Path(sys.argv[1])
pipe = specexport.load(bundle, verify=False)
t = pipe.target
src = bundle / t.entry.graph
m = onnx.load(str(src), load_external_data=False)
keep = [o for o in m.graph.output if o.name != "new_kv"]
del m.graph.output[:]; m.graph.output.extend(keep)
need = {o.name for o in keep}; nodes = []
for nd in reversed(list(m.graph.node)):
    if any(o in need for o in nd.output):
        nodes.append(nd); need.update(nd.input)
print("nodes", len(m.graph.node), "->", len(nodes))
del m.graph.node[:]; m.graph.node.extend(reversed(nodes))
dst = bundle / "target.nokv.onnx"
onnx.save(m, str(dst))
sess = {"orig": t.session, "nokv": ort.InferenceSession(str(dst), session_options())}
L, Hkv, D = t.dims
pool = t.new_pool(8); pool.reserve(1024)
for r in range(8): pool.n[r] = 200 + 11 * r
def call(name, B, T, first=0):
    s = sess[name]
    n = pool.n[first:first + B].astype(np.int64)
    ids = np.ones((B, T), np.int64); pos = (n[:, None] + np.arange(T)).astype(np.int64)
    feeds = fused_feeds(n, ids, pos, None); feeds["logit_rows"] = logit_rows(T, [T - 1] if T > 9 else None)
    R = len(feeds["logit_rows"])
    io = bind_cache(s.io_binding(), zip(t.kv_names, pool.views(B, first)))
    for k, v in feeds.items(): io.bind_cpu_input(k, v)
    outs = {"logits": np.empty((B, R, t.vocab), np.float32), "top_ids": np.empty((B, R, t.top_k), np.int64)}
    if name == "orig": outs["new_kv"] = np.empty((L, 2, B, Hkv, T, D), np.float32)
    for k, a in outs.items(): io.bind_output(k, "cpu", 0, a.dtype.type, list(a.shape), a.ctypes.data)
    a = time.perf_counter(); s.run_with_iobinding(io); return time.perf_counter() - a
shapes = [(1, 1), (8, 1), (1, 5), (1, 256)]
res = {}
for rnd in range(12):
    for B, T in shapes:
        for name in (("orig", "nokv") if rnd % 2 else ("nokv", "orig")):
            res.setdefault((B, T, name), []).append(call(name, B, T))
for B, T in shapes:
    o, k = (statistics.median(res[(B, T, n)][2:]) for n in ("orig", "nokv"))
    print(f"B={B} T={T}: with new_kv {1e3*o:.2f} ms, without {1e3*k:.2f} ms, {o/k:.3f}x")
dst.unlink()
