"""Prefill on OpenVINO: the whole prompt in one call (T = prompt length, on the dynamic model, empty past)
against the profile chunks (prefill.feed), interleaved; same last-row logits?
    python experiments/ov_whole_prefill.py BUNDLE BACKEND 200,800,1500 ROUNDS"""
import sys, time, statistics, os
import numpy as np
os.environ["SPECEXPORT_OV_FIXED"] = "0"
import specexport
from specexport.runtime import prefill
bundle, backend, lens, rounds = sys.argv[1], sys.argv[2], [int(x) for x in sys.argv[3].split(",")], int(sys.argv[4])
m = specexport.load(bundle, threads=2, backend=backend).target
m.check_profile = lambda T: None
rng = np.random.default_rng(0)
def chunked(ids):
    c = m.new_cache(); c.reserve(len(ids) + 64)
    t = time.perf_counter(); lg, _ = prefill.feed(m, c, ids); return time.perf_counter() - t, lg, c
def whole(ids):
    c = m.new_cache(); c.reserve(len(ids) + 64)
    t = time.perf_counter()
    out = m.step(c, ids, 0, rows=[len(ids) - 1]); c.commit(out.new_kv, range(len(ids)))
    return time.perf_counter() - t, out.logits[0], c
for n in lens:
    ids = rng.integers(100, 40000, n).tolist()
    a, b = [], []
    for r in range(rounds):
        for f, acc in ((chunked, a), (whole, b)) if r % 2 == 0 else ((whole, b), (chunked, a)):
            s, lg, c = f(ids); acc.append(s)
    _, l1, c1 = chunked(ids); _, l2, c2 = whole(ids)
    print(f"{backend} n={n}: chunks {statistics.median(a):.3f} s, one call {statistics.median(b):.3f} s "
          f"({statistics.median(a)/statistics.median(b):.2f}x), argmax same {l1.argmax()==l2.argmax()}, "
          f"max logit diff {np.abs(l1-l2).max():.3f}", flush=True)
