"""Two bundles' batching engines on the same bursts, interleaved: each round runs one burst on A and one on B,
the order swapped every round (so neither bundle always runs first or right after the other), both loaded
in one process from the start. Plain decoding, greedy.

    python experiments/bundle_ab.py A B [--level 8] [--limit 16] [--max-new-tokens 128] [--rounds 6]

Per bundle: tokens per second of each burst, the median, and B/A per round; whether both bundles' tokens
agree request by request (different graphs: they may differ where two logits tie within rounding).
"""
import argparse
import statistics
import time

import specexport
from specexport.bench.config import find_questions, questions


def burst(pipe, prompts, n, **opts):
    """One burst of `prompts` on pipe's engine, `n` new tokens each -> (tokens per second, each request's tokens)."""
    t = time.perf_counter()
    cs = [pipe.submit(p, max_new_tokens=n, **opts) for p in prompts]
    toks = [c.wait(1800).token_ids for c in cs]
    return sum(len(x) for x in toks) / (time.perf_counter() - t), toks


def interleave(pipes, prompts, n, rounds, **opts):
    """pipes {"A": ..., "B": ...} (engines started) -> (rates {"A": [...], "B": [...]}, the last round's tokens
    per pipe): a warm burst each, then `rounds` bursts each, the order swapped every round."""
    for p in pipes.values():
        burst(p, prompts[:2], 8, **opts)  # warm
    rates, toks = {"A": [], "B": []}, {}
    for r in range(rounds):
        for k in ("AB" if r % 2 == 0 else "BA"):
            rate, toks[k] = burst(pipes[k], prompts, n, **opts)
            rates[k].append(rate)
        print(f"round {r}: A {rates['A'][-1]:.1f}, B {rates['B'][-1]:.1f} tokens/s, B/A {rates['B'][-1] / rates['A'][-1]:.3f}",
              flush=True)
    return rates, toks


def summary(rates, toks, a="A", b="B") -> str:
    """Medians, B/A, the per-round ratios and whether both sides' tokens agree request by request."""
    ma, mb = statistics.median(rates["A"]), statistics.median(rates["B"])
    ratios = [y / x for x, y in zip(rates["A"], rates["B"])]
    same = sum(x == y for x, y in zip(toks["A"], toks["B"]))
    return (f"{a} {ma:.1f}, {b} {mb:.1f} tokens/s (medians), B/A {mb / ma:.3f}x; per-round B/A median "
            f"{statistics.median(ratios):.3f} ({sum(x > 1 for x in ratios)} of {len(ratios)} rounds B ahead); "
            f"{same}/{len(toks['A'])} requests' tokens the same under both")


def burst_options(ap: argparse.ArgumentParser, rounds: int) -> None:
    """The options of every burst comparison in experiments/."""
    ap.add_argument("--level", type=int, default=8)
    ap.add_argument("--limit", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=rounds)


def start(pipes: dict, a) -> list:
    """The bench's --limit round-robin of Spec-Bench prompts (encoded by the first pipe), and each pipe's
    engine started for --level requests at once with room to queue them all."""
    first = next(iter(pipes.values()))
    prompts = [first.encode(q["turns"][0], chat=True) for q in questions(find_questions(None), 4, a.limit)]
    for p in pipes.values():
        p.start_engine(max_batch=a.level, max_queue=len(prompts))
    return prompts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a")
    ap.add_argument("b")
    burst_options(ap, rounds=6)
    a = ap.parse_args()
    pipes = {k: specexport.load(path, threads=2) for k, path in (("A", a.a), ("B", a.b))}
    prompts = start(pipes, a)
    rates, toks = interleave(pipes, prompts, a.max_new_tokens, a.rounds)
    print(f"level {a.level}, {len(prompts)} prompts, {a.max_new_tokens} new tokens, {a.rounds} rounds: "
          + summary(rates, toks))

if __name__ == "__main__":
    main()
