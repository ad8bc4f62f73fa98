"""Poisson (or ARRIVAL=burst) arrivals, the engine at several prefill budgets, interleaved per repeat: tokens/s and
TTFT p50 ("auto": the engine's default, one chunk per request still prefilling, at most four).
  SPECBENCH=...question.jsonl [ARRIVAL=burst NEW=128] python experiments/prefill_budget_ab.py BUNDLE METHOD 64,auto,256 REPEATS
"""
import dataclasses, statistics, sys
from specexport.bench.config import BenchConfig, find_questions, questions
from specexport.bench.load import Load, arrival_times
bundle, meth = sys.argv[1], sys.argv[2]
budgets = [None if x == "auto" else int(x) for x in sys.argv[3].split(",")]
import os
arr = os.environ.get("ARRIVAL", "poisson")
cfg = BenchConfig(bundle=bundle, concurrency=(8, 16), arrival=arr, rate=4.0, requests=32 if arr == "poisson" else 16, limit=16,
                  max_new_tokens=int(os.environ.get("NEW", 64)), methods=(meth,))
L = Load(cfg, print)
qs = questions(find_questions(None), cfg.per_category, cfg.limit)
prompts = [L.pipe.encode(q["turns"][0], chat=True) for q in qs]
res = {}
for level in (8, 16):
    at = arrival_times(cfg.requests, cfg)
    order = [j % len(prompts) for j in range(cfg.requests)]
    for rep in range(int(sys.argv[4]) if len(sys.argv) > 4 else 2):
        for b in budgets:
            L.cfg = dataclasses.replace(cfg, prefill_budget=b)
            out, extra = L.engine(meth, [prompts[j] for j in order], at, level)
            wall = max(r["end"] for r in out) - extra["t0"]
            tps = sum(len(r["tokens"]) for r in out) / wall
            ttft = statistics.median(r["first"] - r["submit"] for r in out)
            res.setdefault((level, b), []).append((tps, ttft))
            print(level, b, f"{tps:.1f} tok/s ttft {ttft:.2f}", flush=True)
for (level, b), v in res.items():
    print(f"c={level} budget={b}: tokens/s {statistics.median(x for x, _ in v):.1f}, TTFT p50 {statistics.median(y for _, y in v):.2f} s")
