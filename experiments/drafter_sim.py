"""Noise-free A/B of the recycle drafter's settings: real target calls, but each step is priced by a fixed
cost curve (ratio to a plain step, from scripts/step_times.py --any-T) and the tree sizer is fed those
prices instead of wall times, so which T each step picks, the tokens and the total cost are deterministic.
Prints tokens per step and tokens per plain-step of cost (what the decode phase's speedup is).

  python experiments/drafter_sim.py bundles/smollm2 --questions 4,5 --set decay=0.98 --set orders=4
"""
import argparse
import collections
import json

import specexport
from specexport.runtime import tree

p = argparse.ArgumentParser()
p.add_argument("bundle")
p.add_argument("--spec-bench", default="../shared/specbench/question.jsonl")
p.add_argument("--questions", default="4,5", help="indices within each category (the benchmark uses 0..3)")
p.add_argument("--max-new-tokens", type=int, default=128)
p.add_argument("--cost", default="1:1.0,2:1.10,3:1.19,4:1.26,5:1.29,6:1.35,7:1.59,8:1.61,9:1.66",
               help="T:ratio to a T=1 step (default: the sweep at S=256 of 2026-11-29, AMD EPYC 2 cores AVX2)")
p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
               help="RecycleDrafter max_n / decay / limit, or orders (successor table context lengths)")
a = p.parse_args()
cost = {int(t): float(c) for t, c in (x.split(":") for x in a.cost.split(","))}
opts = {k: float(v) if k == "decay" else int(v) for k, v in (s.split("=") for s in a.set)}
if "orders" in opts:
    tree.SuccessorTable.ORDERS = opts.pop("orders")
if opts:
    make = tree.RecycleDrafter.__init__
    tree.RecycleDrafter.__init__ = lambda self, table, *args, **kw: make(self, table, **{"max_n": args[0] if args else 3, **opts})

used = []
update = tree.TreeSizer.update
tree.TreeSizer.update = lambda self, T, seconds: (used.append(T), update(self, T, cost[T] * 0.03))[1]

by_cat = collections.defaultdict(list)
for line in open(a.spec_bench):
    q = json.loads(line)
    by_cat[q["category"]].append(q)
picked = [qs[int(i)] for i in a.questions.split(",") for qs in by_cat.values()]
pipe = specexport.load(a.bundle, verify=False)
tokens = steps = total = 0
for q in picked:
    used.clear()
    g = pipe.generate(q["turns"][0], chat=True, max_new_tokens=a.max_new_tokens, draft="recycle")
    tokens, steps, total = tokens + g.stats.new_tokens, steps + g.stats.steps, total + sum(cost[T] for T in used)
print(f"{len(picked)} questions, {a.set or 'defaults'}: {tokens} tokens in {steps} steps = {tokens / steps:.3f} per step; "
      f"cost {total:.1f} plain steps = {tokens / total:.3f} tokens per plain step")
