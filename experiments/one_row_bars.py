"""At one request, k="auto" with the draft model (one row's drafts cut where the next proposal stops paying,
Engine._model_drafts) against fixed k = 4, fixed k = 8 and k="auto" with every row's bar scaled by a factor
(a bar times 0.5 cuts later, 0: never, which is fixed k = 8 drafted with the choice of T), interleaved: bursts of
Spec-Bench prompts one at a time through one engine, the methods rotated each round.

    python experiments/one_row_bars.py BUNDLE [--limit 16] [--max-new-tokens 128] [--rounds 8] [--scales 0.5]
        [--prompts round-robin|bench]

--prompts: --limit questions taken round-robin over Spec-Bench's categories (the default), or the first --limit
of 4 per category in file order, as `specexport bench --requests N` takes them (its first 16 are 4 categories').

Per round and method: tokens per second of the whole burst and how many chains of each length the draft made;
then medians over rounds and each method's ratio to fixed k = 8, round by round; last, the learnt chances of
drafters.model.Doubt's cells (probability bins down, margin bins across) and their tries after the first
round's k="auto" burst. The draft's learnt chances, the guard and the pooled chain acceptance start afresh every
burst (burst_state.afresh); the prefix cache holds every prompt before the first burst.
"""
import argparse
import collections
import statistics

import numpy as np

from burst_state import burst, loaded  # experiments/
from specexport.runtime.drafters.model import PoolDrafts

SCALE = [1.0]
LENGTHS = collections.Counter()  # chain length -> chains, this burst
_run = PoolDrafts.run


def run(self, want, bars=None):
    if bars:
        bars = {r: b * SCALE[0] for r, b in bars.items()}
    spent = _run(self, want, bars)
    for s, _ in want:
        LENGTHS[len(s.drafter.props)] += 1
    return spent


PoolDrafts.run = run


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("bundle")
    p.add_argument("--limit", type=int, default=16)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--scales", default="0.5", help="comma-separated factors for k='auto' bars besides 1")
    p.add_argument("--prompts", default="round-robin", choices=["round-robin", "bench"])
    a = p.parse_args()
    pipe, prompts = loaded(a.bundle, a.limit, a.prompts, 1)
    methods = {"k4": (4, 1.0), "k8": (8, 1.0), "auto": ("auto", 1.0)}
    methods.update({f"auto-x{f}": ("auto", float(f)) for f in a.scales.split(",") if f})
    rates, tokens = collections.defaultdict(list), {}
    for rnd in range(a.rounds):
        names = list(methods)[rnd % len(methods):] + list(methods)[:rnd % len(methods)]
        for m in names:
            k, SCALE[0] = methods[m]
            LENGTHS.clear()
            rate, out = burst(pipe, prompts, a.max_new_tokens, dict(draft="model", k=k))
            rates[m].append(rate)
            tokens.setdefault(m, out)
            print(f"round {rnd + 1} {m:10s} {rate:6.1f} tokens/s  chains by length {sorted(LENGTHS.items())}",
                  flush=True)
            if m == "auto" and rnd == 0:
                d = pipe.engine.drafts.doubt
                print("learnt chances\n", np.round(d.hits / d.tries, 3), "\ntries\n", np.round(d.tries), flush=True)
    base = statistics.median(rates["k8"])
    print(f"\none request, {len(prompts)} prompts, {a.max_new_tokens} new tokens; medians of {a.rounds} rounds")
    print("| method | tokens/s | vs fixed k = 8 | per round |")
    print("|---|---|---|---|")
    for m, v in rates.items():
        print(f"| {m} | {statistics.median(v):.1f} | {statistics.median(v) / base:.3f}x | "
              + " ".join(f"{x / y:.3f}" for x, y in zip(v, rates["k8"])) + " |")
    same = all(tokens[m] == tokens["k8"] for m in tokens)
    print("every request the same tokens under all methods:", same)


if __name__ == "__main__":
    main()
