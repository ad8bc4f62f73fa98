"""Would prompt lookup, tried before the draft model, make two requests' steps cheaper? Teacher-forced on the
target's greedy output (the burst's first 16 Spec-Bench prompts, 128 tokens each): at every committed position j,
how many tokens the int4 self-draft's chain would get accepted (its argmax agrees with the target while the
chain lasts) and how many prompt lookup's chain would (runtime/drafters/ngram.py's proposal against the truth).
Policies are replayed on pairs of requests in lockstep, as two rows of the batching engine, and priced from
calls measured here first (target (B, T) for T = 1, 3, 5, 9 and the draft's (B, 1), B = 1 and 2, interleaved,
medians): a step's draft calls are the most any model-drafting row asks for (none when every row looks up),
its verify T the most any row needs, rounded up to a built profile.
  python experiments/lookup_first.py BUNDLE [--requests 16] [--new 128]"""
import argparse

import numpy as np

import specexport
from specexport.runtime.drafters.ngram import NgramDrafter
from teacher_forced import call_costs, forced, greedy  # experiments/

ap = argparse.ArgumentParser()
ap.add_argument("bundle")
ap.add_argument("--requests", type=int, default=16)
ap.add_argument("--new", type=int, default=128)
a = ap.parse_args()
pipe = specexport.load(a.bundle, threads=2)
t, d = pipe.target, pipe.draft
built, cost = call_costs(t, d)

# teacher-forced acceptance per position: model chain and lookup chain
rows = []
look = NgramDrafter(3)
for q, ids, n0, out in greedy(pipe, a.requests, a.new):
    agree = forced(d, ids, n0).argmax(-1) == np.array(out)  # the draft's argmax after each of ids[n0 - 1:]
    model = [0] * len(out)  # accepted length of an unbounded model chain from j
    for j in range(len(out) - 1, -1, -1):
        model[j] = (1 + (model[j + 1] if j + 1 < len(out) else 0)) if agree[j] else 0
    lk = []  # (proposal length, accepted) of an 8-token lookup from j
    for j in range(len(out)):
        props = look.propose(ids[:n0 + j], 8).tokens
        acc = 0
        while acc < len(props) and j + acc < len(out) and props[acc] == out[j + acc]:
            acc += 1
        lk.append((len(props), acc))
    rows.append((model, lk))
    print(f"question {q['question_id']} ({q['category']}): model agrees at {agree.mean():.2f}, lookup offers a "
          f"chain at {np.mean([n > 0 for n, _ in lk]):.2f} of positions, accepted >= 2 at "
          f"{np.mean([x >= 2 for _, x in lk]):.2f}")


def up(T):
    return next(b for b in built if b >= T)


def replay(policy):
    """tokens per second over the pairs in lockstep; policy(model, lk, j, left) -> ("model"|"lookup", k)"""
    tok = total = 0.0
    for i in range(0, len(rows) - 1, 2):
        js = [0, 0]
        while any(j < len(rows[i + r][0]) for r, j in enumerate(js)):
            live = [r for r in (0, 1) if js[r] < len(rows[i + r][0])]
            B = len(live)
            picks = {r: policy(*rows[i + r], js[r], len(rows[i + r][0]) - js[r]) for r in live}
            kd = max([k for how, k in picks.values() if how == "model"], default=0)
            nd = sum(1 for how, k in picks.values() if how == "model" and k > 0)
            T = up(1 + max(k for _, k in picks.values()))
            total += cost["t", B, T] + kd * (cost["d", nd, 1] if nd else 0.0)
            for r, (how, k) in picks.items():
                model, lk = rows[i + r]
                acc = min(k, model[js[r]]) if how == "model" else min(k, lk[js[r]][1])
                js[r] += acc + 1
                tok += acc + 1
    return tok / total * 1e3


base = replay(lambda m, lk, j, left: ("model", 0))
print(f"plain: {base:.1f} tokens/s")
for k in (2, 4):
    print(f"model k = {k}: {replay(lambda m, lk, j, left, k=k: ('model', min(k, left - 1))) / base:.3f}x plain")
for need in (1, 2, 3):
    for kl in (4, 8):
        for km in (2, 4):
            def hybrid(m, lk, j, left, need=need, kl=kl, km=km):
                n, _ = lk[j]
                return ("lookup", min(kl, n, left - 1)) if n >= need else ("model", min(km, left - 1))
            print(f"lookup when it offers >= {need} (up to {kl}), else model k = {km}: "
                  f"{replay(hybrid) / base:.3f}x plain")
