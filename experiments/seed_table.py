"""Does the build's seeded successor table pay? Token recycling's table learns from every verify call; a bundle
built with --seed-tokens N ships the table its build learnt on generic prompts (exporter/seed.py). This runs
the bench's questions (first N per category) with: plain, recycle from an empty table, and recycle from a copy
of the bundle's seeded table; each keeps its own table across the questions, and the three take turns per
question (interleaved).

    python experiments/seed_table.py bundles/seeded [--per-category 1]
"""
import argparse

from specexport.bench.config import questions
from specexport.runtime.pipeline import load


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle")
    ap.add_argument("--questions", default="../shared/specbench/question.jsonl")
    ap.add_argument("--per-category", type=int, default=1)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    args = ap.parse_args()
    pipe = load(args.bundle, threads=2)
    if pipe.seed is None:
        raise SystemExit(f"{args.bundle} has no seeded successor table: build it with --seed-tokens N")
    print(f"seeded table: {pipe.manifest.successors}, {len(pipe.seed.ctx)} contexts", flush=True)
    tables = {"cold": type(pipe.seed)(pipe.seed.succ.shape[0]), "seeded": pipe.fresh_table()}
    tot = {m: [0, 0, 0.0] for m in ("plain", "cold", "seeded")}
    same = 0
    qs = questions(args.questions, args.per_category)
    for i, q in enumerate(qs):
        out = {}
        for m in tot:
            if m != "plain":
                pipe.successors = tables[m]
            g = pipe.generate(q["turns"][0], chat=True, max_new_tokens=args.max_new_tokens,
                              draft="none" if m == "plain" else "recycle")
            s = g.stats
            tot[m][0] += s.new_tokens
            tot[m][1] += s.steps
            tot[m][2] += s.total_s
            out[m] = list(g.token_ids)
        same += out["plain"] == out["cold"] == out["seeded"]
        print(f"q{i} " + "  ".join(f"{m} {tot[m][0] / tot[m][1]:.3f}" for m in tot), flush=True)
    base = tot["plain"][0] / tot["plain"][2]
    for m, (n, steps, sec) in tot.items():
        print(f"{m:7s} tokens/step {n / steps:.3f}  tokens/s {n / sec:.1f}  vs plain {n / sec / base:.3f}x")
    print(f"identical {same}/{len(qs)}")


if __name__ == "__main__":
    main()
