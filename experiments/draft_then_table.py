"""Would one draft call plus the successor table's continuation beat two draft calls at two requests? Teacher-forced
on the target's greedy output (the burst's first 16 Spec-Bench prompts, 128 tokens each). At every committed
position j: whether the int4 self-draft's argmax is the target's token there (as in lookup_first.py), and how far
the recycle drafter's successor table (the bundle's seeded one, then the target's top-w after every committed
token of this generation before j, as the engine's verify calls feed it) continues a chain from j or from j + 1,
top-1 at each depth. Policies are replayed on pairs of requests in lockstep as two rows of the batching engine
and priced from calls measured here first (target (B, T), the draft's (B, 1), B = 1 and 2, interleaved, medians):
a step's draft calls are the most any row asks for, its T the most any row needs, rounded up to a built profile.
  python experiments/draft_then_table.py BUNDLE [--requests 16] [--new 128]"""
import argparse

import numpy as np

import specexport
from teacher_forced import call_costs, forced, greedy  # experiments/

ap = argparse.ArgumentParser()
ap.add_argument("bundle")
ap.add_argument("--requests", type=int, default=16)
ap.add_argument("--new", type=int, default=128)
a = ap.parse_args()
pipe = specexport.load(a.bundle, threads=2)
t, d = pipe.target, pipe.draft
built, cost = call_costs(t, d)

DEPTH = 8
rows = []
for q, ids, n0, out in greedy(pipe, a.requests, a.new):
    agree = forced(d, ids, n0).argmax(-1) == np.array(out)
    top = np.argsort(-forced(t, ids, n0), axis=1)[:, :pipe.successors.width]
    model = [0] * len(out)  # accepted length of an unbounded model chain from j
    for j in range(len(out) - 1, -1, -1):
        model[j] = (1 + (model[j + 1] if j + 1 < len(out) else 0)) if agree[j] else 0
    table = pipe.fresh_table()
    chain = []  # chain[j][i]: the table's top-1 continuation from j + i, as it stands at j, hits out[j + i]
    for j in range(len(out)):
        hits = []
        for i in range(DEPTH):
            if j + i >= len(out):
                break
            c = table.candidates(tuple(ids[:n0 + j + i][-3:]), 1)
            # a hit, and the order of the context it came from (0: no candidate)
            hits.append((bool(c) and c[0][1] == out[j + i], c[0][0] // table.width + 1 if c else 0))
        chain.append(hits)
        table.observe([tuple(ids[:n0 + j][-3:])], top[j:j + 1], top[j:j + 1])  # this step's root, verified

    def run(hits, i, m):  # consecutive table hits from depth i, at most m
        n = 0
        while n < m and i + n < len(hits) and hits[i + n][0]:
            n += 1
        return n
    rows.append((model, chain, run))
    print(f"question {q['question_id']} ({q['category']}): model agrees at {agree.mean():.2f}; the table's top-1 "
          f"at {np.mean([h[0][0] for h in chain]):.2f}, after a right draft token at "
          f"{np.mean([h[1][0] for h, ok in zip(chain, agree) if ok and len(h) > 1]):.2f}")
order = {}  # the table's continuation after a right draft token: order of its context -> [hits, tries]
for model, chain, _ in rows:
    for j, h in enumerate(chain):
        if model[j] and len(h) > 1:
            o = order.setdefault(h[1][1], [0, 0])
            o[0] += h[1][0]
            o[1] += 1
print("after a right draft token, the table's top-1 by the order of its context:",
      ", ".join(f"{o}: {h / n:.2f} of {n}" for o, (h, n) in sorted(order.items())))


def up(T):
    return next(b for b in built if b >= T)


def accepted(model, chain, run, j, km, kt):
    """Tokens accepted of a chain of km draft-model tokens then kt table tokens from j."""
    acc = min(km, model[j])
    return acc + run(chain[j], acc, kt) if acc == km else acc


def replay(km, kt, sure=0):
    """tokens per second over the pairs in lockstep, every row drafting km model + kt table tokens; with `sure`,
    a row drafts km model + kt table tokens only where the table's continuation after the first model token comes
    from a context of >= sure tokens, else km + 1 model tokens"""
    tok = total = 0.0
    for i in range(0, len(rows) - 1, 2):
        js = [0, 0]
        while any(j < len(rows[i + r][0]) for r, j in enumerate(js)):
            live = [r for r in (0, 1) if js[r] < len(rows[i + r][0])]
            back = {r: sure > 0 and rows[i + r][1][js[r]][min(km, len(rows[i + r][1][js[r]]) - 1)][1] < sure
                    for r in live}  # the table is unsure after the first model token: one more model token instead
            ks = {r: min(km + back[r], len(rows[i + r][0]) - js[r] - 1) for r in live}
            ks = {r: (k, 0 if back[r] else min(kt, len(rows[i + r][0]) - js[r] - 1 - k)) for r, k in ks.items()}
            kd = max(k for k, _ in ks.values())
            total += cost["t", len(live), up(1 + max(sum(k) for k in ks.values()))]
            total += kd * cost["d", len(live), 1] if kd else 0.0
            for r in live:
                acc = accepted(*rows[i + r], js[r], *ks[r])
                js[r] += acc + 1
                tok += acc + 1
    return tok / total * 1e3


base = replay(0, 0)
print(f"plain: {base:.1f} tokens/s")
for km, kt in ((2, 0), (4, 0), (0, 2), (0, 4), (1, 1), (1, 2), (1, 3), (2, 1), (2, 2), (3, 1)):
    print(f"model {km} + table {kt} (T = {up(1 + km + kt)}): {replay(km, kt) / base:.3f}x plain")
for sure in (1, 2, 3):
    print(f"model 1 + table 1 where the table's context has >= {sure} tokens, else model 2: "
          f"{replay(1, 1, sure) / base:.3f}x plain")
