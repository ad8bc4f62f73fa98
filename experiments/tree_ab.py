"""Two source trees of specexport against each other (say a `git worktree` of an earlier commit and this one),
interleaved by process: each round runs one process per tree, in alternating order, and each process runs
bursts of the bench's Spec-Bench prompts through one batching engine per level for k="auto", fixed k and
plain decoding (order rotated by round). Changes the engine reads once (its warm start, module constants) can
be compared only this way, not inside one process.

    git worktree add /tmp/old <commit>
    python experiments/tree_ab.py BUNDLE --a /tmp/old --b . [--levels 1,2,4,8] [--rounds 3] [--requests 16]
        [--max-new-tokens 128] [--k 4] [--draft model] [--out FILE.jsonl]

Prints each process's tokens per second, then per tree and level the medians over rounds, k="auto"'s ratio to
the better of fixed k and plain per round (and their median), and whether every request's tokens were the same
under all three methods in every process.
"""
import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time

METHODS = ("auto", "fixed", "plain")


def child(a) -> None:
    import specexport
    from specexport.bench.config import find_questions, questions

    pipe = specexport.load(a.bundle, threads=2)
    prompts = [pipe.encode(q["turns"][0], chat=True) for q in questions(find_questions(None), 4)[:a.requests]]
    opts = {"auto": {"draft": a.draft, "k": "auto"}, "fixed": {"draft": a.draft, "k": a.k}, "plain": {"draft": "none"}}
    out = {}
    for level in (int(x) for x in a.levels.split(",")):
        pipe.start_engine(max_batch=level, max_queue=len(prompts))
        for m in METHODS[a.round % 3:] + METHODS[:a.round % 3]:
            t = time.perf_counter()
            cs = [pipe.submit(q, max_new_tokens=a.max_new_tokens, **opts[m]) for q in prompts]
            toks = [c.wait(900).token_ids for c in cs]
            out[f"{level}/{m}"] = [sum(len(x) for x in toks) / (time.perf_counter() - t),
                                   hashlib.sha256(json.dumps(toks).encode()).hexdigest()[:16]]
    print(json.dumps(out))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("bundle")
    p.add_argument("--a", required=True, help="the first source tree (holds specexport/)")
    p.add_argument("--b", required=True, help="the second source tree")
    p.add_argument("--levels", default="1,2,4,8")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--requests", type=int, default=16)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--draft", default="model", choices=["recycle", "model", "ngram"])
    p.add_argument("--out", help="append each process's result here (JSON lines)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--round", type=int, default=0, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        return child(a)
    trees = [os.path.abspath(a.a), os.path.abspath(a.b)]
    res = {t: [] for t in trees}
    for r in range(a.rounds):
        for tree in trees if r % 2 == 0 else trees[::-1]:
            cmd = [sys.executable, __file__, a.bundle, "--a", a.a, "--b", a.b, "--child", "--round", str(r),
                   "--levels", a.levels, "--requests", str(a.requests), "--max-new-tokens", str(a.max_new_tokens),
                   "--k", str(a.k), "--draft", a.draft]
            env = dict(os.environ, PYTHONPATH=tree)
            got = json.loads(subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout.splitlines()[-1])
            res[tree].append(got)
            print(f"round {r} {tree}: " + ", ".join(f"{k} {v[0]:.1f}" for k, v in got.items()), flush=True)
            if a.out:
                with open(a.out, "a") as f:
                    f.write(json.dumps({"tree": tree, "round": r, "result": got}) + "\n")
    for level in a.levels.split(","):
        for tree in trees:
            runs = res[tree]
            med = {m: statistics.median(g[f"{level}/{m}"][0] for g in runs) for m in METHODS}
            ratios = [g[f"{level}/auto"][0] / max(g[f"{level}/fixed"][0], g[f"{level}/plain"][0]) for g in runs]
            same = all(len({g[f"{level}/{m}"][1] for m in METHODS}) == 1 for g in runs)
            print(f"c={level} {tree}: auto {med['auto']:.1f}, k={a.k} {med['fixed']:.1f}, plain {med['plain']:.1f} "
                  f"(medians); auto / the better per round {[round(x, 3) for x in ratios]}, median "
                  f"{statistics.median(ratios):.3f}; same tokens: {same}")


if __name__ == "__main__":
    main()
