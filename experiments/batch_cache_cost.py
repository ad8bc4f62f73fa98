"""What the cache costs a batched decode call: one (B, 1) target call with every row at n cached tokens, for
several n, rounds interleaved (the weights' read is the n = 0 call; the rest is the rows' attention over their
caches). SPECEXPORT_ATTENTION_AMX=0 runs a bf16dot target's float32 attention instead of the AMX one.
  python experiments/batch_cache_cost.py BUNDLE [BACKEND] [B] [ROUNDS]   (default onnxruntime-bf16dot 8 15)"""
import statistics, sys

import numpy as np

import specexport

bundle = sys.argv[1]
backend = sys.argv[2] if len(sys.argv) > 2 else "onnxruntime-bf16dot"
B = int(sys.argv[3]) if len(sys.argv) > 3 else 8
rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 15
p = specexport.load(bundle, threads=2, backend=backend)
t, eng = p.target, p.start_engine(max_batch=B, warm=False)
pool = eng.pool
while len(pool.free) > pool.rows - B:
    pool.acquire()
secs = {}
for _ in range(rounds):
    for n in (0, 100, 400, 800):
        pool.n[:B] = n  # the rows' committed lengths: what their attention reads (values are the pool's zeros)
        out = t.step_batch(pool, np.zeros((B, 1), dtype=np.int64), np.full((B, 1), n, dtype=np.int64))
        secs.setdefault(n, []).append(out.run_s)
for n, v in secs.items():
    print(f"({B}, 1) call, {n} cached tokens a row: {statistics.median(v) * 1e3:.2f} ms")
eng.close()
