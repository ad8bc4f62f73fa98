"""Which rule for choosing T serves one request best, judged on one trace instead of noisy reruns.

One request at a time through the batching engine (level 1), recycle drafting with a fixed k = 8 so that every
step verifies the first 9 nodes of its tree: with greedy acceptance the tokens any smaller profile T' would
have emitted are then known exactly (the accepted path's nodes below index T'; node indices grow along a
path). Steps that verified fewer than 9 tokens (a smaller tree: its root never fed before, the end of an
answer) are not in the trace. Every step's cumulative node scores and these counterfactual tokens are
recorded, the (1, T) calls of each profile are timed in the same process, and every rule is replayed on the
trace: tokens it would emit / seconds its calls would take. Beside it, real runs of plain decoding, fixed
k = 2, 4, 8 and the adaptive choice (k = "auto") on the same prompts, alternated round by round (there the
successor table learns from what each method verifies, which the replay cannot show).

    python experiments/choice_replay.py BUNDLE [--limit 8] [--new 128] [--rounds 2]
"""
import argparse
import collections
import json
import time

import numpy as np

import specexport
from specexport.bench.config import find_questions
from specexport.runtime import engine as eng

REC = {"on": False}  # recording: during the k = 8 runs only
TRACE: list = []
SHAPE: dict = {}  # k -> per run (tokens, wall s, seconds of its (1, T <= 9) calls, calls by T)  # per verify step: (cum scores padded to 9, tokens emitted at T' = 1..9)
CALLS = collections.defaultdict(list)  # T -> seconds of (1, T) calls
_accept_tree = eng.accept_tree


def accept_tree(logits, tree, T, N, pick):
    emitted, path = _accept_tree(logits, tree, T, N, pick)
    if T == 9 and REC["on"]:
        cum = np.concatenate([[1.0], 1.0 + np.cumsum(tree.score[1:])])
        cum = np.concatenate([cum, np.full(9 - len(cum), cum[-1])])[:9]
        got = [1 + sum(1 for i in path[1:] if i < t) for t in range(1, 10)]
        TRACE.append((cum, got))
    return emitted, path


eng.accept_tree = accept_tree


def run(pipe, prompts, n, opts):
    pipe.successors = type(pipe.successors)(pipe.successors.succ.shape[0])
    step = pipe.target.step_batch

    def timed(pool, ids, *a, **kw):
        out = step(pool, ids, *a, **kw)
        if ids.shape[0] == 1:
            CALLS[ids.shape[1]].append(out.run_s)
        return out

    pipe.target.step_batch = timed
    before = {T: len(v) for T, v in CALLS.items()}
    t = time.perf_counter()
    toks = [pipe.submit(p, max_new_tokens=n, **opts).wait(600).token_ids for p in prompts]
    wall = time.perf_counter() - t
    pipe.target.step_batch = step
    new = {T: v[before.get(T, 0):] for T, v in CALLS.items()}
    calls = {T: len(v) for T, v in new.items() if T <= 9 and v}
    secs = sum(sum(v) for T, v in new.items() if T <= 9)
    SHAPE.setdefault(opts.get("k", 0), []).append((sum(map(len, toks)), wall, secs, calls))
    return sum(len(x) for x in toks) / wall, toks


def replay(cost, rule):
    """Tokens per second of the rule's choices on the trace. rule(cum, seen) -> T; seen: the rule's own
    counterfactual observations so far, (T, predicted extra, realized extra) for every T' <= its choice."""
    toks = secs = 0.0
    seen = []
    for cum, got in TRACE:
        T = rule(cum, seen)
        toks += got[T - 1]
        secs += cost[T]
        seen += [(t, cum[t - 1] - 1, got[t - 1] - 1) for t in cost if t <= T]
    return toks / secs


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("bundle")
    p.add_argument("--limit", type=int, default=8)
    p.add_argument("--new", type=int, default=128)
    p.add_argument("--rounds", type=int, default=2)
    a = p.parse_args()
    pipe = specexport.load(a.bundle, threads=2)
    qs = [json.loads(line) for line in open(find_questions(None))][:a.limit * 10:10]
    prompts = [pipe.encode(q["turns"][0], chat=True) for q in qs]
    pipe.start_engine(max_batch=1, max_queue=len(prompts))
    methods = {"plain": {"draft": "none"}, "k2": {"draft": "recycle", "k": 2}, "k4": {"draft": "recycle", "k": 4},
               "k8": {"draft": "recycle", "k": 8}, "auto": {"draft": "recycle", "k": "auto"}}
    real = {m: [] for m in methods}
    for r in range(a.rounds):
        for m in list(methods)[r % len(methods):] + list(methods)[:r % len(methods)]:
            if m == "k8":
                del TRACE[:]  # one trace: the last round's
            REC["on"] = m == "k8"
            real[m].append(run(pipe, prompts, a.new, methods[m])[0])
            REC["on"] = False
    cost = {T: float(np.median(CALLS[T])) for T in (1, 3, 5, 9)}
    print("calls (1, T) ms, medians:", {T: round(1e3 * c, 2) for T, c in cost.items()},
          "counts:", {T: len(CALLS[T]) for T in (1, 3, 5, 9)})
    print("trace steps", len(TRACE), "tokens per step at T = 1, 3, 5, 9:",
          [round(float(np.mean([g[t - 1] for _, g in TRACE])), 3) for t in (1, 3, 5, 9)],
          "scores' promise:", [round(float(np.mean([c[t - 1] for c, _ in TRACE])), 3) for t in (1, 3, 5, 9)])

    def fixed(T):
        return lambda cum, seen: T

    def raw(cum, seen):
        return max(cost, key=lambda T: cum[T - 1] / cost[T])

    def ratio(cum, seen, prior=8.0):  # per-T ratio of realized to promised extra tokens, counterfactual
        def rho(T):
            pr = sum(p for t, p, g in seen if t == T)
            re = sum(g for t, p, g in seen if t == T)
            return (re + prior) / (pr + prior)
        return max(cost, key=lambda T: (1 + rho(T) * (cum[T - 1] - 1)) / cost[T])

    def top_ratio(cum, seen, prior=8.0):  # only the step to the largest profile priced by what it delivered
        Tm, Tn = sorted(cost)[-1], sorted(cost)[-2]
        obs = [(t, p, g) for t, p, g in seen if t in (Tn, Tm)]
        # pairs (Tn, Tm) observed in the same step: the marginal promise and delivery of nodes Tn..Tm-1
        mp = mg = 0.0
        for x, y in zip(obs, obs[1:]):
            if x[0] == Tn and y[0] == Tm:
                mp += y[1] - x[1]
                mg += y[2] - x[2]
        rho = (mg + prior * 0.5) / (mp + prior * 0.5)
        def expect(T):
            e = cum[T - 1]
            return e if T < Tm else cum[Tn - 1] + rho * (cum[Tm - 1] - cum[Tn - 1])
        return max(cost, key=lambda T: expect(T) / cost[T])

    def capped(cum, seen):  # the raw scores' choice among the profiles of at most 5 tokens
        return max((T for T in cost if T <= 5), key=lambda T: cum[T - 1] / cost[T])

    rules = {"T=1": fixed(1), "T=3": fixed(3), "T=5": fixed(5), "T=9": fixed(9), "raw scores": raw,
             "raw, T <= 5": capped,
             "per-T ratio": ratio, "top step ratio": top_ratio}
    base = replay(cost, fixed(1))
    for name, rule in rules.items():
        tps = replay(cost, rule)
        print(f"replay {name:16s} {tps:7.1f} tokens/s of call time  {tps / base:.3f}x T=1")
    for k, runs in SHAPE.items():
        for tok, wall, secs, calls in runs:
            print(f"  k={k}: {tok} tokens, wall {wall:.2f} s, decode and verify calls {secs:.2f} s, prefill and "
                  f"host {wall - secs:.2f} s, calls by T {calls}")
    med = {m: float(np.median(v)) for m, v in real.items()}
    print("real runs, tokens/s (medians of", a.rounds, "rounds):", {m: round(v, 1) for m, v in med.items()},
          "vs plain:", {m: round(v / med["plain"], 3) for m, v in med.items()})


if __name__ == "__main__":
    main()
