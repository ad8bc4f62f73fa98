"""Median run time of one prefill call per (T, n), last-row logits only, T beyond the built profiles too (the graph
is symbolic in T).  python experiments/chunk_size.py BUNDLE"""
import sys, time, statistics
import numpy as np, specexport
t = specexport.load(sys.argv[1], threads=2).target
t.profile_ts = set(t.profile_ts) | {512, 768, 800, 1024}
rng = np.random.default_rng(0)
c = t.new_cache(); c.reserve(2048)
res = {}
for rnd in range(4):
    for T, n in [(256, 0), (512, 0), (800, 0), (256, 512), (512, 256)]:
        c.n = n
        out = t.step(c, rng.integers(100, 40000, T).tolist(), n, rows=[T - 1])
        if rnd: res.setdefault((T, n), []).append(out.run_s)
for (T, n), v in res.items():
    m = statistics.median(v); print(f"T={T} n={n}: {m*1e3:.0f} ms, {m/T*1e3:.3f} ms/token")
