"""The recycle drafter's per-depth calibration of its tree scores, interleaved against the raw scores, in one
process (rounds alternate the order):
  raw: expected tokens of verifying the first i+1 nodes = 1 + their scores (products of per-kind hit rates);
  calibrated: each score scaled by the drafter's measured accepted / predicted ratio at its depth (shipped).
Solo generation (draft recycle, k auto) on the first question of each Spec-Bench category, and the batching
engine's burst of the --limit prompts at --level (recycle, and plain decoding for reference). Every output is
checked against plain decoding.

  python experiments/calibration_ab.py BUNDLE [--level 2] [--rounds 3] [--new 128]
"""
import argparse
import statistics
import time

import specexport
from specexport.bench.config import questions
from specexport.runtime.drafters.recycle import RecycleDrafter

ap = argparse.ArgumentParser()
ap.add_argument("bundle")
ap.add_argument("--questions", default="../shared/specbench/question.jsonl")
ap.add_argument("--level", type=int, default=2)
ap.add_argument("--limit", type=int, default=16)
ap.add_argument("--rounds", type=int, default=3)
ap.add_argument("--new", type=int, default=128)
a = ap.parse_args()
pipe = specexport.load(a.bundle, threads=2)
solo_p = [pipe.encode(q["turns"][0], chat=True) for q in questions(a.questions, 1)]
burst_p = [pipe.encode(q["turns"][0], chat=True) for q in questions(a.questions, 4, a.limit)]
ref = {tuple(p): pipe.generate(p, max_new_tokens=a.new, draft="none").token_ids for p in solo_p + burst_p}
shipped = RecycleDrafter.calibration


def variant(name):
    RecycleDrafter.calibration = shipped if name == "calibrated" else property(lambda self: None)


def fresh():
    """Every run learns from nothing, as the bench's runs do (a table kept across runs of the same prompts
    would have seen their answers)."""
    pipe.successors = type(pipe.successors)(pipe.successors.succ.shape[0])


def solo():
    fresh()
    t, toks, same = time.perf_counter(), 0, 0
    for p in solo_p:
        g = pipe.generate(p, max_new_tokens=a.new, draft="recycle")
        toks, same = toks + len(g.token_ids), same + (g.token_ids == ref[tuple(p)])
    return toks / (time.perf_counter() - t), same, len(solo_p)


def burst(draft):
    fresh()
    pipe.start_engine(max_batch=a.level, max_queue=len(burst_p))
    t = time.perf_counter()
    gens = [c.wait() for c in [pipe.submit(p, max_new_tokens=a.new, draft=draft) for p in burst_p]]
    dt = time.perf_counter() - t
    return (sum(len(g.token_ids) for g in gens) / dt, sum(g.token_ids == ref[tuple(p)] for g, p in zip(gens, burst_p)),
            len(burst_p))


res = {}
for rnd in range(a.rounds):
    for v in (("raw", "calibrated") if rnd % 2 == 0 else ("calibrated", "raw")):
        variant(v)
        for what, f in (("solo recycle", solo), (f"engine {a.level} recycle", lambda: burst("recycle")),
                        (f"engine {a.level} plain", lambda: burst("none"))):
            tps, same, n = f()
            res.setdefault((what, v), []).append(tps)
            print(f"round {rnd} {v:10s} {what:20s} {tps:6.1f} tok/s, identical {same}/{n}", flush=True)
print("\n| run | raw tok/s | calibrated tok/s | calibrated / raw |\n|---|---|---|---|")
for what in dict.fromkeys(k for k, _ in res):
    r, c = (statistics.median(res[(what, v)]) for v in ("raw", "calibrated"))
    print(f"| {what} | {r:.1f} | {c:.1f} | {c / r:.2f}x |")
