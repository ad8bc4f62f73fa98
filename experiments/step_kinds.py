"""Where k = "auto" with the draft model spends a burst's steps, against plain and fixed k: every decode step of the
batching engine by its B, the k that `Engine._model_k` chose (None: nobody drafts with the model and k = auto),
whether the guard had paused that B and whether a prefill chunk rode along, with the step's mean wall time and
the part of it outside the target's batched call (host work and draft calls; a ride's call is all of it). With
--trace, every step of B >= 3 that drafted: the prices it was chosen on and the requests' running rates.

    python experiments/step_kinds.py BUNDLE [--level 8] [--requests 16] [--new 128] [--rounds 1] [--trace]
        [--rate R]  (Poisson arrivals at R requests per second; default a burst) [--fresh] [--methods plain,auto,k4]
--fresh: a new engine for every run, as `specexport bench` starts one (its guard and prices learnt from
nothing); else one engine serves every run in turn.
"""
import argparse
import collections
import random
import time

import specexport
from specexport.bench.config import find_questions, questions
from specexport.runtime.engine import Engine

ap = argparse.ArgumentParser()
ap.add_argument("bundle")
ap.add_argument("--level", type=int, default=8)
ap.add_argument("--requests", type=int, default=16)
ap.add_argument("--new", type=int, default=128)
ap.add_argument("--rounds", type=int, default=1)
ap.add_argument("--trace", action="store_true")
ap.add_argument("--fresh", action="store_true", help="a new engine per run, as the bench's")
ap.add_argument("--methods", default="plain,auto,k4")
ap.add_argument("--rate", type=float, default=0.0,
                help="Poisson arrivals at this many requests per second (0: a burst)")
a = ap.parse_args()

pipe = specexport.load(a.bundle, threads=2)
prompts = [pipe.encode(q["turns"][0], chat=True) for q in questions(find_questions(None), 4)[:a.requests]]
steps, state = [], {"k": None, "call_s": 0.0, "trace": False}
model_k, decode, step_batch = Engine._model_k, Engine._decode, pipe.target.step_batch


def traced_model_k(self, auto, B, *rest):
    k = model_k(self, auto, B, *rest)
    state["k"] = k if auto else None  # fixed k: nobody asks for a choice
    if k and B >= 3 and state["trace"]:
        dc = self.drafts.costs.cost(B, 1)
        print(f"    step {len(steps)}: B {B} k {k}: call ({B}, {k + 1}) {1000 * self.costs.cost(B, k + 1):.1f} ms, "
              f"plain {1000 * self.costs.cost(B, 1):.1f} ms, a draft call {1000 * dc:.1f} ms; rates "
              f"{[round(s.chain_rate, 2) for s in auto]}")
    return k


def timed_decode(self, dec, ride=None):
    B = self.target.batch_for(max(s.row for s in dec) + 1)
    state["k"], state["call_s"] = None, 0.0
    paused = not self.payoff.allows(B)
    t = time.perf_counter()
    decode(self, dec, ride)
    steps.append((B, state["k"], paused, ride is not None, time.perf_counter() - t, state["call_s"]))


def timed_step_batch(*args, **kw):
    t = time.perf_counter()
    out = step_batch(*args, **kw)
    state["call_s"] += time.perf_counter() - t
    return out


Engine._model_k, Engine._decode, pipe.target.step_batch = traced_model_k, timed_decode, timed_step_batch
methods = {"plain": {"draft": "none"}, "auto": {"draft": "model", "k": "auto"}, "k4": {"draft": "model", "k": 4}}
methods = {m: methods[m] for m in a.methods.split(",")}
if not a.fresh:
    pipe.start_engine(max_batch=a.level, max_queue=len(prompts))
for r in range(a.rounds):
    for name, opts in methods.items():
        if a.fresh:
            pipe.start_engine(max_batch=a.level, max_queue=len(prompts))
            pipe.submit(prompts[0][:16], max_new_tokens=2, **opts).wait()  # the bench's warm-up
        steps.clear()
        state["trace"] = a.trace and name == "auto"
        t = time.perf_counter()
        rnd = random.Random(r)
        cs = []
        for p in prompts:
            cs.append(pipe.submit(p, max_new_tokens=a.new, **opts))
            if a.rate:
                time.sleep(rnd.expovariate(a.rate))
        toks = [c.wait(900).token_ids for c in cs]
        wall = time.perf_counter() - t
        if a.fresh:
            pipe.close()
        print(f"round {r} {name}: {sum(map(len, toks)) / wall:.1f} tokens/s, {len(steps)} decode steps")
        kinds = collections.defaultdict(list)
        for B, k, paused, ride, s, call in steps:
            kinds[(B, k, paused, ride)].append((s, s - call))
        for (B, k, paused, ride), xs in sorted(kinds.items(), key=str):
            print(f"    B {B} k {k} paused {paused} ride {ride}: {len(xs)} steps, "
                  f"{1000 * sum(x for x, _ in xs) / len(xs):.1f} ms,"
                  f" outside the target's call {1000 * sum(h for _, h in xs) / len(xs):.2f} ms")
