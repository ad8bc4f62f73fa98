"""Does a draft model's own confidence tell when to stop drafting? Teacher-forced on the target's greedy output
(one Spec-Bench question per category, 128 tokens): at each position, the draft's probability of its argmax
and whether that argmax is the target's token. A chain drafted from committed position j is accepted while its
proposals agree, so any drafting policy's acceptance replays exactly; its time is priced from call costs
(a plain step T1 ms, verify calls of T = 3 / 5 / 9 at the given multiples of it, a draft call DC ms).
  python experiments/draft_confidence.py BUNDLE [T1=20.7] [DC=4.6] [V3,V5,V9=1.0,1.05,1.08]"""
import json, sys

import numpy as np

import specexport

bundle = sys.argv[1]
T1 = float(sys.argv[2]) if len(sys.argv) > 2 else 20.7
DC = float(sys.argv[3]) if len(sys.argv) > 3 else 4.6
mult = [float(x) for x in (sys.argv[4] if len(sys.argv) > 4 else "1.0,1.05,1.08").split(",")]
pipe = specexport.load(bundle, threads=2)
seen, picked = set(), []
for q in map(json.loads, open("../shared/specbench/question.jsonl")):
    if q["category"] not in seen:
        seen.add(q["category"])
        picked.append(q)
P, A = [], []
for q in picked:
    g = pipe.generate([{"role": "user", "content": q["turns"][0]}], chat=True, max_new_tokens=128, draft="none")
    ids, n0 = list(g.prompt_ids) + list(g.token_ids), len(g.prompt_ids)
    cache = pipe.draft.new_cache()
    cache.reserve(len(ids) + 1)
    lg = pipe.draft.step(cache, ids, 0, rows=list(range(n0 - 1, len(ids) - 1))).logits.astype(np.float64)
    p = np.exp(lg - lg.max(1, keepdims=True))
    P.append((p / p.sum(1, keepdims=True)).max(1))
    A.append(lg.argmax(1) == np.array(g.token_ids))
pp, aa = np.concatenate(P), np.concatenate(A)
print(f"{len(pp)} positions, the draft's argmax is the target's token at {aa.mean():.2f} of them")
for lo, hi in ((0, .3), (.3, .5), (.5, .7), (.7, .9), (.9, 1.01)):
    m = (pp >= lo) & (pp < hi)
    print(f"  draft probability in [{lo}, {min(hi, 1)}): {m.sum()} positions, agree {aa[m].mean():.2f}")
vcost = {1: T1, 3: T1 * mult[0], 5: T1 * mult[1], 9: T1 * mult[2]}


def replay(policy) -> float:
    """tokens per second of a policy (p, j, left) -> tokens to draft from committed position j"""
    tok = ms = 0.0
    for p, a in zip(P, A):
        j = 0
        while j < len(a):
            k = policy(p, j, len(a) - j)
            acc = 0
            while acc < k and j + acc < len(a) and a[j + acc]:
                acc += 1
            j, tok = j + acc + 1, tok + acc + 1
            ms += vcost[next(t for t in (1, 3, 5, 9) if t >= k + 1)] + k * DC
    return tok / ms * 1e3


def until_unsure(th, kmax):
    def policy(p, j, left):
        k = 0
        while k < min(kmax, left):
            k += 1
            if p[j + k - 1] < th:
                break
        return k
    return policy


print(f"plain {replay(lambda p, j, left: 0):.1f} tokens/s")
for k in (1, 2, 4, 8):
    print(f"fixed k = {k}: {replay(lambda p, j, left, k=k: min(k, left)):.1f}")
for th in (0.3, 0.5, 0.7, 0.9):
    print(f"stop below {th}: " + ", ".join(f"k <= {km} {replay(until_unsure(th, km)):.1f}" for km in (2, 3, 4, 8)))
