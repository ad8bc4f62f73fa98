"""Does a draft model's own confidence tell when to stop drafting? Teacher-forced on the target's greedy output
(one Spec-Bench question per category, 128 tokens): at each position, the draft's probability of its argmax, its
margin over the runner-up, and whether that argmax is the target's token. A chain drafted from committed
position j is accepted while its proposals agree, so any drafting policy's acceptance replays exactly; its time
is priced from call costs (a plain step T1 ms, verify calls of T = 3 / 5 / 9 at the given multiples of it, a
draft call DC ms; the engine's own are in `Engine.costs` and `PoolDrafts.costs` after a few requests).

Policies: fixed k; a cut at the first proposal below a probability or a margin; a cut at the first proposal
whose calibrated chance is below a value (the chance: the agreement of the proposals in its probability bin,
margin bin, or both, as runtime/drafters/model.Doubt's cells, here fitted on the same questions); "priced", the
best continuation at a per-token rate against verifying now; "marginal", the engine's rule (Engine._model_drafts):
one more proposal while C * rate > R * DC, C the product of the drafted proposals' chances, rate the mean
agreement, R the policy's own tokens per ms (iterated to a fixed point), with the chances fitted or learnt as the
engine learns them (Doubt from its prior, question by question); and an oracle that drafts exactly what will be
accepted.
  python experiments/draft_confidence.py BUNDLE [T1=20.7] [DC=4.6] [V3,V5,V9=1.0,1.05,1.08]"""
import bisect
import json
import sys

import numpy as np

import specexport
from specexport.runtime.drafters import Doubt

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
P, G, A = [], [], []  # per question: the draft's probability of its argmax, its margin, agreement
for q in picked:
    g = pipe.generate([{"role": "user", "content": q["turns"][0]}], chat=True, max_new_tokens=128, draft="none")
    ids, n0 = list(g.prompt_ids) + list(g.token_ids), len(g.prompt_ids)
    cache = pipe.draft.new_cache()
    cache.reserve(len(ids) + 1)
    lg = pipe.draft.step(cache, ids, 0, rows=list(range(n0 - 1, len(ids) - 1))).logits.astype(np.float64)
    p = np.exp(lg - lg.max(1, keepdims=True))
    p = np.sort(p / p.sum(1, keepdims=True), 1)
    P.append(p[:, -1])
    G.append(p[:, -1] - p[:, -2])
    A.append(lg.argmax(1) == np.array(g.token_ids))
pp, gg, aa = np.concatenate(P), np.concatenate(G), np.concatenate(A)
print(f"{len(pp)} positions, the draft's argmax is the target's token at {aa.mean():.2f} of them")
P_EDGES, G_EDGES = [.3, .5, .7, .9], [.05, .1, .2, .4]
for name, sig, edges in (("draft probability", pp, P_EDGES), ("margin over the runner-up", gg, G_EDGES)):
    for lo, hi in zip([0] + edges, edges + [1.01]):
        m = (sig >= lo) & (sig < hi)
        print(f"  {name} in [{lo}, {min(hi, 1)}): {m.sum()} positions, agree {aa[m].mean():.2f}")
vcost = {1: T1, 3: T1 * mult[0], 5: T1 * mult[1], 9: T1 * mult[2]}


def v(n):
    return vcost[next(t for t in (1, 3, 5, 9) if t >= n)]


def replay(policy) -> float:
    """tokens per second of a policy (q, j, left) -> tokens to draft from committed position j of question q"""
    tok = ms = 0.0
    for q, a in enumerate(A):
        j = 0
        while j < len(a):
            k = policy(q, j, len(a) - j)
            acc = 0
            while acc < k and j + acc < len(a) and a[j + acc]:
                acc += 1
            j, tok = j + acc + 1, tok + acc + 1
            ms += v(k + 1) + k * DC
    return tok / ms * 1e3


def replay_oracle(kmax) -> float:
    """the best any stopping rule could do: each step drafts exactly the proposals that will be accepted (at
    least 1, at most kmax)"""
    tok = ms = 0.0
    for a in A:
        j = 0
        while j < len(a):
            acc = 0
            while acc < min(kmax, len(a) - j) and a[j + acc]:
                acc += 1
            k = max(1, acc)
            j, tok = j + acc + 1, tok + acc + 1
            ms += v(k + 1) + k * DC
    return tok / ms * 1e3


def until(stop, kmax):
    """drafts until stop(q, i) says the proposal at position i was the last"""
    def policy(q, j, left):
        k = 0
        while k < min(kmax, left):
            k += 1
            if stop(q, j + k - 1):
                break
        return k
    return policy


def binned(sig, edges):
    idx = np.digitize(sig, edges)
    return np.array([aa[idx == b].mean() if (idx == b).any() else 0.5 for b in range(len(edges) + 1)])


cal_p, cal_g = binned(pp, P_EDGES), binned(gg, G_EDGES)
cells = {}
for x, y, ok in zip(np.digitize(pp, P_EDGES), np.digitize(gg, G_EDGES), aa):
    cells.setdefault((x, y), []).append(ok)
chances = {
    "probability": lambda q, i: cal_p[np.digitize(P[q][i], P_EDGES)],
    "margin": lambda q, i: cal_g[np.digitize(G[q][i], G_EDGES)],
    "both": lambda q, i: float(np.mean(cells[(np.digitize(P[q][i], P_EDGES), np.digitize(G[q][i], G_EDGES))])),
}


def priced(r, kmax, chance):
    """drafts while the best continuation is expected to beat verifying now: after i proposals whose chances
    multiply to c_i, verifying now delivers E_i = 1 + c_1 + ... + c_i tokens in i * DC + v(i + 1) ms; drafting
    m - i more, each accepted at rate r, adds c_i * (r + ... + r^(m-i)) tokens for (m - i) * DC ms more"""
    def policy(q, j, left):
        E, c, i = 1.0, 1.0, 0
        while i < min(kmax, left):
            if i:
                now = E / (i * DC + v(i + 1))
                more = max((E + c * sum(r ** n for n in range(1, m - i + 1))) / (m * DC + v(m + 1))
                           for m in range(i + 1, min(kmax, left) + 1))
                if more <= now:
                    break
            c *= chance(q, j + i)
            E += c
            i += 1
        return i
    return policy


def marginal(chance, r, rate, kmax):
    def policy(q, j, left):
        k, C = 0, 1.0
        while k < min(kmax, left):
            k += 1
            C *= chance(q, j + k - 1)
            if C * r <= rate * DC:
                break
        return k
    return policy


def both_ks(policy_of_k):
    return ", ".join(f"k <= {km} {replay(policy_of_k(km)):.1f}" for km in (4, 8))


r = float(aa.mean())
print(f"plain {replay(lambda q, j, left: 0):.1f} tokens/s")
for k in (1, 2, 4, 8):
    print(f"fixed k = {k}: {replay(lambda q, j, left, k=k: min(k, left)):.1f}")
for th in (0.3, 0.5, 0.7, 0.9):
    print(f"stop below probability {th}: " + both_ks(lambda km: until(lambda q, i: P[q][i] < th, km)))
for th in (0.02, 0.05, 0.1, 0.2):
    print(f"stop at a margin below {th}: " + both_ks(lambda km: until(lambda q, i: G[q][i] < th, km)))
for lo in (0.6, 0.7, 0.8, 0.9):
    print(f"stop below calibrated {lo}: " + "; ".join(
        f"{name} " + both_ks(lambda km: until(lambda q, i: ch(q, i) < lo, km)) for name, ch in chances.items()))
for name, ch in chances.items():
    print(f"priced by {name}, rate {r:.2f}: " + both_ks(lambda km: priced(r, km, ch)))
for km in (4, 8):
    rate = replay(lambda q, j, left: min(4, left)) / 1e3
    for _ in range(4):  # the rate the rule is priced at is its own: a fixed point
        rate = replay(marginal(chances["both"], r, rate, km)) / 1e3
    print(f"marginal (both), k <= {km}: {rate * 1e3:.1f}")


def learnt(rate, kmax):
    """the marginal rule with the chances the engine has: drafters.model.Doubt from its prior, learning from each
    step's judged proposals as the questions go by (a fresh engine's burst)"""
    d = Doubt()

    def policy(q, j, left):
        k, C, cells = 0, 1.0, []
        while k < min(kmax, left):
            k += 1
            cells.append((bisect.bisect(d.P_EDGES, P[q][j + k - 1]), bisect.bisect(d.M_EDGES, G[q][j + k - 1])))
            C *= d.chance(cells[-1])
            if C * r <= rate * DC:
                break
        acc = 0
        while acc < k and A[q][j + acc]:
            acc += 1
        d.record(cells, acc, k)
        return k
    return policy


for km in (4, 8):
    rate = replay(lambda q, j, left: min(4, left)) / 1e3
    for _ in range(4):
        rate = replay(learnt(rate, km)) / 1e3
    print(f"marginal, learnt from the prior, k <= {km}: {rate * 1e3:.1f}")
print("oracle: " + ", ".join(f"k <= {km} {replay_oracle(km):.1f}" for km in (4, 8)))
