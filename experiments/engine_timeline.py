"""Where a burst's wall time goes in the batching engine: every target call timed by kind and shape
(batched decode by B, batched first prefill chunks, single-row chunks, mixed calls), against the wall, and the
number of decoding rows per decode call. Greedy, the bench's --limit round-robin of Spec-Bench prompts.

  python experiments/engine_timeline.py BUNDLE [--level 8] [--new 128] [--draft none] [--k 4]
      [--backend onnxruntime]
"""
import argparse
import collections
import time

import specexport
from specexport.bench.config import questions
from specexport.runtime.engine import Engine

ap = argparse.ArgumentParser()
ap.add_argument("bundle")
ap.add_argument("--questions", default="../shared/specbench/question.jsonl")
ap.add_argument("--level", type=int, default=8)
ap.add_argument("--limit", type=int, default=16)
ap.add_argument("--new", type=int, default=128)
ap.add_argument("--draft", default="none")
ap.add_argument("--k", default=None, help="draft length: a number or auto (default: the runtime's)")
ap.add_argument("--backend", default="onnxruntime")
a = ap.parse_args()
pipe = specexport.load(a.bundle, threads=2, backend=a.backend)
prompts = [pipe.encode(q["turns"][0], chat=True) for q in questions(a.questions, 4, a.limit)]
print("prompt tokens", sorted(map(len, prompts)), "in all", sum(map(len, prompts)))
t, calls, rows = pipe.target, collections.defaultdict(lambda: [0, 0.0]), collections.Counter()


def timed(name, key):
    real = getattr(t, name)

    def call(*args, **kw):
        out = real(*args, **kw)
        c = calls[key(*args)]
        c[0] += 1
        c[1] += (out[0] if name == "step_mixed" else out).run_s
        return out
    setattr(t, name, call)


timed("step", lambda cache, ids, *_: f"single row, T={len(ids)}")
timed("step_batch", lambda pool, ids, *_: f"batch B={ids.shape[0]} T={ids.shape[1]}")
timed("step_mixed", lambda pool, ids, pos, mask, group, *_: f"mixed B={ids.shape[0]} T={ids.shape[1]} + {len(group)} group")
decode = Engine._decode


def counted(self, dec, ride=None):
    rows[len(dec)] += 1
    return decode(self, dec, ride)


Engine._decode = counted
pipe.start_engine(max_batch=a.level, max_queue=len(prompts))
calls.clear(), rows.clear()
t0 = time.perf_counter()
k = {} if a.k is None else {"k": a.k if a.k == "auto" else int(a.k)}
gens = [c.wait() for c in [pipe.submit(p, max_new_tokens=a.new, draft=a.draft, **k) for p in prompts]]
wall = time.perf_counter() - t0
tokens = sum(len(g.token_ids) for g in gens)
print(f"level {a.level}, draft {a.draft}: {tokens} tokens in {wall:.2f} s = {tokens / wall:.1f} tokens/s")
print("| call | calls | seconds | ms per call | share of the wall |\n|---|---|---|---|---|")
for k, (n, s) in sorted(calls.items(), key=lambda kv: -kv[1][1]):
    print(f"| {k} | {n} | {s:.2f} | {1e3 * s / n:.1f} | {100 * s / wall:.1f}% |")
busy = sum(s for _, s in calls.values())
print(f"| host and the rest | | {wall - busy:.2f} | | {100 * (wall - busy) / wall:.1f}% |")
print("decoding requests per decode step:", dict(sorted(rows.items())))
print("engine:", {k: v for k, v in pipe.engine.stats().items() if k in ("steps", "batch", "row_moves", "mixed_rides")})
