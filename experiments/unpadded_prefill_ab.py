"""Prefill with the remainder unpadded (a call of any T, `OrtBackend.any_t`) against the profiles' padded plan,
one process, the two alternated per round (which goes first alternates too): seconds to prefill prompts of
given lengths (random ids) on a bundle's target, medians; the last row's logits compared exactly.
  python experiments/unpadded_prefill_ab.py BUNDLE [LENGTHS=60,200,800,1500] [ROUNDS=5]"""
import statistics, sys, time

import numpy as np

import specexport
from specexport.runtime import prefill

bundle = sys.argv[1]
lengths = [int(x) for x in (sys.argv[2] if len(sys.argv) > 2 else "60,200,800,1500").split(",")]
rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 5
t = specexport.load(bundle, threads=2).target
assert t.any_t, "this target runs the profiles only (specexport's kernels off?): nothing to compare"
rng = np.random.default_rng(0)


def run(ids, any_t):
    t.any_t, calls, step = any_t, [], t.step
    t.step = lambda cache, x, *a, **k: calls.append(len(x)) or step(cache, x, *a, **k)
    cache = t.new_cache()
    cache.reserve(len(ids) + 1)
    t0 = time.perf_counter()
    logits, _ = prefill.feed(t, cache, ids)
    dt = time.perf_counter() - t0
    del t.step
    return dt, logits, calls


run(rng.integers(100, 40000, 300).tolist(), True)  # warm-up: the first calls of each shape
for n in lengths:
    secs, same = {True: [], False: []}, True
    for r in range(rounds):
        ids = rng.integers(100, 40000, n).tolist()
        outs = {}
        for any_t in ((True, False) if r % 2 == 0 else (False, True)):
            dt, logits, calls = run(ids, any_t)
            secs[any_t].append(dt)
            outs[any_t] = (logits, calls)
        same &= bool(np.array_equal(outs[True][0], outs[False][0]))
    a, b = statistics.median(secs[True]), statistics.median(secs[False])
    print(f"{n:5d} tokens: unpadded {a:.3f} s {outs[True][1]}, padded {b:.3f} s {outs[False][1]}: "
          f"{b / a:.2f}x faster; per round {' '.join(f'{y / x:.2f}' for x, y in zip(secs[True], secs[False]))}; "
          f"last logits identical: {same}")
t.any_t = True
