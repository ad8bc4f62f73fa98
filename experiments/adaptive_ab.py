"""Issue 14's "the adaptive choice >= the better of plain-batched and fixed-k at every concurrency", measured
interleaved: bursts of Spec-Bench prompts through one batching engine per level, draft "none", recycle with
k="auto" and recycle with a fixed k alternated burst by burst (the order rotated each round).

    python experiments/adaptive_ab.py BUNDLE [--concurrency 2,4,8] [--limit 8] [--max-new-tokens 64]
        [--rounds 4] [--k 4] [--backend onnxruntime|onnxruntime-bf16|onnxruntime-bf16dot] [--plain-from B]
        [--max-t T] [--calls-priced] [--guard-from B] [--draft recycle|model|ngram] [--profiles K,K,...] [--fresh]
--draft: the drafter of the adaptive and fixed-k methods (recycle by default; model is the bundle's draft).
--plain-from B: a fourth method, the adaptive choice with every call of B or more rows held to T = 1 (what
the engine's batching alone does to the burst, without speculation where the rows are many).
--max-t T: a fourth method, the adaptive choice among the profiles of at most T tokens.
--calls-priced: a fourth method, the adaptive choice with the speculation guard (costs.Payoff) pricing a
step by its call alone and only the steps of T > 1 as speculation's, as before 2026-12-04 16:15 (the
drafting before the call not counted; it still drafts nothing while paused).
--profiles K,K,...: a fourth method, the adaptive choice among the bundle's verify profiles of those k only (as
if the bundle had been built with --k K,K,...: the choice of k, one row's deeper drafts and the choice of T).
--fresh: every burst on a new engine (Pipeline.start_engine), as the bench's load runs do: nothing the engine
learnt carries over from one burst to the next, and the prefix cache holds only the chat preamble.
--guard-from B: a fourth method, the adaptive choice with the speculation guard acting only on calls of B or
more rows (below B it never pauses, as at one row).

Per level: tokens per second of each whole burst, medians over rounds, each method's ratio to the better of
the other two, and whether every request's tokens are the same under all three (speculation never changes a
token). The successor table, the speculation guard, the chains' pooled acceptance and the draft's learnt chances
(drafters.model.Doubt) start empty for every burst; without --fresh the chains' rate offset (Engine.rate_fit), the
measured call costs and the last chosen T carry over from one burst to the next.
Each level's engine first prefills every prompt once, unmeasured (2 new tokens each), so that its prefix cache
holds the same prompts for every measured burst (since 2026-12-07: before, round 0's first burst, plain's, ran
without them and the later ones with them).
"""
import argparse
import json

import numpy as np

import specexport
from burst_state import burst, verify_ks  # experiments/
from specexport.bench.config import find_questions
from specexport.runtime.costs import Payoff
from specexport.runtime.engine import Engine

HOLD = {"from": None, "max_t": None, "calls": False, "guard_from": None}  # --plain-from: calls of this many
# rows or more take T = 1; --max-t; --calls-priced; --guard-from
_choose_T = Engine._choose_T
_record = Payoff.record
_allows = Payoff.allows


def allows(self, B):
    return True if HOLD["guard_from"] is not None and B < HOLD["guard_from"] else _allows(self, B)


Payoff.allows = allows


def record(self, B, T, tokens, rows, seconds, plain_s, host=0.0):
    return _record(self, B, T, tokens, rows, seconds, plain_s, 0.0 if HOLD["calls"] else host)


Payoff.record = record


def choose_T(self, B, dec, trees, paused=False):
    return 1 if HOLD["from"] is not None and B >= HOLD["from"] else _choose_T(self, B, dec, trees, paused)


Engine._choose_T = choose_T


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("bundle")
    p.add_argument("--concurrency", default="2,4,8")
    p.add_argument("--limit", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--backend", default="onnxruntime")
    p.add_argument("--plain-from", type=int, default=None)
    p.add_argument("--max-t", type=int, default=None)
    p.add_argument("--calls-priced", action="store_true")
    p.add_argument("--guard-from", type=int, default=None)
    p.add_argument("--draft", default="recycle", choices=["recycle", "model", "ngram"])
    p.add_argument("--profiles", default=None)
    p.add_argument("--fresh", action="store_true")
    a = p.parse_args()
    pipe = specexport.load(a.bundle, threads=2, backend=a.backend)
    profiles = verify_ks(pipe)  # --profiles: the verify profiles the engine sees are cut to those k
    batch_ts = pipe.target.batch_ts  # --max-t: the profiles the choice may take
    pipe.target.batch_ts = lambda B: [t for t in batch_ts(B) if HOLD["max_t"] is None or t <= HOLD["max_t"]] or [1]
    qs = [json.loads(line) for line in open(find_questions(None))][:a.limit * 10:10]
    prompts = [pipe.encode(q["turns"][0], chat=True) for q in qs]
    auto = {"draft": a.draft, "k": "auto"}
    methods = {"plain": {"draft": "none"}, "adaptive": auto, f"{a.draft}-k{a.k}": {"draft": a.draft, "k": a.k}}
    if a.plain_from:
        methods[f"adaptive-plain{a.plain_from}"] = auto
    if a.max_t:
        methods[f"adaptive-t{a.max_t}"] = auto
    if a.calls_priced:
        methods["adaptive-calls-priced"] = auto
    if a.guard_from:
        methods[f"adaptive-guard{a.guard_from}"] = auto
    if a.profiles:
        methods[f"adaptive-k{a.profiles.replace(',', '-')}"] = auto
    for level in (int(c) for c in a.concurrency.split(",")):
        pipe.start_engine(max_batch=level, max_queue=len(prompts))
        if not a.fresh:
            burst(pipe, prompts, 2, methods["plain"])  # the prefix cache's prompts, as every measured burst finds them
        tps, outs = {m: [] for m in methods}, {}
        for r in range(a.rounds):
            order = list(methods)[r % len(methods):] + list(methods)[:r % len(methods)]
            for m in order:
                HOLD["from"] = a.plain_from if m.startswith("adaptive-plain") else None
                HOLD["max_t"] = a.max_t if m.startswith("adaptive-t") else None
                HOLD["calls"] = m == "adaptive-calls-priced"
                HOLD["guard_from"] = a.guard_from if m.startswith("adaptive-guard") else None
                profiles({int(k) for k in a.profiles.split(",")} if m.startswith("adaptive-k") else None)
                if a.fresh:
                    pipe.start_engine(max_batch=level, max_queue=len(prompts))
                rate, toks = burst(pipe, prompts, a.max_new_tokens, methods[m])
                tps[m].append(rate)
                outs.setdefault(m, toks)
        med = {m: float(np.median(v)) for m, v in tps.items()}
        same = all(o == outs["plain"] for o in outs.values())
        line = ", ".join(f"{m} {med[m]:.1f} ({med[m] / max(v for k, v in med.items() if k != m):.2f}x the better "
                         f"other; rounds {[round(x, 1) for x in tps[m]]})" for m in methods)
        print(f"{a.bundle} {a.backend} c={level}: {line}; same tokens: {same}", flush=True)


if __name__ == "__main__":
    main()
