"""One target call of two bundles, interleaved: T new tokens at n cached (logits of the last row), each round one
call on A and one on B, the order swapped every round, both loaded in one process. Medians, B/A, and how far
the two bundles' logits are apart (different graphs: rounding).

    python experiments/bundle_calls_ab.py A B [--backend onnxruntime] [--T 512] [--n 988] [--rounds 10]
"""
import argparse
import statistics

import numpy as np

import specexport

ap = argparse.ArgumentParser()
ap.add_argument("a")
ap.add_argument("b")
ap.add_argument("--backend", default="onnxruntime")
ap.add_argument("--T", type=int, default=512)
ap.add_argument("--n", type=int, default=988)
ap.add_argument("--rounds", type=int, default=10)
args = ap.parse_args()
ts = {x: specexport.load(x, threads=2, backend=args.backend).target for x in (args.a, args.b)}
ids = np.random.default_rng(0).integers(100, 40000, args.T).tolist()


def call(t):
    c = t.new_cache()
    c.reserve(args.n + args.T)
    c.n = args.n
    return t.step(c, ids, args.n, rows=[args.T - 1])


for x in (args.a, args.b, args.a, args.b):  # warm-up
    call(ts[x])
secs, last = {}, {}
for r in range(args.rounds):
    for x in (args.a, args.b) if r % 2 == 0 else (args.b, args.a):
        o = call(ts[x])
        secs.setdefault(x, []).append(o.run_s)
        last[x] = np.asarray(o.logits)
ma, mb = statistics.median(secs[args.a]), statistics.median(secs[args.b])
print(f"{args.backend} T={args.T} n={args.n}: {args.a} {ma * 1e3:.2f} ms, {args.b} {mb * 1e3:.2f} ms, B/A {mb / ma:.3f}x "
      f"(medians of {args.rounds}); max|dlogit| {np.abs(last[args.a] - last[args.b]).max():.2e}")
