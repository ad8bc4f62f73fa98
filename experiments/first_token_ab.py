"""Time to the first token, two ways, interleaved in one process (the order alternates per round):
  old: the cache grown bucket by bucket, prefill of prompt[:-1], then a T = 1 call on the last prompt token
       (the runtime before commit 448100e);
  new: the cache reserved once, prefill of the whole prompt, the first token from its last row (shipped).
Prompts cut from the Spec-Bench question texts joined in file order, as `specexport bench --ttft` does.

  python experiments/first_token_ab.py BUNDLE [--questions ../shared/specbench/question.jsonl]
"""
import argparse
import json
import statistics
import time

import specexport
from specexport.runtime.prefill import feed

ap = argparse.ArgumentParser()
ap.add_argument("bundle")
ap.add_argument("--questions", default="../shared/specbench/question.jsonl")
ap.add_argument("--rounds", type=int, default=5)
a = ap.parse_args()
pipe = specexport.load(a.bundle, threads=2)
t = pipe.target
ids = []
for line in open(a.questions):
    ids += pipe.encode(json.loads(line)["turns"][0] + "\n\n")


def old(p):
    c = t.new_cache()
    feed(t, c, p[:-1])
    return int(t.step(c, [p[-1]], len(p) - 1).logits[0].argmax())


def new(p):
    c = t.new_cache()
    c.reserve(len(p) + 128 + 9)
    return int(feed(t, c, p)[0].argmax())


old(ids[:64]), new(ids[:64])
at, secs, same = 64, {}, 0
for rnd in range(a.rounds):
    for n in (60, 200, 800, 1500):
        p, at = ids[at:at + n], at + n
        toks = []
        for f in ((old, new) if rnd % 2 == 0 else (new, old)):
            s = time.perf_counter()
            toks.append(f(p))
            secs.setdefault((n, f.__name__), []).append(time.perf_counter() - s)
        same += toks[0] == toks[1]
for n in (60, 200, 800, 1500):
    o, w = statistics.median(secs[(n, "old")]), statistics.median(secs[(n, "new")])
    print(f"{n:5d} tokens: old {o:.3f} s  new {w:.3f} s  old/new {o / w:.2f}x")
print(f"same first token: {same}/{4 * a.rounds}")
