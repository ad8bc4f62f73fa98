"""Median time of one step of a bundle's target graph per (T, S), through the runtime's own backend.

  python scripts/step_times.py bundles/smollm2 --T 1,3,5,9,64 --S 256,2048
"""
import argparse
import time

import numpy as np

import specexport

p = argparse.ArgumentParser()
p.add_argument("bundle")
p.add_argument("--T", default="1,3,5,9,64")
p.add_argument("--S", default="256,2048")
p.add_argument("--role", default="target")
p.add_argument("--runs", type=int, default=15)
a = p.parse_args()
pipe = specexport.load(a.bundle, verify=False)
model = pipe.target if a.role == "target" else pipe.draft
Ts = [t for t in map(int, a.T.split(",")) if t in model.profile_ts]
print(f"| T | " + " | ".join(f"S={s}" for s in a.S.split(",")) + " |")
print("|---|" + "---|" * len(a.S.split(",")))
for T in Ts:
    row = []
    for S in map(int, a.S.split(",")):
        cache = model.new_cache()
        cache.reserve(S)
        cache.n = S // 2  # a half-full cache (its contents do not change the cost)
        ts = []
        for _ in range(a.runs):
            t = time.perf_counter()
            model.step(cache, [1] * T, cache.n)
            ts.append(time.perf_counter() - t)
        row.append(f"{np.median(ts) * 1e3:.1f} ms")
    print(f"| {T} | " + " | ".join(row) + " |")
