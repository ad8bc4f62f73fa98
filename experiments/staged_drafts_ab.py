"""The draft model's calls fed guesses of its next proposals (PoolDrafts._guesses / _stage: prompt lookup, else
the draft's own successors) against one token a call, interleaved on one engine: bursts of Spec-Bench prompts at
a given concurrency, the variants rotated each round. The proposals are the same either way (specexport's kernels
score a row alike in a call of any T), so every request's tokens must be too; what changes is how many draft calls
make them.

    python experiments/staged_drafts_ab.py BUNDLE [--concurrency 1] [--limit 16] [--max-new-tokens 128]
        [--rounds 6] [--methods auto:staged,auto:one] [--prompts round-robin|bench]

A method is k:variant, k "auto" or a draft length; variants: "staged" (the engine as it is), "one" (one token a
call: PoolDrafts.stage off), "unpriced" (staged, but k="auto" prices a drafted token at a whole (B, 1) draft call,
as before PoolDrafts.token_cost). Ratios are to the second method. --prompts as in one_row_bars.py: --limit
questions round-robin over Spec-Bench's categories, or the bench's first --limit (4 per category, in file order).

Per round and variant: tokens per second of the whole burst, the draft's calls and proposals, its seconds, the
guesses' hit rate; then medians over rounds and the staged variant's ratio to one token a call, round by round.
The learnt state starts afresh every burst (burst_state.afresh); the prefix cache holds every prompt first.
"""
import argparse
import collections
import statistics

from burst_state import burst, loaded  # experiments/
from specexport.runtime.drafters.model import PoolDrafts

STATS = collections.Counter()  # this burst's draft calls, proposals and seconds
_run = PoolDrafts.run


def run(self, want, bars=None):
    calls = sum(self.calls.values())
    spent = _run(self, want, bars)
    STATS["calls"] += sum(self.calls.values()) - calls
    STATS["props"] += sum(len(s.drafter.props) for s, _ in want)
    STATS["draft_s"] += spent
    return spent


PoolDrafts.run = run


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("bundle")
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--limit", type=int, default=16)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--methods", default="auto:staged,auto:one", help="comma-separated k:variant")
    p.add_argument("--prompts", default="round-robin", choices=["round-robin", "bench"])
    a = p.parse_args()
    pipe, prompts = loaded(a.bundle, a.limit, a.prompts, a.concurrency)
    methods = {f"k{m}": (k if k == "auto" else int(k), v) for m in a.methods.split(",") for k, v in [m.split(":")]}
    token_cost, drafts = PoolDrafts.token_cost, pipe.engine.drafts
    rates, tokens = collections.defaultdict(list), {}
    for rnd in range(a.rounds):
        names = list(methods)[rnd % len(methods):] + list(methods)[:rnd % len(methods)]
        for m in names:
            k, v = methods[m]
            drafts.stage = v != "one"
            drafts.token_cost = (lambda B: drafts.costs.cost(B, 1)) if v == "unpriced" else \
                token_cost.__get__(drafts)
            STATS.clear()
            rate, out = burst(pipe, prompts, a.max_new_tokens, dict(draft="model", k=k))
            rates[m].append(rate)
            tokens.setdefault(m, out)
            d = pipe.engine.drafts
            n = sum(d.tries.values()) - d.GUESS_PRIOR * len(d.tries)
            hit = (sum(d.hits.values()) - sum(d.GUESS_CHANCES.values()) * d.GUESS_PRIOR) / max(n, 1)
            print(f"round {rnd + 1} {m:12s} {rate:6.1f} tokens/s  draft calls {STATS['calls']} proposals "
                  f"{STATS['props']} ({STATS['props'] / max(STATS['calls'], 1):.2f} a call) "
                  f"draft {STATS['draft_s']:.2f} s "
                  f"guesses hit {hit:.3f} of {n:.0f}, token cost {drafts.token_cost(1) * 1e3:.2f} ms", flush=True)
    print(f"\n{a.concurrency} request(s) at once, {len(prompts)} prompts, {a.max_new_tokens} new tokens; "
          f"medians of {a.rounds} rounds")
    base = list(methods)[1 if len(methods) > 1 else 0]
    print(f"| method | tokens/s | to {base} | per round |")
    print("|---|---|---|---|")
    for m, v in rates.items():
        one = rates[base]
        print(f"| {m} | {statistics.median(v):.1f} | {statistics.median(v) / statistics.median(one):.3f}x | "
              + " ".join(f"{x / y:.3f}" for x, y in zip(v, one)) + " |")
    same = all(tokens[m] == tokens[next(iter(tokens))] for m in tokens)
    print("every request the same tokens under all variants:", same)


if __name__ == "__main__":
    main()
