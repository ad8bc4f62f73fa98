"""The batching engine with later prefill chunks batched (B) against first chunks only (A): on specexport's
attention kernel the engine puts the next chunk of several prefilling requests, each at its own n, in one
B-row call; before, only first chunks (every row at n = 0) were batched and later chunks ran one row per call
(or rode in a decode call). One bundle loaded twice in one process, A's engine restricted to first chunks,
the same bursts, interleaved, order swapped every round.

    python experiments/later_chunks_ab.py BUNDLE [--level 8] [--limit 16] [--max-new-tokens 128] [--rounds 4]
        [--draft none]
"""
import argparse
import types

import specexport
from bundle_ab import burst_options, interleave, start, summary  # experiments/: the same bursts, interleaved


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bundle")
    burst_options(ap, rounds=4)
    ap.add_argument("--draft", default="none")
    a = ap.parse_args()
    pipes = {k: specexport.load(a.bundle, threads=2) for k in "AB"}
    prompts = start(pipes, a)
    eng = pipes["A"].engine  # first chunks only, as before
    batched = eng._first_chunks
    eng._first_chunks = types.MethodType(lambda self, pre, budget: batched([s for s in pre if s.fed == 0], budget), eng)
    rates, toks = interleave(pipes, prompts, a.max_new_tokens, a.rounds, draft=a.draft)
    print(f"level {a.level}, draft {a.draft}, {len(prompts)} prompts, {a.max_new_tokens} new tokens, {a.rounds} rounds: "
          + summary(rates, toks, "A (first chunks batched)", "B (later chunks too)"))


if __name__ == "__main__":
    main()
