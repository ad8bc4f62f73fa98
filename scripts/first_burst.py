"""What a freshly started service sees at its first burst (a benchmark, not a test): load a bundle, start the
engine, submit the first turns of Spec-Bench's questions (one per category) at once, each consumed by its own
thread, and print one JSON line: tokens/s over the burst, time to first token (median, max), and the pause
between two consecutive text pieces of a request (median, max: a stall of everyone shows here).

    python scripts/first_burst.py bundles/smollm2 --concurrency 8 [--draft none] [--cold]

--cold starts the engine without its warm-up (`start_engine(warm=False)`). Run it in a new process each time
(the first calls of each shape are what it measures), alternating the variants compared; to compare with an
older commit, run this file with PYTHONPATH pointing at a worktree of it (docs/benchmarks.md "Warm start").
"""
from __future__ import annotations

import argparse
import json
import statistics
import threading
import time

import specexport
from specexport.bench.config import find_questions, questions
from specexport.bench.machine import label


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bundle")
    ap.add_argument("--concurrency", type=int, default=8, help="max_batch of the engine (default 8)")
    ap.add_argument("--draft", default="none", help="none | ngram | recycle (default none)")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--cold", action="store_true", help="start the engine without its warm-up")
    ap.add_argument("--questions", default=None, help="Spec-Bench question.jsonl (default: found as the bench does)")
    a = ap.parse_args()
    pipe = specexport.load(a.bundle, threads=2)
    prompts = [pipe.encode(q["turns"][0], chat=True) for q in questions(find_questions(a.questions), 1)]
    t = time.perf_counter()
    try:
        pipe.start_engine(max_batch=a.concurrency, max_queue=len(prompts), **({"warm": False} if a.cold else {}))
    except TypeError:  # a commit before Engine.warm
        pipe.start_engine(max_batch=a.concurrency, max_queue=len(prompts))
    start_s = time.perf_counter() - t
    pipe.submit(prompts[0][:16], max_new_tokens=2, draft=a.draft).wait()  # as the bench's load mode does
    res = [None] * len(prompts)

    def consume(i, c, t_sub):
        stamps = [time.perf_counter() for _ in c]
        res[i] = (t_sub, stamps, len(c.generation.token_ids))

    t0 = time.perf_counter()
    threads = []
    for i, p in enumerate(prompts):
        c = pipe.submit(p, max_new_tokens=a.max_new_tokens, draft=a.draft)
        threads.append(threading.Thread(target=consume, args=(i, c, time.perf_counter())))
        threads[-1].start()
    for th in threads:
        th.join()
    secs = time.perf_counter() - t0
    ttft = sorted(s[0] - t_sub for t_sub, s, _ in res if s)
    gaps = [b - a for _, s, _ in res for a, b in zip(s, s[1:])]
    print(json.dumps({"tokens_per_s": round(sum(n for *_, n in res) / secs, 1), "ttft_p50_s": round(statistics.median(ttft), 3),
                      "ttft_max_s": round(ttft[-1], 3), "pause_p50_ms": round(1e3 * statistics.median(gaps), 1),
                      "pause_max_s": round(max(gaps), 3), "start_engine_s": round(start_s, 2),
                      "pool_slots": pipe.engine.stats()["pool_slots"], "cold": a.cold, "draft": a.draft,
                      "concurrency": a.concurrency, "requests": len(prompts), "machine": label()}))


if __name__ == "__main__":
    main()
