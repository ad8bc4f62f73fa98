"""One target call on two builds of specexport's kernel library, interleaved: the bundle loaded twice in one
process, one of its sessions made anew with LIBRARY (another build of specexport/kernels, e.g. from an older
commit: cc -O3 -march=native -std=gnu11 -fPIC -shared -I specexport/kernels/include gqa.c matmul.c matmul4.c
-o LIBRARY -lm), then one call of T tokens at n cached on each, the order swapped every round. Medians,
this build over LIBRARY's, and how far their logits are apart.

    python experiments/kernels_ab.py BUNDLE LIBRARY [BACKEND] [T] [n] [ROUNDS]   (onnxruntime 512 988 10)
"""
import statistics
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort

import specexport
from specexport.backends.ort import session_options

bundle, lib = sys.argv[1], sys.argv[2]
backend = sys.argv[3] if len(sys.argv) > 3 else "onnxruntime"
T, n, rounds = (int(x) for x in (sys.argv[4:7] + ["512", "988", "10"][len(sys.argv[4:7]):]))
new, old = (specexport.load(bundle, threads=2, backend=backend).target for _ in range(2))
weights = {"onnxruntime": "float32", "onnxruntime-bf16": "bf16", "onnxruntime-bf16dot": "bf16dot"}[backend]
old.session = ort.InferenceSession(str(Path(bundle) / old.entry.graph), session_options(2, lib, weights),
                                   providers=["CPUExecutionProvider"])
ids = np.random.default_rng(0).integers(100, 40000, T).tolist()


def call(t):
    c = t.new_cache()
    c.reserve(n + T)
    c.n = n
    return t.step(c, ids, n, rows=[T - 1])


ts = {"new": new, "old": old}
for v in ("old", "new", "old", "new"):
    call(ts[v])
secs, out = {}, {}
for r in range(rounds):
    for v in ("old", "new") if r % 2 == 0 else ("new", "old"):
        o = call(ts[v])
        secs.setdefault(v, []).append(o.run_s)
        out[v] = np.asarray(o.logits).copy()
m0, m1 = statistics.median(secs["old"]), statistics.median(secs["new"])
print(f"{backend} T={T} n={n}: {lib} {m0 * 1e3:.2f} ms, this build {m1 * 1e3:.2f} ms: {m1 / m0:.3f}x (medians of "
      f"{rounds}); max|dlogit| {np.abs(out['old'] - out['new']).max():.2e}")
