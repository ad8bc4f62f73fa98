"""The engine's chain-rate decay (engine.CHAIN_DECAY) for one request at a time with the bundle's draft model,
k="auto" at two decays against fixed k = 4, interleaved round by round on 13 Spec-Bench prompts (one per
category), 128 new tokens; tokens per second of each pass, medians.

    python experiments/chain_decay_ab.py   (bundles/seeded: SmolLM2 float32 with its int4 self-draft)
"""
import json, time, statistics
import specexport
from specexport.bench.config import find_questions
from specexport.runtime import engine as E
pipe = specexport.load("bundles/seeded", threads=2)
qs = [json.loads(l) for l in open(find_questions(None))][:130:10]
prompts = [pipe.encode(q["turns"][0], chat=True) for q in qs]
res = {}
for r in range(3):
    for name, k, decay in (("auto-0.8", "auto", 0.8), ("auto-0.95", "auto", 0.95), ("k4", 4, 0.8)):
        E.CHAIN_DECAY = decay
        eng = pipe.start_engine(max_batch=1)
        t = time.perf_counter()
        cs = [pipe.submit(p, max_new_tokens=128, draft="model", k=k) for p in prompts]
        n = sum(len(c.wait(600).token_ids) for c in cs)
        res.setdefault(name, []).append(n / (time.perf_counter() - t))
        pipe.close(10)
    print(r, {k: round(v[-1], 1) for k, v in res.items()}, flush=True)
print({k: round(statistics.median(v), 1) for k, v in res.items()})
