"""Does a batched decode call cost more on a pool at the capacity than on one at the smallest bucket? (Why a
fused bundle's pool is allocated at the capacity once: docs/design.md "Buckets when rows differ in length".)

    python scripts/pool_bucket_cost.py bundles/smollm2 [--rounds 30]

Two pools of 16 rows with the same committed lengths (60-210 tokens), one at S = 256 and one fixed at the
capacity; decode calls of B = 1, 8, 16 rows on each, interleaved; medians and their ratio.
"""
import argparse
import collections
import statistics

import numpy as np

import specexport
from specexport.runtime.kv import KVPool

p = argparse.ArgumentParser()
p.add_argument("bundle")
p.add_argument("--rounds", type=int, default=30)
a = p.parse_args()
t = specexport.load(a.bundle, threads=2, verify=False).target
L, Hkv, D = t.dims
rows = max(t.batch_sizes)
pools = {"S=256": KVPool(L, Hkv, t.buckets, D, rows), f"S={t.capacity} fixed": KVPool(L, Hkv, t.buckets, D, rows, fixed=True)}
pools["S=256"].reserve(256)
for pool in pools.values():
    pool.n[:] = 60 + 10 * np.arange(rows)
Bs = [b for b in (1, 8, 16) if b in t.batch_sizes]
res = collections.defaultdict(list)
for _ in range(a.rounds):
    for B in Bs:
        for name, pool in pools.items():
            ids = np.full((B, 1), 500, dtype=np.int64)
            res[name, B].append(t.step_batch(pool, ids, pool.n[:B, None].copy(), np.ones((B, 1, 1), bool)).run_s)
for B in Bs:
    small, big = (statistics.median(res[k, B]) for k in pools)
    print(f"B={B}: {list(pools)[0]} {small * 1e3:.1f} ms, {list(pools)[1]} {big * 1e3:.1f} ms ({big / small:.2f}x)")
