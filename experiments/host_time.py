"""How much of a burst's decode time is host work (Python: drafting, the call's inputs, acceptance, commit,
streaming) and how much is target calls, per method, interleaved: bursts of Spec-Bench prompts through one
batching engine at one level, draft "none", recycle with k="auto" and recycle with a fixed k, round by round.

    python experiments/host_time.py BUNDLE [--level 4] [--limit 8] [--max-new-tokens 128] [--rounds 3] [--k 4]
        [--draft recycle|model]

--draft model: the adaptive and fixed-k methods draft with the bundle's draft model; its calls inside
Engine._decode count as calls (column "calls in decode s"), not as host work.

Per burst: wall; time inside Engine._decode; the target calls made inside it (step_batch, step_mixed: a
prefill chunk riding in a decode call counts as a call, not as host work); host = the difference, per
decode step. Calls outside _decode (prefill calls of their own) are in "other". Also: the decode calls by
how many rows B they covered (a burst's tail runs fewer rows), and for the adaptive choice, per chosen (B, T),
the extra tokens per row its drafts' scores promised (what the choice maximised) against what the rows
emitted. The successor table and the speculation guard start empty for every burst, as in the bench's load
runs.
"""
import argparse
import collections
import statistics
import time

import specexport
from burst_state import afresh  # experiments/
from specexport.bench.config import find_questions, questions
from specexport.runtime.costs import Payoff, StepCosts
from specexport.runtime.engine import Engine

INSIDE = {"on": False, "decode_s": 0.0, "calls_s": 0.0, "steps": 0}
BY_B = collections.defaultdict(collections.Counter)  # method -> B -> decode calls
PROMISE = collections.defaultdict(lambda: [0, 0.0, 0])  # (B, T) -> rows, promised extra tokens, emitted extra
CHOICE: dict = {}
METHOD = [None]
_best, _record = StepCosts.best, Payoff.record


def best(self, B, ts, expected):
    T = _best(self, B, ts, expected)
    if INSIDE["on"]:
        CHOICE.update(B=B, T=T, promised=expected(T))
    return T


def record(self, B, T, tokens, rows, seconds, plain_s, host=0.0):
    if CHOICE.get("B") == B and METHOD[0] == "adaptive":
        c = PROMISE[(B, CHOICE["T"])]
        c[0], c[1], c[2] = c[0] + rows, c[1] + CHOICE["promised"] - rows, c[2] + tokens - rows
    CHOICE.clear()
    return _record(self, B, T, tokens, rows, seconds, plain_s, host)


StepCosts.best, Payoff.record = best, record
_decode = Engine._decode


def decode(self, *args, **kw):
    t = time.perf_counter()
    INSIDE["on"] = True
    try:
        return _decode(self, *args, **kw)
    finally:
        INSIDE["on"] = False
        INSIDE["decode_s"] += time.perf_counter() - t
        INSIDE["steps"] += 1


Engine._decode = decode


def timed(target, name, count=True):
    real = getattr(target, name)

    def call(*args, **kw):
        out = real(*args, **kw)
        if INSIDE["on"]:
            INSIDE["calls_s"] += (out[0] if name == "step_mixed" else out).run_s
            if count:  # the target's decode calls by B (not the draft's)
                BY_B[METHOD[0]][args[1].shape[0]] += 1
        return out
    setattr(target, name, call)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("bundle")
    p.add_argument("--level", type=int, default=4)
    p.add_argument("--limit", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--draft", choices=("recycle", "model"), default="recycle")
    a = p.parse_args()
    pipe = specexport.load(a.bundle, threads=2)
    for name in ("step_batch", "step_mixed"):
        timed(pipe.target, name)
    if a.draft == "model":
        timed(pipe.draft, "step_batch", count=False)
    prompts = [pipe.encode(q["turns"][0], chat=True) for q in questions(find_questions(None), 4, a.limit)]
    pipe.start_engine(max_batch=a.level, max_queue=len(prompts))
    for x in prompts:  # the prefix cache holds every prompt for every measured burst, as in adaptive_ab.py
        pipe.submit(x, max_new_tokens=2).wait(600)
    methods = {"plain": {"draft": "none"}, "adaptive": {"draft": a.draft, "k": "auto"},
               f"k{a.k}": {"draft": a.draft, "k": a.k}}
    rows = {m: [] for m in methods}
    for rnd in range(a.rounds):
        names = list(methods)[rnd % len(methods):] + list(methods)[:rnd % len(methods)]
        for m in names:
            afresh(pipe)
            INSIDE.update(decode_s=0.0, calls_s=0.0, steps=0)
            METHOD[0] = m
            t0 = time.perf_counter()
            n = sum(len(c.wait(600).token_ids) for c in
                    [pipe.submit(x, max_new_tokens=a.max_new_tokens, **methods[m]) for x in prompts])
            wall = time.perf_counter() - t0
            host = INSIDE["decode_s"] - INSIDE["calls_s"]
            r = dict(wall=wall, tps=n / wall, decode=INSIDE["decode_s"], calls=INSIDE["calls_s"], host=host,
                     steps=INSIDE["steps"], host_ms=host / INSIDE["steps"] * 1e3, other=wall - INSIDE["decode_s"])
            rows[m].append(r)
            print(f"round {rnd + 1} {m:9s} " + " ".join(f"{k} {v:.2f}" for k, v in r.items()), flush=True)
    print(f"\nlevel {a.level}, {len(prompts)} prompts, {a.max_new_tokens} new tokens; medians of {a.rounds} rounds")
    print("| method | tokens/s | vs plain | decode s | calls in decode s | host s | steps | host ms / step | other s |")
    print("|---|---|---|---|---|---|---|---|---|")
    med = {m: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for m, rs in rows.items()}
    for m, r in med.items():
        print(f"| {m} | {r['tps']:.1f} | {r['tps'] / med['plain']['tps']:.2f}x | {r['decode']:.2f} | {r['calls']:.2f} | "
              f"{r['host']:.2f} | {r['steps']:.0f} | {r['host_ms']:.2f} | {r['other']:.2f} |")

    print("\ndecode calls by rows B, all rounds: " + "; ".join(
        f"{m}: " + ", ".join(f"B={b} {n}" for b, n in sorted(c.items())) for m, c in BY_B.items()))
    print("adaptive, per chosen (B, T): rows, promised extra tokens per row, emitted extra per row, emitted / promised")
    for (B, T), (rows, p, e) in sorted(PROMISE.items()):
        print(f"  ({B}, {T}): {rows} rows, {p / rows:.3f}, {e / rows:.3f}, {e / p if p > 0 else float('nan'):.2f}")


if __name__ == "__main__":
    main()
