"""Is an int8-activation target (MatMulNBits accuracy level 4) row-consistent once decode calls carry a pad row?

Scores a chain of T tokens in one verify call, then one decode call per token -- (a) a 1-token call, (b) the
token plus a pad row (a 2-token call, both rows' logits asked for, only row 0 used and committed) -- and
prints the largest |logit difference| of each against the verify call, plus the call times.
Usage: python experiments/a8_rows_probe.py BUNDLE [--seeds 3]
"""
import argparse
import time

import numpy as np

import specexport
from specexport.runtime.prefill import feed

ap = argparse.ArgumentParser()
ap.add_argument("bundle")
ap.add_argument("--seeds", type=int, default=3)
a = ap.parse_args()
m = specexport.load(a.bundle).target
V = m.entry.arch["vocab_size"]
T = max(m.entry.profiles[f"verify_{k}"] for k in m.entry.verify_ks())
for seed in range(a.seeds):
    rng = np.random.default_rng(seed)
    n0 = 40 + 37 * seed
    ids = rng.integers(0, V, n0 + T).tolist()
    res = {}
    for mode in ("verify", "decode1", "decode2"):
        cache = m.new_cache()
        feed(m, cache, ids[:n0])
        if mode == "verify":
            res[mode] = m.step(cache, ids[n0:], n0).logits
            continue
        rows = []
        for i in range(T):
            toks = [ids[n0 + i]] if mode == "decode1" else [ids[n0 + i], ids[n0 + i]]
            out = m.step(cache, toks, n0 + i)
            cache.commit(out.new_kv, [0])
            rows.append(out.logits[0])
        res[mode] = np.stack(rows)
    d1 = np.abs(res["decode1"] - res["verify"]).max(-1)
    d2 = np.abs(res["decode2"] - res["verify"]).max(-1)
    print(f"seed {seed}: T={T} per row |verify - decode1| {np.round(d1, 3).tolist()}  |verify - decode2| "
          f"{np.round(d2, 6).tolist()}")
cache = m.new_cache()
feed(m, cache, ids[:n0])
for toks in ([1], [1, 1], [1] * T):
    ts = []
    for _ in range(30):
        t = time.perf_counter()
        m.step(cache, toks, n0)
        ts.append(time.perf_counter() - t)
    print(f"T={len(toks)} call: {1e3 * np.median(ts):.2f} ms")
