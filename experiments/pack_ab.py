"""Calls that cover only the busy rows, interleaved against the engine before it, in one process:
  old: decode calls padded to a built batch size above the highest busy row, rows never move;
  new: onnxruntime calls of exactly [0, highest busy row] (any B up to the largest built) and decoding
       requests moved down into free rows when that shrinks the call (shipped: Engine._pack).
A burst of Spec-Bench prompts (the bench's --limit round-robin) at each level, rounds alternate the order.
Every output is checked against the request run alone.

  python experiments/pack_ab.py BUNDLE [--levels 8,16] [--drafts none,recycle] [--rounds 3] [--new 128]
"""
import argparse
import statistics
import time

import specexport
from specexport.bench.config import questions
from specexport.runtime.engine import Engine

ap = argparse.ArgumentParser()
ap.add_argument("bundle")
ap.add_argument("--questions", default="../shared/specbench/question.jsonl")
ap.add_argument("--levels", default="8,16")
ap.add_argument("--drafts", default="none,recycle")
ap.add_argument("--limit", type=int, default=16)
ap.add_argument("--rounds", type=int, default=3)
ap.add_argument("--new", type=int, default=128)
a = ap.parse_args()
pipe = specexport.load(a.bundle, threads=2)
prompts = [pipe.encode(q["turns"][0], chat=True) for q in questions(a.questions, 4, a.limit)]
want = [pipe.generate(p, max_new_tokens=a.new, draft="none").token_ids for p in prompts]
tgt, pack = pipe.target, Engine._pack


def variant(name):
    if name == "old":
        tgt.runs_batch = lambda B: B in tgt.batch_sizes  # the built sizes only (BackendBase.runs_batch)
        Engine._pack = lambda self, dec: None
    else:
        tgt.__dict__.pop("runs_batch", None)  # the class's (onnxruntime: any B)
        Engine._pack = pack


def burst(level, draft):
    pipe.start_engine(max_batch=level, max_queue=len(prompts))
    t = time.perf_counter()
    cs = [pipe.submit(p, max_new_tokens=a.new, draft=draft) for p in prompts]
    got = [c.wait().token_ids for c in cs]
    dt = time.perf_counter() - t
    st = pipe.engine.stats()
    return sum(map(len, got)) / dt, sum(g == w for g, w in zip(got, want)), st["batch"], st["row_moves"]


res = {}
for rnd in range(a.rounds):
    for level in map(int, a.levels.split(",")):
        for draft in a.drafts.split(","):
            for v in (("old", "new") if rnd % 2 == 0 else ("new", "old")):
                variant(v)
                tps, same, batch, moves = burst(level, draft)
                res.setdefault((level, draft, v), []).append(tps)
                print(f"round {rnd} level {level} {draft:8s} {v}: {tps:6.1f} tok/s, identical {same}/{len(prompts)}, "
                      f"moves {moves}, calls by B {dict(sorted(batch.items()))}", flush=True)
print("\n| level | draft | old tok/s | new tok/s | new/old |\n|---|---|---|---|---|")
for level in map(int, a.levels.split(",")):
    for draft in a.drafts.split(","):
        o, n = (statistics.median(res[(level, draft, v)]) for v in ("old", "new"))
        print(f"| {level} | {draft} | {o:.1f} | {n:.1f} | {n / o:.2f}x |")
