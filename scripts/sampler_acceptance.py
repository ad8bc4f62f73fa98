"""Acceptance of the two exact samplers on the same prompts, draft and k: gumbel (shared noise,
reproducible across drafts) vs rejection (min(1, p/q), the classic rate).

  python scripts/sampler_acceptance.py bundles/smollm2 [--questions PATH]   # default: as specexport bench
"""
import argparse
import json
import statistics

import specexport
from specexport.bench import find_questions, questions
from specexport.runtime.drafters import SuccessorTable

p = argparse.ArgumentParser()
p.add_argument("bundle")
p.add_argument("--questions", default=None, help="Spec-Bench question.jsonl (default: found as specexport bench does)")
p.add_argument("--per-category", type=int, default=1)
p.add_argument("--max-new-tokens", type=int, default=64)
p.add_argument("--k", type=int, default=4)
p.add_argument("--drafts", default="model,ngram,recycle", help="comma-separated (recycle starts each generation "
               "with an empty successor table, so repeated prompts teach it nothing)")
a = p.parse_args()
pipe = specexport.load(a.bundle)
qs = questions(find_questions(a.questions), a.per_category)
print(f"{len(qs)} questions, {a.max_new_tokens} new tokens, k={a.k}, top-p 0.9, 3 seeds each")
print("| draft | temperature | sampler | acceptance | tau (tokens per target step) |")
print("|---|---|---|---|---|")
for draft in a.drafts.split(","):
    for temp in (0.7, 1.0):
        for sampler in ("gumbel", "rejection"):
            acc, tau = [], []
            for q in qs:
                for seed in range(3):
                    pipe.successors = SuccessorTable(pipe.successors.succ.shape[0])
                    g = pipe.generate(q["turns"][0], chat=True, max_new_tokens=a.max_new_tokens, draft=draft, k=a.k,
                                      temperature=temp, top_p=0.9, seed=seed, sampler=sampler)
                    acc.append(g.stats.accepted / max(g.stats.proposed, 1))
                    tau.append(g.stats.tau)
            print(f"| {draft} | {temp} | {sampler} | {statistics.mean(acc):.3f} | {statistics.mean(tau):.2f} |", flush=True)
