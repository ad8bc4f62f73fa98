"""The batching engine on onnxruntime's GroupQueryAttention kernel (A) against specexport's (B): one bundle loaded
twice in one process (A with SPECEXPORT_KERNELS=0), the same bursts, interleaved, the order swapped every
round. Greedy.

    python experiments/kernel_engine_ab.py BUNDLE [--level 8] [--limit 16] [--max-new-tokens 128] [--rounds 4]
        [--draft none|recycle|ngram] [--k auto]

Per round: tokens per second of each burst, B/A; at the end medians and whether both kernels' tokens agree
request by request (float32 rounding differs between the kernels: they may differ where two logits tie)."""
import argparse
import os
import statistics
import time

import specexport
from specexport.bench.config import find_questions, questions


def burst(pipe, prompts, n, draft, k):
    t = time.perf_counter()
    cs = [pipe.submit(p, max_new_tokens=n, draft=draft, k=k) for p in prompts]
    toks = [c.wait(1800).token_ids for c in cs]
    return sum(len(x) for x in toks) / (time.perf_counter() - t), toks


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bundle")
    ap.add_argument("--level", type=int, default=8)
    ap.add_argument("--limit", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--draft", default="none")
    ap.add_argument("--k", default="auto")
    a = ap.parse_args()
    k = a.k if a.k == "auto" else int(a.k)
    pipes = {}
    for name, flag in (("A", "0"), ("B", "1")):
        os.environ["SPECEXPORT_KERNELS"] = flag
        pipes[name] = specexport.load(a.bundle, threads=2)
        print(name, "kernel:", pipes[name].target.kernel or "onnxruntime's")
    prompts = [pipes["A"].encode(q["turns"][0], chat=True) for q in questions(find_questions(None), 4, a.limit)]
    for p in pipes.values():
        p.start_engine(max_batch=a.level, max_queue=len(prompts))
        burst(p, prompts[:2], 8, a.draft, k)  # warm
    rates, toks = {"A": [], "B": []}, {}
    for r in range(a.rounds):
        for name in ("AB" if r % 2 == 0 else "BA"):
            rate, toks[name] = burst(pipes[name], prompts, a.max_new_tokens, a.draft, k)
            rates[name].append(rate)
        print(f"round {r}: A {rates['A'][-1]:.1f}, B {rates['B'][-1]:.1f} tokens/s, B/A {rates['B'][-1] / rates['A'][-1]:.3f}",
              flush=True)
    ma, mb = statistics.median(rates["A"]), statistics.median(rates["B"])
    ratios = [b / x for x, b in zip(rates["A"], rates["B"])]
    same = sum(x == y for x, y in zip(toks["A"], toks["B"]))
    print(f"level {a.level}, draft {a.draft} k {a.k}, {len(prompts)} prompts, {a.max_new_tokens} new tokens, {a.rounds} "
          f"rounds: A (onnxruntime's kernel) {ma:.1f}, B (specexport's) {mb:.1f} tokens/s (medians), B/A {mb / ma:.3f}x; "
          f"per-round B/A median {statistics.median(ratios):.3f} ({sum(x > 1 for x in ratios)} of {len(ratios)} rounds "
          f"B ahead); {same}/{len(prompts)} requests' tokens the same under both")


if __name__ == "__main__":
    main()
