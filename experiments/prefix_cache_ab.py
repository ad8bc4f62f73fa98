"""The batching engine with and without its prefix cache (runtime/prefix.py, DEFAULT_MB) on the same bursts: 16
Spec-Bench prompts (chat template: 24 of their 49-120 tokens are its preamble), 128 new tokens, `--level` at once, plain
decoding and the int4 self-draft with k = "auto", each on a fresh engine, the order reversed every round;
tokens/s, engine steps and the batch sizes they ran, and whether every output matches the first run's.
    python experiments/prefix_cache_ab.py BUNDLE [--level 8] [--rounds 2] [--methods plain,auto]"""
import argparse
import collections
import statistics
import time

import specexport
from specexport.bench.config import find_questions, questions
from specexport.runtime.prefix import DEFAULT_MB

ap = argparse.ArgumentParser()
ap.add_argument("bundle")
ap.add_argument("--level", type=int, default=8)
ap.add_argument("--rounds", type=int, default=2)
ap.add_argument("--methods", default="plain,auto")
a = ap.parse_args()

pipe = specexport.load(a.bundle, threads=2)
prompts = [pipe.encode(q["turns"][0], chat=True) for q in questions(find_questions(None), 4)[:16]]
meths = {"plain": dict(draft="none"), "auto": dict(draft="model", k="auto")}
meths = {m: meths[m] for m in a.methods.split(",")}
res, ref = collections.defaultdict(list), {}
for r in range(a.rounds):
    order = [(m, mb) for m in meths for mb in (0, DEFAULT_MB)]
    for m, mb in order[::-1] if r % 2 else order:
        pipe.start_engine(max_batch=a.level, max_queue=64, prefix_cache_mb=mb)
        pipe.submit(prompts[0][:16], max_new_tokens=2, **meths[m]).wait()  # the bench's warm-up
        t = time.perf_counter()
        cs = [pipe.submit(p, max_new_tokens=128, **meths[m]) for p in prompts]
        toks = [c.wait(900).token_ids for c in cs]
        wall = time.perf_counter() - t
        st = pipe.engine.stats()
        pipe.close()
        same = sum(x == y for x, y in zip(toks, ref.setdefault(m, toks)))
        res[m, mb].append(sum(map(len, toks)) / wall)
        print(f"round {r} {m} prefix cache {mb} MB: {res[m, mb][-1]:.1f} tokens/s, {st['steps']} steps, batch "
              f"{st['batch']}, {same}/16 as the first run, cache {st['prefix_cache']}", flush=True)
for (m, mb), v in res.items():
    print(f"{m} prefix cache {mb} MB: median {statistics.median(v):.1f} tokens/s {[round(x, 1) for x in v]}")
