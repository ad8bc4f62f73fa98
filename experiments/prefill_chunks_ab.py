"""A prompt's whole prefill in calls of C tokens, with and without the LM head on the calls before the last,
rounds interleaved: which call size and whether the skipped heads pay (prefill.ALONE_CHUNK, feed_chunk).
  python experiments/prefill_chunks_ab.py BUNDLE [BACKEND] [TOKENS] [ROUNDS]   (default onnxruntime 1500 4)"""
import statistics, sys, time

import numpy as np

import specexport

bundle = sys.argv[1]
backend = sys.argv[2] if len(sys.argv) > 2 else "onnxruntime"
n = int(sys.argv[3]) if len(sys.argv) > 3 else 1500
rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 4
t = specexport.load(bundle, threads=2, backend=backend).target
ids = np.random.default_rng(0).integers(100, 40000, n).tolist()


def run(chunk: int, heads: bool) -> float:
    c = t.new_cache()
    c.reserve(n)
    i, t0 = 0, time.perf_counter()
    while i < n:
        r = min(chunk, n - i)
        out = t.step(c, ids[i:i + r], c.n, rows=[r - 1] if heads or i + r == n else [])
        c.commit(out.new_kv, range(r))
        i += r
    return time.perf_counter() - t0


secs = {}
for _ in range(rounds):
    for chunk in (256, 512, 768, n):
        for heads in (True, False):
            secs.setdefault((chunk, heads), []).append(run(chunk, heads))
base = statistics.median(secs[(256, True)])
for (chunk, heads), s in secs.items():
    m = statistics.median(s)
    print(f"{n} tokens in calls of {chunk:4d}, LM head on {'every call' if heads else 'the last only'}: "
          f"{m:.3f} s ({m / base:.2f}x 256 with every head)")
