"""Which rule for choosing T serves the batching engine best, judged on one trace instead of noisy reruns.

Bursts of Spec-Bench prompts through the batching engine at one level, recycle drafting with a fixed k = 8 so
that every step verifies the first 9 nodes of every row's tree: with greedy acceptance the tokens any smaller
profile T' would have emitted are then known exactly, row by row (the accepted path's nodes below index T';
node indices grow along a path). Calls of fewer than 9 tokens (every tree smaller: roots never fed before,
the ends of answers) are not in the trace, nor mixed calls (a prefill chunk riding along). Every step's
batch size and every row's cumulative node scores and counterfactual tokens are recorded, the (B, T) calls
are timed in the same process (runs of plain decoding, fixed k = 2, 4, 8 and the adaptive choice,
k = "auto", on the same prompts, alternated round by round), and every rule is replayed on the trace:
tokens it would emit / seconds its calls would take. Beside it, those runs' own tokens/s (there the successor
table learns from what each method verifies, which the replay cannot show), and how many steps drafted
nothing.

    python experiments/choice_replay.py BUNDLE [--level 1] [--limit 8] [--new 128] [--rounds 2]
"""
import argparse
import collections
import json
import time

import numpy as np

import specexport
from specexport.bench.config import find_questions
from specexport.runtime import engine as eng

TS = (1, 3, 5, 9)
REC = {"on": False, "method": "", "step": None}  # the trace is recorded during the k = 8 runs only
TRACE: list = []  # per (B, 9) call: (B, [(cum scores padded to 9, tokens emitted at T' = 1..9) per row])
CALLS = collections.defaultdict(list)  # (B, T) -> seconds of the engine's step_batch calls
SPENT = collections.defaultdict(list)  # method -> per run (wall s, seconds in step_batch calls, their count)
ROOTS = collections.Counter()  # method -> rows accepted, and rows whose tree was the root alone
_accept_tree = eng.accept_tree


def accept_tree(logits, tree, T, N, pick):
    emitted, path = _accept_tree(logits, tree, T, N, pick)
    ROOTS[REC["method"]] += 1
    ROOTS[REC["method"] + " drafted nothing"] += len(tree) == 1
    if REC["step"] is not None:  # a row of a (B, 9) call; T here is min(9, its tree's size)
        cum = np.concatenate([[1.0], 1.0 + np.cumsum(tree.score[1:])])
        cum = np.concatenate([cum, np.full(9 - len(cum), cum[-1])])[:9]
        REC["step"][1].append((cum, [1 + sum(1 for i in path[1:] if i < t) for t in range(1, 10)]))
    return emitted, path


eng.accept_tree = accept_tree


def run(pipe, prompts, n, opts):
    """One burst of every prompt (one engine at the level set by main); -> tokens/s."""
    pipe.successors = type(pipe.successors)(pipe.successors.succ.shape[0])
    t_ = pipe.target
    step, mixed = t_.step_batch, getattr(t_, "step_mixed", None)

    def timed(pool, ids, *a, **kw):
        B, T = ids.shape
        REC["step"] = (B, []) if REC["on"] and T == 9 else None
        if REC["step"] is not None:
            TRACE.append(REC["step"])
        out = step(pool, ids, *a, **kw)
        CALLS[(B, T)].append(out.run_s)
        spent[0] += out.run_s
        spent[1] += 1
        return out

    def timed_mixed(*a, **kw):
        REC["step"] = None
        return mixed(*a, **kw)

    spent = [0.0, 0]
    t_.step_batch = timed
    if mixed is not None:
        t_.step_mixed = timed_mixed
    t = time.perf_counter()
    cs = [pipe.submit(p, max_new_tokens=n, **opts) for p in prompts]
    toks = [c.wait(600).token_ids for c in cs]
    wall = time.perf_counter() - t
    rate = sum(len(x) for x in toks) / wall
    SPENT[REC["method"]].append((wall, *spent))
    t_.step_batch = step
    if mixed is not None:
        t_.step_mixed = mixed
    REC["step"] = None
    return rate


def replay(cost, rule):
    """Tokens per second of call time of the rule's choices on the trace. rule(B, rows, ts, seen) -> T, ts the
    T with a measured (B, T) call; seen: the rule's own counterfactual observations so far, (T, promised extra,
    realized extra) per row for every T' <= its choice."""
    toks = secs = 0.0
    seen: list = []
    for B, rows in TRACE:
        ts = [T for T in TS if (B, T) in cost]
        T = rule(B, rows, ts, seen)
        toks += sum(got[T - 1] for _, got in rows)
        secs += cost[(B, T)]
        seen += [(t, cum[t - 1] - 1, got[t - 1] - 1) for cum, got in rows for t in ts if t <= T]
    return toks / secs


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("bundle")
    p.add_argument("--level", type=int, default=1)
    p.add_argument("--limit", type=int, default=8)
    p.add_argument("--new", type=int, default=128)
    p.add_argument("--rounds", type=int, default=2)
    a = p.parse_args()
    pipe = specexport.load(a.bundle, threads=2)
    qs = [json.loads(line) for line in open(find_questions(None))][:a.limit * 10:10]
    prompts = [pipe.encode(q["turns"][0], chat=True) for q in qs]
    pipe.start_engine(max_batch=a.level, max_queue=len(prompts))
    methods = {"plain": {"draft": "none"}, "k2": {"draft": "recycle", "k": 2}, "k4": {"draft": "recycle", "k": 4},
               "k8": {"draft": "recycle", "k": 8}, "auto": {"draft": "recycle", "k": "auto"}}
    real = {m: [] for m in methods}
    for r in range(a.rounds):
        for m in list(methods)[r % len(methods):] + list(methods)[:r % len(methods)]:
            if m == "k8":
                del TRACE[:]  # one trace: the last round's
            REC["on"], REC["method"] = m == "k8", m
            real[m].append(run(pipe, prompts, a.new, methods[m]))
            REC["on"] = False
    cost = {bt: float(np.median(v)) for bt, v in CALLS.items() if bt[1] in TS}
    steps = collections.Counter(B for B, _ in TRACE)
    print(f"level {a.level}; trace: {len(TRACE)} (B, 9) calls by B {dict(sorted(steps.items()))}, "
          f"{sum(len(rows) for _, rows in TRACE)} rows")
    for B in sorted(steps):
        print(f"  (B = {B}, T) calls, ms (medians):", {T: round(1e3 * cost[(B, T)], 2) for T in TS if (B, T) in cost})
    rows = [r for _, rs in TRACE for r in rs]
    print("tokens per row and step, had it verified T = 1, 3, 5, 9:",
          [round(float(np.mean([g[t - 1] for _, g in rows])), 3) for t in TS],
          "the scores' promise:", [round(float(np.mean([c[t - 1] for c, _ in rows])), 3) for t in TS])

    def fixed(T):
        return lambda B, rows, ts, seen: T if T in ts else ts[-1]

    def raw(B, rows, ts, seen):  # the engine's rule: sum over rows of the raw scores' promise / (B, T) cost
        return max(ts, key=lambda T: sum(c[T - 1] for c, _ in rows) / cost[(B, T)])

    def ratio(B, rows, ts, seen, prior=8.0):  # each T's promise scaled by its realized / promised so far
        def rho(T):
            return (sum(g for t, _, g in seen if t == T) + prior) / (sum(p for t, p, _ in seen if t == T) + prior)
        return max(ts, key=lambda T: sum(1 + rho(T) * (c[T - 1] - 1) for c, _ in rows) / cost[(B, T)])

    def capped(B, rows, ts, seen):  # the engine's rule among the profiles of at most 5 tokens
        return raw(B, rows, [T for T in ts if T <= 5], seen)

    rules = {"always T = 1 (plain)": fixed(1), "always T = 3": fixed(3), "always T = 5": fixed(5),
             "always T = 9": fixed(9), "raw scores (the engine's)": raw, "raw scores, T <= 5": capped,
             "scores scaled per T": ratio}
    base = replay(cost, fixed(1))
    for name, rule in rules.items():
        tps = replay(cost, rule)
        print(f"replay {name:28s} {tps:7.1f} tokens/s of call time  {tps / base:.3f}x plain")
    print("rows that drafted nothing (a token never fed before with no earlier occurrence, or the last step of "
          "an answer), all rounds:", {m: f"{ROOTS[m + ' drafted nothing']} of {ROOTS[m]}" for m in methods
                                      if m != "plain"})
    for m, runs in SPENT.items():
        print(f"  {m}: per run wall s / seconds in decode and verify calls / their count:",
              "; ".join(f"{w:.2f} / {c:.2f} / {n}" for w, c, n in runs))
    med = {m: float(np.median(v)) for m, v in real.items()}
    print(f"real runs, tokens/s (medians of {a.rounds} rounds):", {m: round(v, 1) for m, v in med.items()},
          "vs plain:", {m: round(v / med["plain"], 3) for m, v in med.items()})


if __name__ == "__main__":
    main()
