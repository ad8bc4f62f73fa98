"""Median ms of a fused target's calls per (B, T), pool rows at 300-405 cached tokens, shapes interleaved per
round; one JSON line. To compare two versions of the kernels, run it alternately from two checkouts (the
kernel library is built from, and cached by, the sources it is imported from):
  for i in 1 2 3; do for p in /tmp/old /work/main; do PYTHONPATH=$p python experiments/call_shapes.py BUNDLE 9; done; done"""
import collections, json, sys, time

import numpy as np

import specexport

t = specexport.load(sys.argv[1], verify=False).target
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 9
shapes = [(1, 1), (1, 3), (1, 5), (1, 9), (2, 1), (2, 5), (4, 1), (4, 3), (6, 1), (8, 1), (8, 3), (16, 1),
          (1, 64), (1, 256)]
pool = t.new_pool(16)
pool.reserve(1024)
times = collections.defaultdict(list)
for r in range(rounds):
    for B, T in shapes:
        pool.n[:16] = 300 + 7 * np.arange(16)  # nothing is committed: every call sees the same caches
        ids = np.ones((B, T), np.int64)
        pos = (pool.n[:B].reshape(B, 1) + np.arange(T)).astype(np.int64)
        s = time.perf_counter()
        t.step_batch(pool, ids, pos, rows=[T - 1] if T > 16 else None)  # a prefill chunk: its last row's logits
        times[(B, T)].append(time.perf_counter() - s)
print(json.dumps({f"{B}x{T}": round(1e3 * float(np.median(v[2:])), 2) for (B, T), v in times.items()}))
