"""Would a pre-warmed successor table pay? Token recycling's table (SuccessorTable) starts empty and learns
from every verify call of a Pipeline. This measures the recycle drafter on an evaluation set of Spec-Bench
questions (the first 2 of each category) with a cold table, and again after a warm pass over other
questions (5th-10th of each category), reporting tokens per target step and tokens/s.

    python experiments/warm_table.py bundles/smollm2 [--questions ../shared/specbench/question.jsonl]
"""
import argparse
import json
import time
from collections import defaultdict

from specexport.runtime.pipeline import load
from specexport.runtime.tree import SuccessorTable


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle")
    ap.add_argument("--questions", default="../shared/specbench/question.jsonl")
    args = ap.parse_args()
    by_cat = defaultdict(list)
    for line in open(args.questions):
        q = json.loads(line)
        by_cat[q["category"]].append(q)
    evaluate = [q for c in by_cat for q in by_cat[c][:2]]
    warm = [q for c in by_cat for q in by_cat[c][4:10]]
    pipe = load(args.bundle, threads=2)
    vocab = pipe.successors.succ.shape[0]

    def run(name, qs):
        tokens = steps = seconds = 0
        t0 = time.perf_counter()
        for q in qs:
            s = pipe.generate(q["turns"][0], chat=True, max_new_tokens=128, draft="recycle").stats
            tokens, steps, seconds = tokens + s.new_tokens, steps + s.steps, seconds + s.total_s
        print(f"{name:10s} {len(qs)} questions: {tokens / steps:.3f} tokens/step, {tokens / seconds:.1f} tok/s, "
              f"{time.perf_counter() - t0:.0f} s, table contexts {len(pipe.successors.ctx)}", flush=True)

    pipe.successors = SuccessorTable(vocab)
    run("cold eval", evaluate)
    pipe.successors = SuccessorTable(vocab)
    run("warm pass", warm)
    run("warm eval", evaluate)


if __name__ == "__main__":
    main()
