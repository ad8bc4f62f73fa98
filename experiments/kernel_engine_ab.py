"""The batching engine on onnxruntime's kernels (A) against specexport's (B): one bundle loaded twice in one
process (A with SPECEXPORT_KERNELS=0: onnxruntime's GroupQueryAttention and MatMul; with --switch
SPECEXPORT_MATMUL, A keeps specexport's attention and only its MatMul is onnxruntime's), the same bursts,
interleaved, the order swapped every round. Greedy.

    python experiments/kernel_engine_ab.py BUNDLE [--level 8] [--limit 16] [--max-new-tokens 128] [--rounds 4]
        [--draft none|recycle|ngram] [--k auto] [--switch SPECEXPORT_KERNELS|SPECEXPORT_MATMUL]

Per round: tokens per second of each burst, B/A; at the end medians and whether both kernels' tokens agree
request by request (float32 rounding differs between the kernels: they may differ where two logits tie)."""
import argparse
import os

import specexport
from bundle_ab import burst_options, interleave, start, summary  # experiments/: the same bursts, interleaved


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bundle")
    burst_options(ap, rounds=4)
    ap.add_argument("--draft", default="none")
    ap.add_argument("--k", default="auto")
    ap.add_argument("--switch", default="SPECEXPORT_KERNELS", choices=["SPECEXPORT_KERNELS", "SPECEXPORT_MATMUL"])
    a = ap.parse_args()
    k = a.k if a.k == "auto" else int(a.k)
    pipes = {}
    for name, flag in (("A", "0"), ("B", "1")):
        os.environ[a.switch] = flag
        pipes[name] = specexport.load(a.bundle, threads=2)
        print(name, "kernel:", pipes[name].target.kernel or "onnxruntime's")
    prompts = start(pipes, a)
    rates, toks = interleave(pipes, prompts, a.max_new_tokens, a.rounds, draft=a.draft, k=k)
    print(f"level {a.level}, draft {a.draft} k {a.k}, {len(prompts)} prompts, {a.max_new_tokens} new tokens, "
          f"{a.rounds} rounds: " + summary(rates, toks, "A (onnxruntime's kernel)", "B (specexport's)"))


if __name__ == "__main__":
    main()
