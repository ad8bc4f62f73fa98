"""Would a confidence gate on the draft model's length pay? Measured, not shipped (experiments/README.md, docs/benchmarks.md).

Idea: stop drafting after a token the draft itself finds unlikely (its softmax probability p < theta): the
next draft call would most likely be wasted. Lossless either way (the gate only shortens the proposal).
This probe patches ModelDrafter.propose with the gate, gives the target every verify profile T = 2..9 (the
graph is symbolic in T), and runs plain decoding, recycle and the bundle's draft model at several (k, theta)
on the first question of each Spec-Bench category, every method on every question in turn; outputs are
asserted identical. It also prints how often a drafted token was accepted against its draft probability.

  python experiments/gate_probe.py bundles/smollm2
"""
import argparse
import json

import numpy as np

import specexport
from specexport.runtime.drafters import ModelDrafter, SharedKV, feed

p = argparse.ArgumentParser()
p.add_argument("bundle")
p.add_argument("--questions", default="../shared/specbench/question.jsonl")
a = p.parse_args()
THETA = {"v": 0.0}
CAL = []  # (p, accepted?) per drafted token of the ungated runs


def propose(self, tokens, k, choose):
    N = len(tokens)
    if isinstance(self.cache, SharedKV):
        self.cache.n = self.cache.target.n
    logits, s = feed(self.model, self.cache, tokens[self.cache.n:])
    props, qs, ps = [], [], []
    for i in range(k):
        d, q = choose(logits, N + i)
        x = logits.astype(np.float32)
        p = 1.0 / np.exp(x - x[d]).sum()  # the draft's own probability of its token
        props.append(d)
        qs.append(q)
        ps.append(p)
        if i + 1 < k:
            if p < THETA["v"]:
                break
            out = self.model.step(self.cache, [d], self.cache.n)
            self.cache.commit(out.new_kv, [0])
            logits, s = out.logits[0], s + out.run_s
    self.run_s += s
    self._ps = ps
    return props, qs


def accepted(self, n_before, a, k):
    for i, p in enumerate(getattr(self, "_ps", [])):
        CAL.append((p, i < a))
    self.cache.truncate(min(self.cache.n, n_before + min(a, k - 1)))


ModelDrafter.propose, ModelDrafter.accepted = propose, accepted
pipe = specexport.load(a.bundle)
for k in range(1, 9):
    pipe.target.entry.profiles[f"verify_{k}"] = k + 1
pipe.target.profile_ts = set(pipe.target.entry.profiles.values())
qs, seen = [], set()
for line in open(a.questions):
    q = json.loads(line)
    if q["category"] not in seen:
        seen.add(q["category"])
        qs.append(q["turns"][0])
methods = [("none", 1, 0), ("recycle", 8, 0), ("model", 2, 0), ("model", 4, 0), ("model", 4, 0.5), ("model", 4, 0.7),
           ("model", 8, 0.7), ("model", 8, 0.85)]  # (draft, k, theta)
tot = {m: [0, 0.0, 0, 0.0] for m in methods}
ref = {}
for qi, q in enumerate(qs):
    for m in methods:
        THETA["v"] = m[2]
        n0 = len(CAL)
        g = pipe.generate(q, chat=True, max_new_tokens=128, draft=m[0], k=m[1])
        if m[2] > 0:
            del CAL[n0:]
        ref.setdefault(qi, g.token_ids)
        assert g.token_ids == ref[qi], (m, qi)
        s = g.stats
        t = tot[m]
        t[0] += s.new_tokens
        t[1] += s.total_s
        t[2] += s.steps
        t[3] += s.draft_s
    print(qi, flush=True)
base = tot[methods[0]][0] / tot[methods[0]][1]
for m, t in tot.items():
    r = t[0] / t[1]
    print(f"{m}: {r:.1f} tok/s {r/base:.3f}x tau {t[0]/t[2]:.2f} draft_s {t[3]:.1f} ms/step {1e3*t[1]/t[2]:.1f}")
c = np.array(CAL)
for lo, hi in [(0, .3), (.3, .5), (.5, .7), (.7, .85), (.85, .95), (.95, 1.01)]:
    sel = (c[:, 0] >= lo) & (c[:, 0] < hi)
    print(f"p in [{lo},{hi}): n={sel.sum()} accepted {c[sel, 1].mean() if sel.any() else 0:.2f}")
