"""Two bundles of one target with different self-drafts (say int4 and int8 copies) on the batching engine,
interleaved: per level, bursts of plain decoding (on A), k="auto" with A's draft and k="auto" with B's draft,
the order rotated each round, both bundles loaded in one process; each engine first prefills every prompt once,
unmeasured, so that its prefix cache holds them for every measured burst (as adaptive_ab.py).

    python experiments/draft_kind_ab.py A B [--concurrency 2,1] [--limit 16] [--max-new-tokens 128] [--rounds 5]
        [--calls 15]

--calls N: first the two drafts' (B, 1) calls alone at B = 1, 2, 4, 8 (300 cached tokens, the cache zeros),
interleaved N times, medians of the last N - 3; --concurrency "" for those alone.

Per level: tokens per second of each burst (medians over rounds, each round's too), each method's ratio to plain,
B's to A's per round, the draft's acceptance (accepted / proposed, tokens per step) and whether every request's
tokens are the same under all three.
"""
import argparse
import json
import statistics
import time

import numpy as np

import specexport
from specexport.bench.config import find_questions
from specexport.runtime.costs import Payoff


def burst(pipe, prompts, n, opts):
    pipe.successors = pipe.fresh_table()  # as a new pipeline starts; the guard and the pooled acceptance afresh
    pipe.engine.payoff, pipe.engine.chains = Payoff(), {}
    t = time.perf_counter()
    gs = [c.wait(900) for c in [pipe.submit(p, max_new_tokens=n, **opts) for p in prompts]]
    return sum(len(g.token_ids) for g in gs) / (time.perf_counter() - t), gs


def calls(pipes, n) -> None:
    ds = {k: p.draft for k, p in pipes.items()}
    for B in (1, 2, 4, 8):
        pools = {k: d.new_pool(B) for k, d in ds.items()}
        for p in pools.values():
            p.reserve(308)
            p.n[:] = 300
            p.data[...] = 0
        ms = {k: [] for k in ds}
        for _ in range(n):
            for k, d in ds.items():
                pos = pools[k].n[:B, None].astype(np.int64).copy()
                t = time.perf_counter()
                d.step_batch(pools[k], np.full((B, 1), 1000, np.int64), pos)
                ms[k].append(1e3 * (time.perf_counter() - t))
        m = {k: statistics.median(v[3:]) for k, v in ms.items()}
        print(f"draft ({B}, 1) calls at 300 cached: A ({ds['A'].entry.kind}) {m['A']:.2f} ms, B ({ds['B'].entry.kind}) "
              f"{m['B']:.2f} ms, B / A {m['B'] / m['A']:.2f}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--concurrency", default="2,1")
    ap.add_argument("--limit", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=0)
    a = ap.parse_args()
    pipes = {"A": specexport.load(a.a, threads=2), "B": specexport.load(a.b, threads=2)}
    if a.calls:
        calls(pipes, a.calls)
    qs = [json.loads(line) for line in open(find_questions(None))][:a.limit * 10:10]  # every 10th, as adaptive_ab
    prompts = [pipes["A"].encode(q["turns"][0], chat=True) for q in qs]
    auto = {"draft": "model", "k": "auto"}
    methods = {"plain": ("A", {"draft": "none"}), "A auto": ("A", auto), "B auto": ("B", auto)}
    for level in (int(c) for c in a.concurrency.split(",") if c):
        for p in pipes.values():
            p.start_engine(max_batch=level, max_queue=len(prompts))
            burst(p, prompts, 2, {"draft": "none"})  # the prefix cache's prompts
        tps, toks, acc = {m: [] for m in methods}, {}, {m: [] for m in methods}
        for r in range(a.rounds):
            for m in list(methods)[r % 3:] + list(methods)[:r % 3]:
                side, opts = methods[m]
                rate, gs = burst(pipes[side], prompts, a.max_new_tokens, opts)
                tps[m].append(rate)
                toks.setdefault(m, [g.token_ids for g in gs])
                st = [g.stats for g in gs]
                acc[m].append((sum(s.accepted for s in st), sum(s.proposed for s in st), sum(s.steps for s in st)))
        med = {m: statistics.median(v) for m, v in tps.items()}
        same = all(t == toks["plain"] for t in toks.values())
        for m in methods:
            a_, p_, s_ = (sum(x[i] for x in acc[m]) for i in range(3))
            print(f"c={level} {m}: {med[m]:.1f} tokens/s ({med[m] / med['plain']:.3f}x plain; rounds "
                  f"{[round(x, 1) for x in tps[m]]}); accepted {a_ / max(p_, 1):.3f} of proposed, "
                  f"{(a_ + s_) / max(s_, 1):.2f} tokens a step", flush=True)
        ratios = [b / x for x, b in zip(tps["A auto"], tps["B auto"])]
        print(f"c={level}: B auto / A auto {med['B auto'] / med['A auto']:.3f}x on the medians, per round "
              f"{[round(x, 3) for x in ratios]}; same tokens: {same}", flush=True)
        for p in pipes.values():
            p.close(60)


if __name__ == "__main__":
    main()
