"""What the mixed graph's calls cost against the step graph's calls they replace (docs/design.md "The mixed
graph"): one bundle, interleaved rounds, medians of each call's seconds inside onnxruntime.

    python scripts/mixed_cost.py bundles/smol-mixed [--rounds 3] [--n 200]

Rows sit at n cached tokens (zeros: a call's cost does not depend on the values). Pairs printed:
  decode B + chunk   a (B, 1) decode call and a single-row 64-token prefill call, against ONE mixed call
  2 verifying        a plain (2, 1) call against one mixed call of two T-token verify rows (the lower row as
                     a batch of one, the other as the group)
  decode B, no group the mixed graph with its group unused (one scratch token) against the step graph
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import specexport  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("bundle")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--calls", type=int, default=7)
    ap.add_argument("--n", type=int, default=200)
    a = ap.parse_args()
    t = specexport.load(a.bundle).target
    if not t.groups:
        raise SystemExit(f"{a.bundle} has no mixed graph (built with --mixed-groups 0, or not fused)")
    chunk = t.entry.profiles["prefill"]
    big = max(t.batch_sizes)
    pool = t.new_pool(big)
    while pool.acquire() is not None:
        pass
    rng = np.random.default_rng(0)
    n = a.n

    def ids(B, T):
        return rng.integers(100, 4000, (B, T))

    def at(B, T):
        return (n + np.arange(T))[None].repeat(B, 0)

    def reset():
        pool.n[:] = n

    def sep(B):  # decode rows, then the last row's chunk as its own call
        reset()
        s = t.step_batch(pool, ids(B, 1), at(B, 1)).run_s
        return s + t.step(pool.row(big - 1), ids(1, chunk)[0].tolist(), n, rows=[chunk - 1]).run_s

    def mixed(B):
        reset()
        g = [(big - 1, ids(1, chunk)[0].tolist(), n + np.arange(chunk), None, [])]
        return t.step_mixed(pool, ids(B, 1), at(B, 1), None, g)[0].run_s

    def plain2():
        reset()
        return t.step_batch(pool, ids(2, 1), at(2, 1)).run_s

    def pair(T):
        reset()
        return t.step_mixed(pool, ids(1, T), at(1, T), None, [(1, ids(1, T)[0].tolist(), n + np.arange(T), None, None)])[0].run_s

    def unused(B):  # the mixed graph, its group idle: what a decode step would pay for using it
        reset()
        return t.step_mixed(pool, ids(B, 1), at(B, 1), None, [(big - 1, [0], [n], None, [])])[0].run_s if B < big else float("nan")

    def plain(B):
        reset()
        return t.step_batch(pool, ids(B, 1), at(B, 1)).run_s

    verify = sorted(v for k, v in t.entry.profiles.items() if k.startswith("verify_"))
    cases = {f"decode {B} + chunk {chunk}": (lambda B=B: sep(B), lambda B=B: mixed(B)) for B in (8, big) if B in t.batch_sizes}
    cases.update({f"2 verifying T={T}": (plain2, lambda T=T: pair(T)) for T in verify})
    cases["decode 1 (group of one token)"] = (lambda: plain(1), lambda: unused(1))
    rows = {k: ([], []) for k in cases}
    for _ in range(a.rounds):
        for k, (x, y) in cases.items():
            for f, out in ((x, rows[k][0]), (y, rows[k][1])):
                f()
                out.append(statistics.median(f() for _ in range(a.calls)))
    print(f"{a.bundle}: rows at n={n}, {a.rounds} interleaved rounds, medians (ms)")
    print(f"| case | step graph calls | one mixed call | ratio |")
    print("|---|---|---|---|")
    for k, (x, y) in rows.items():
        mx, my = statistics.median(x) * 1e3, statistics.median(y) * 1e3
        print(f"| {k} | {mx:.1f} | {my:.1f} | {my / mx:.2f} |")


if __name__ == "__main__":
    main()
