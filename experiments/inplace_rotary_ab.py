"""Two fused target graphs' calls, interleaved: OLD (rotary as graph ops, a new_kv output) against NEW (the
rotary inside GroupQueryAttention from cos/sin tables, no new_kv: the K/V only written in place). Same
inputs, past and present bound to one buffer per graph, logits compared.
    python experiments/inplace_rotary_ab.py OLD.onnx NEW.onnx [ROUNDS]
Calls: decode (1, 1) and (8, 1) at ~300 cached tokens, a 9-token chain (1, 9), a 64-token chunk at n = 0."""
import collections, statistics, sys, time
import numpy as np, onnxruntime as ort
from specexport.backends.ort import fused_feeds, session_options

old_path, new_path = sys.argv[1], sys.argv[2]
ROUNDS = int(sys.argv[3]) if len(sys.argv) > 3 else 20
L, Hkv, D, S, V = 30, 3, 64, 2048, 49152


def session(path):
    s = ort.InferenceSession(path, session_options(2), providers=["CPUExecutionProvider"])
    return s, [o.name for o in s.get_outputs()]


sessions = {"old": session(old_path), "new": session(new_path)}
rng = np.random.default_rng(0)
base = rng.standard_normal((L, 2, 8, Hkv, S, D), dtype=np.float32) * 0.5
caches = {k: base.copy() for k in sessions}


def call(which, B, T, n):
    sess, outs = sessions[which]
    io = sess.io_binding()
    cache = caches[which]
    for i in range(L):
        for j, kind in enumerate(("key", "value")):
            ov = ort.OrtValue.ortvalue_from_numpy(cache[i, j, :B])
            io.bind_ortvalue_input(f"past_{kind}.{i}", ov)
            io.bind_ortvalue_output(f"present_{kind}.{i}", ov)
    ids = np.full((B, T), 1000, np.int64)
    pos = n[:, None] + np.arange(T)[None]
    f = fused_feeds(n, ids, pos, None)
    f["logit_rows"] = np.arange(T, dtype=np.int64) if T <= 9 else np.array([T - 1], np.int64)
    for k, v in f.items():
        io.bind_cpu_input(k, v)
    logits = np.empty((B, len(f["logit_rows"]), V), np.float32)
    io.bind_output("logits", "cpu", 0, np.float32, list(logits.shape), logits.ctypes.data)
    for o in outs:
        if o in ("new_kv", "top_ids"):
            io.bind_output(o)
    t = time.perf_counter()
    sess.run_with_iobinding(io)
    return time.perf_counter() - t, logits


cases = {"(1,1) n=300": (1, 1, np.array([300])), "(8,1) n=300..349": (8, 1, 300 + 7 * np.arange(8)),
         "(1,9) n=300": (1, 9, np.array([300])), "(1,64) n=0": (1, 64, np.array([0]))}
times = collections.defaultdict(list)
for name, (B, T, n) in cases.items():
    a, b = call("old", B, T, n)[1], call("new", B, T, n)[1]
    print(f"{name}: max |logit diff| {np.abs(a - b).max():.2e}, argmax same {(a.argmax(-1) == b.argmax(-1)).mean():.2f}")
for r in range(ROUNDS):
    for name, (B, T, n) in cases.items():
        for which in (("old", "new") if r % 2 else ("new", "old")):
            times[name, which].append(call(which, B, T, n)[0])
for name in cases:
    o, nw = (statistics.median(times[name, w]) * 1e3 for w in ("old", "new"))
    print(f"{name}: old {o:.2f} ms, new {nw:.2f} ms, old/new {o / nw:.3f}x")
