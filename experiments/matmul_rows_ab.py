"""The MatMul kernel's row split (prefill calls with K > N, and MatMulSwiGLU, split by rows between the threads)
against the column split, interleaved: the bundle loaded twice in one process, once with SPECEXPORT_MATMUL_ROWS=0
(read when a kernel is made), then one call of T tokens at n cached on each, the order swapped every round.
Medians, rows/columns, and whether the logits are identical (they must be: every element is the same chain).

    python experiments/matmul_rows_ab.py BUNDLE [BACKEND] [T] [n] [ROUNDS]   (default onnxruntime 512 988 10)
"""
import os
import statistics
import sys

import numpy as np

import specexport

bundle = sys.argv[1]
backend = sys.argv[2] if len(sys.argv) > 2 else "onnxruntime"
T, n, rounds = (int(x) for x in (sys.argv[3:6] + ["512", "988", "10"][len(sys.argv[3:6]):]))
ts = {}
for v in ("0", "1"):
    os.environ["SPECEXPORT_MATMUL_ROWS"] = v
    ts[v] = specexport.load(bundle, threads=2, backend=backend).target
ids = np.random.default_rng(0).integers(100, 40000, T).tolist()


def call(t):
    c = t.new_cache()
    c.reserve(n + T)
    c.n = n
    return t.step(c, ids, n, rows=[T - 1])


for v in ("0", "1", "0", "1"):
    call(ts[v])
secs, out = {}, {}
for r in range(rounds):
    for v in ("0", "1") if r % 2 == 0 else ("1", "0"):
        o = call(ts[v])
        secs.setdefault(v, []).append(o.run_s)
        out[v] = np.asarray(o.logits).copy()
m0, m1 = statistics.median(secs["0"]), statistics.median(secs["1"])
print(f"{backend} T={T} n={n}: columns {m0 * 1e3:.1f} ms, rows {m1 * 1e3:.1f} ms: {m1 / m0:.3f}x; "
      f"logits identical: {bool((out['0'] == out['1']).all())}")
