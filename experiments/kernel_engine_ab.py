"""The batching engine on onnxruntime's kernels (A) against specexport's (B): one bundle loaded twice in one
process (A with SPECEXPORT_KERNELS=0: onnxruntime's GroupQueryAttention and MatMul; with --switch
SPECEXPORT_MATMUL, A keeps specexport's attention and only its MatMul is onnxruntime's), the same bursts,
interleaved, the order swapped every round. Greedy.

    python experiments/kernel_engine_ab.py BUNDLE [--level 8] [--limit 16] [--max-new-tokens 128] [--rounds 4]
        [--draft none|recycle|ngram|model] [--k auto] [--switch SPECEXPORT_KERNELS|SPECEXPORT_MATMUL]
        [--against REV]
--against REV: A runs specexport's kernels as git revision REV has them (kernels/*.c and *.h of REV, built as
the library is), B the working tree's; --switch is then not used.

Per round: tokens per second of each burst, B/A; at the end medians and whether both kernels' tokens agree
request by request (float32 rounding differs between the kernels: they may differ where two logits tie)."""
import argparse
import os

import specexport
from bundle_ab import burst_options, interleave, start, summary  # experiments/: the same bursts, interleaved
from fused_calls import rev_library
from specexport import kernels


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bundle")
    burst_options(ap, rounds=4)
    ap.add_argument("--draft", default="none")
    ap.add_argument("--k", default="auto")
    ap.add_argument("--switch", default="SPECEXPORT_KERNELS", choices=["SPECEXPORT_KERNELS", "SPECEXPORT_MATMUL"])
    ap.add_argument("--against", help="git revision whose kernels A runs (B: the working tree's)")
    a = ap.parse_args()
    k = a.k if a.k == "auto" else int(a.k)
    pipes = {}
    if a.against:
        own, old = kernels.library, rev_library(a.against)
        kernels.library = lambda head_dim: old  # while A loads: its sessions register REV's library
        pipes["A"] = specexport.load(a.bundle, threads=2)
        kernels.library = own
        pipes["B"] = specexport.load(a.bundle, threads=2)
    else:
        for name, flag in (("A", "0"), ("B", "1")):
            os.environ[a.switch] = flag
            pipes[name] = specexport.load(a.bundle, threads=2)
    for name, p in pipes.items():
        print(name, "kernel:", p.target.kernel or "onnxruntime's")
    names = ((f"A ({a.against}'s kernels)", "B (the working tree's)") if a.against
             else ("A (onnxruntime's kernel)", "B (specexport's)"))
    prompts = start(pipes, a)
    rates, toks = interleave(pipes, prompts, a.max_new_tokens, a.rounds, draft=a.draft, k=k)
    print(f"level {a.level}, draft {a.draft} k {a.k}, {len(prompts)} prompts, {a.max_new_tokens} new tokens, "
          f"{a.rounds} rounds: " + summary(rates, toks, *names))


if __name__ == "__main__":
    main()
