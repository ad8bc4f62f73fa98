"""The engine's speculation guard (runtime/costs.Payoff) on against off: bursts of Spec-Bench prompts through
the batching engine with recycle (or the bundle's draft model: --draft model) and k="auto", the two
alternated in one process.

    python experiments/payoff_ab.py BUNDLE[:BACKEND] [--concurrency 1,8] [--limit 8] [--max-new-tokens 64]
        [--rounds 2] [--draft recycle|model]

Off is the same engine with the guard's pause set to 0 (it never stops speculating). Per concurrency level and
round: a burst of `limit` prompts at most `level` at a time, on, then off (then off, then on in the next
round); tokens per second of the whole burst, medians over rounds, and whether every request's tokens are the
same both ways (the guard only chooses T, never a token).
"""
import argparse
import json
import time

import numpy as np

import specexport
from specexport.bench.config import find_questions


def burst(pipe, prompts, level, pause, n, draft="recycle"):
    eng = pipe.start_engine(max_batch=level, max_queue=len(prompts))
    eng.payoff.pause = pause
    pipe.successors = type(pipe.successors)(pipe.successors.succ.shape[0])  # each burst learns from nothing
    t = time.perf_counter()
    cs = [pipe.submit(p, max_new_tokens=n, draft=draft, k="auto") for p in prompts]
    toks = [c.wait(600).token_ids for c in cs]
    return sum(len(x) for x in toks) / (time.perf_counter() - t), toks, dict(eng.counters.get("batch", {}))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("bundle")
    p.add_argument("--concurrency", default="1,8")
    p.add_argument("--limit", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--draft", default="recycle", choices=["recycle", "model"])
    a = p.parse_args()
    path, _, backend = a.bundle.partition(":")
    pipe = specexport.load(path, threads=2, backend=backend or "onnxruntime")
    qs = [json.loads(line) for line in open(find_questions(None))][:a.limit * 10:10]
    prompts = [pipe.encode(q["turns"][0], chat=True) for q in qs]
    for level in (int(c) for c in a.concurrency.split(",")):
        tps, outs = {"on": [], "off": []}, {}
        for r in range(a.rounds):
            for mode in (("on", "off") if r % 2 == 0 else ("off", "on")):
                rate, toks, _ = burst(pipe, prompts, level, 32 if mode == "on" else 0, a.max_new_tokens, a.draft)
                tps[mode].append(rate)
                outs.setdefault(mode, toks)
        on, off = np.median(tps["on"]), np.median(tps["off"])
        print(f"{a.bundle} c={level}: guard on {on:.1f} tokens/s, off {off:.1f} ({on / off:.2f}x; rounds on "
              f"{[round(x, 1) for x in tps['on']]}, off {[round(x, 1) for x in tps['off']]}); same tokens: "
              f"{outs['on'] == outs['off']}", flush=True)


if __name__ == "__main__":
    main()
