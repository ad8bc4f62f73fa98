"""What the target's (B, T) calls and the draft's (B, 1) calls cost: median ms, every row at 300-405 cached
tokens, the shapes interleaved round by round; one JSON line ("t2x4": the target's (2, 4) call, "d4x1": the
draft's (4, 1) call). Chosen to show where B x T rows pass the 9-row register blocks of specexport's MatMul
once (1x9, 2x4, 3x3, 4x2, 8x1) or twice (2x5, 3x4, 4x3, 8x2).

    python experiments/verify_pass_shapes.py BUNDLE [ROUNDS]
"""
import collections, json, sys, time
import numpy as np
import specexport

p = specexport.load(sys.argv[1], verify=False)
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 9
tshapes = [(1, 1), (1, 5), (1, 9), (2, 1), (2, 3), (2, 4), (2, 5), (3, 1), (3, 3), (3, 4),
           (4, 1), (4, 2), (4, 3), (8, 1), (8, 2)]
dshapes = [1, 2, 3, 4, 8]
models = {"t": p.target, "d": p.draft}
pools = {k: m.new_pool(16) for k, m in models.items()}
for pl in pools.values():
    pl.reserve(1024)
times = collections.defaultdict(list)
for r in range(rounds):
    for key, B, T in [("t", B, T) for B, T in tshapes] + [("d", B, 1) for B in dshapes]:
        pl = pools[key]
        pl.n[:16] = 300 + 7 * np.arange(16)
        ids = np.ones((B, T), np.int64)
        pos = (pl.n[:B].reshape(B, 1) + np.arange(T)).astype(np.int64)
        s = time.perf_counter()
        models[key].step_batch(pl, ids, pos)
        times[(key, B, T)].append(time.perf_counter() - s)
print(json.dumps({f"{k}{B}x{T}": round(1e3 * float(np.median(v[2:])), 2) for (k, B, T), v in times.items()}))
