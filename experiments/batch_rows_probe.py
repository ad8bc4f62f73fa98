"""Fused decode calls of B rows (pool rows at 300-350 cached tokens), interleaved: median ms per B, and with
`profile` onnxruntime's ms per op type.
  python experiments/batch_rows_probe.py BUNDLE 1,2,4,6,8 [profile]"""
import collections, json, os, sys, tempfile, time
import numpy as np, onnxruntime as ort
import specexport
from specexport.backends.ort import session_options
bundle = sys.argv[1]; Bs = [int(x) for x in sys.argv[2].split(",")]
prof = len(sys.argv) > 3
pipe = specexport.load(bundle, verify=False)
t = pipe.target
if prof:
    so = session_options(None, t.kernel); so.enable_profiling = True
    so.profile_file_prefix = os.path.join(tempfile.gettempdir(), "bprof")
    t.session = ort.InferenceSession(str(pipe.root / t.entry.graph), so)
pool = t.new_pool(max(Bs))
pool.reserve(1024)
for r in range(pool.rows):
    pool.n[r] = 300 + 7 * r
times = collections.defaultdict(list)
for _ in range(20):
    for B in Bs:
        ids = np.ones((B, 1), np.int64); pos = pool.n[:B].reshape(B, 1).astype(np.int64).copy()
        s = time.perf_counter(); t.step_batch(pool, ids, pos); times[B].append(time.perf_counter() - s)
for B in Bs:
    print(f"B={B}: {1e3*np.median(times[B][3:]):.1f} ms")
if prof:
    ev = json.load(open(t.session.end_profiling()))
    runs, cur = [], collections.Counter()
    for e in ev:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            cur[e["args"]["op_name"] + ("(head)" if "lm_head" in e["name"] or int(e["args"].get("output_size", 0)) > 1e5 else "")] += e["dur"] / 1e3
        elif e.get("cat") == "Session" and e["name"] == "model_run":
            runs.append(cur); cur = collections.Counter()
    runs = runs[-len(Bs) * 15:]
    for i, B in enumerate(Bs):
        rs = runs[i::len(Bs)]
        ops = collections.Counter()
        for r in rs:
            ops.update(r)
        print(f"B={B}:", ", ".join(f"{k} {v/len(rs):.2f}" for k, v in ops.most_common(8)))
