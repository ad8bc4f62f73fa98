"""A whole prompt's prefill as the solo loop runs it: each target call's (T, n, ms inside onnxruntime) and the
wall time of pipe.generate(ids, max_new_tokens=1), a prompt of N tokens cut from the Spec-Bench texts (as
`specexport bench --ttft` cuts them), 3 rounds.
    python experiments/prefill_calls.py BUNDLE [N]"""
import sys, time
from pathlib import Path
import specexport
from specexport.bench.config import find_questions
from specexport.bench.ttft import prompt_stream

bundle, N = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 1500
pipe = specexport.load(bundle, threads=2)
ids = prompt_stream(pipe, find_questions(None), N + 100)[100:100 + N]
calls, step = [], pipe.target.step


def logged(cache, ids, start, *a, **k):
    out = step(cache, ids, start, *a, **k)
    calls.append((len(ids), start, out.run_s))
    return out


pipe.target.step = logged
for r in range(4):
    calls.clear()
    t = time.perf_counter()
    pipe.generate(ids, max_new_tokens=1, draft="none")
    wall = time.perf_counter() - t
    if r:  # the first round warms up
        print(f"{N} tokens: wall {wall:.3f} s, calls {sum(c[2] for c in calls):.3f} s:",
              ", ".join(f"({T}, {n}) {s * 1e3:.0f} ms" for T, n, s in calls))
