"""One target call on two sides, interleaved: each side a bundle loaded in this process, optionally made with the
MatMul kernel's column split (",rows=0": SPECEXPORT_MATMUL_ROWS=0 while its kernels are made) or on another build
of specexport's kernel library (",lib=FILE", e.g. built from an older commit's specexport/kernels: cc -O3
-march=native -std=gnu11 -fPIC -shared -I specexport/kernels/include gqa.c matmul.c matmul4.c -o FILE -lm).
Each round one call of T tokens at n cached (the last row's logits) on A and one on B, the order swapped every
round. Medians, B/A, and how far the two sides' logits are apart (0 where only the split or an exact kernel
change differs; rounding where the graphs do).

    python experiments/calls_ab.py A B [--backend onnxruntime] [--T 512] [--n 988] [--rounds 10]
    e.g. bundles/seeded bundles/fused | bundles/fused,rows=0 bundles/fused | bundles/fused,lib=/tmp/old.so bundles/fused
"""
import argparse
import os
import statistics
from pathlib import Path

import numpy as np
import onnxruntime as ort

import specexport
from specexport.backends.ort import session_options

ap = argparse.ArgumentParser()
ap.add_argument("a")
ap.add_argument("b")
ap.add_argument("--backend", default="onnxruntime")
ap.add_argument("--T", type=int, default=512)
ap.add_argument("--n", type=int, default=988)
ap.add_argument("--rounds", type=int, default=10)
args = ap.parse_args()
weights = {"onnxruntime": "float32", "onnxruntime-bf16": "bf16", "onnxruntime-bf16dot": "bf16dot"}[args.backend]


def side(spec: str):
    bundle, *opts = spec.split(",")
    opts = dict(o.split("=", 1) for o in opts)
    os.environ["SPECEXPORT_MATMUL_ROWS"] = opts.get("rows", "1")
    t = specexport.load(bundle, threads=2, backend=args.backend).target
    if "lib" in opts:
        t.session = ort.InferenceSession(str(Path(bundle) / t.entry.graph), session_options(2, opts["lib"], weights),
                                         providers=["CPUExecutionProvider"])
    os.environ.pop("SPECEXPORT_MATMUL_ROWS")
    return t


ts = {args.a: side(args.a), args.b: side(args.b)}
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
        last[x] = np.asarray(o.logits).copy()
ma, mb = statistics.median(secs[args.a]), statistics.median(secs[args.b])
print(f"{args.backend} T={args.T} n={args.n}: {args.a} {ma * 1e3:.2f} ms, {args.b} {mb * 1e3:.2f} ms, B/A {mb / ma:.3f}x "
      f"(medians of {args.rounds}); max|dlogit| {np.abs(last[args.a] - last[args.b]).max():.2e}")
