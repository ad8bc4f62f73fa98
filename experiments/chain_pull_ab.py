"""A/B of the engine's CHAIN_PRIOR_PULL (0 against the given value): the engine at one request, ngram k=auto, 13
Spec-Bench questions (one per category), 128 new tokens; variants alternate per question, order flipped per round.
    python experiments/chain_pull_ab.py BUNDLE PULL ROUNDS"""
import json, sys, time, statistics
import specexport
from specexport.runtime import engine as E
qs = [json.loads(l) for l in open("../shared/specbench/question.jsonl")]
seen, picked = set(), []
for q in qs:
    if q["category"] not in seen:
        seen.add(q["category"]); picked.append(q["turns"][0])
pipe = specexport.load(sys.argv[1], threads=2)
pipe.start_engine(max_batch=1)
vals = [0.0, float(sys.argv[2])]
rounds = int(sys.argv[3])
tok = {v: 0 for v in vals}; sec = {v: 0.0 for v in vals}; steps = {v: 0 for v in vals}; outs = {v: [] for v in vals}
per_round = {v: [] for v in vals}
for r in range(rounds):
    rt = {v: [0, 0.0] for v in vals}
    for i, p in enumerate(picked):
        order = vals if (i + r) % 2 == 0 else vals[::-1]
        for v in order:
            E.CHAIN_PRIOR_PULL = v
            t = time.perf_counter()
            g = pipe.submit(p, chat=True, max_new_tokens=128, draft="ngram", k="auto").wait()
            dt = time.perf_counter() - t
            tok[v] += len(g.token_ids); sec[v] += dt; steps[v] += g.stats.steps; rt[v][0] += len(g.token_ids); rt[v][1] += dt
            if r == 0: outs[v].append(g.token_ids)
    for v in vals: per_round[v].append(rt[v][0] / rt[v][1])
    print(f"round {r}: " + ", ".join(f"pull {v}: {rt[v][0]/rt[v][1]:.1f} tok/s" for v in vals), flush=True)
print("identical:", outs[vals[0]] == outs[vals[1]])
for v in vals:
    print(f"pull {v}: {tok[v]/sec[v]:.1f} tok/s, tokens/step {tok[v]/steps[v]:.3f}, median round {statistics.median(per_round[v]):.1f}")
print(f"ratio {tok[vals[1]]/sec[vals[1]] / (tok[vals[0]]/sec[vals[0]]):.3f}")
