"""Which calls a burst makes under each choice of profiles: one burst of the bench's prompts per variant on one
engine, with every target and draft `step_batch` call logged (mixed calls that carry a prefill chunk are not).

    python experiments/call_counts.py BUNDLE LEVEL "all;2,4,8;k4" [ROUNDS]

Variants: "all" (k = "auto" over every verify profile the bundle has), "K,K,..." (k = "auto" over the verify
profiles of those k only, as if built with --k K,K,...), "kN" (fixed k = N). The draft is the bundle's model;
the guard, the chains' acceptance and the learnt chances start afresh each burst. Per burst: tokens/s, wall,
seconds inside the target's and the draft's calls, and per call shape (t: target, d: draft) count@median ms.
"""
import collections
import json
import sys
import time

import numpy as np

import specexport
from burst_state import afresh, verify_ks  # experiments/
from specexport.bench.config import find_questions

bundle, level, variants = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(";")
rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 1
pipe = specexport.load(bundle, threads=2)
profiles = verify_ks(pipe)
log = []
for m in (pipe.target, pipe.draft):
    def logged(*a, _call=m.step_batch, _who="t" if m is pipe.target else "d", **k):
        out = _call(*a, **k)
        log.append((_who, a[1].shape, out.run_s))
        return out
    m.step_batch = logged
qs = [json.loads(line) for line in open(find_questions(None))][:16 * 10:10]
prompts = [pipe.encode(q["turns"][0], chat=True) for q in qs]
pipe.start_engine(max_batch=level, max_queue=len(prompts))
for p in prompts:  # the prefix cache's prompts, as every measured burst finds them
    pipe.submit(p, max_new_tokens=2).wait(600)
for r in range(rounds):
    for v in variants:
        profiles(None if v == "all" or v.startswith("k") else {int(x) for x in v.split(",")})
        afresh(pipe)
        log.clear()
        t = time.perf_counter()
        cs = [pipe.submit(p, max_new_tokens=128, draft="model", k=int(v[1:]) if v.startswith("k") else "auto") for p in prompts]
        n = sum(len(c.wait(600).token_ids) for c in cs)
        wall = time.perf_counter() - t
        calls = collections.defaultdict(list)
        for who, shape, s in log:
            calls[(who,) + tuple(shape)].append(s)
        inside = {w: sum(s for who, _, s in log if who == w) for w in "td"}
        shapes = " ".join(f"{w}{B}x{T}:{len(x)}@{1e3 * np.median(x):.1f}" for (w, B, T), x in sorted(calls.items())
                          if len(x) > 3)
        print(f"c={level} {v}: {n / wall:.1f} tokens/s, wall {wall:.1f} s, target {inside['t']:.1f} s, draft "
              f"{inside['d']:.1f} s | {shapes}", flush=True)
