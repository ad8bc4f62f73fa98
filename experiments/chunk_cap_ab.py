"""Time to first token with the prefill's largest chunk changed, interleaved in one process: the shipped plan
(chunks of at most the bundle's largest prefill profile, 256 for SmolLM2 bundles) against caps below it (only
the profiles up to the cap) and above it (the cap added as a chunk size: the fused graph on specexport's
kernels runs any T). 5 rounds, the first a warm-up; medians; the first token must be the same under all.
    python experiments/chunk_cap_ab.py BUNDLE [--caps 512,1024] [--prompts 800,1500] [--backend onnxruntime]"""
import argparse
import time

import numpy as np

import specexport
from specexport.bench.config import find_questions
from specexport.bench.ttft import prompt_stream
from specexport.runtime import prefill

p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
p.add_argument("bundle")
p.add_argument("--caps", default="512,1024")
p.add_argument("--prompts", default="800,1500")
p.add_argument("--backend", default="onnxruntime")
a = p.parse_args()
pipe = specexport.load(a.bundle, threads=2, backend=a.backend)
shipped, cap = prefill.chunk_ts, {"v": None}


def chunk_ts(model, limit=None):
    ts, c = shipped(model, limit), cap["v"]
    if c is None:
        return ts
    return tuple(t for t in ts if t <= c) if c <= ts[-1] else ts + ((c,) if limit is None or c <= limit else ())


prefill.chunk_ts = chunk_ts
caps = [None] + [int(c) for c in a.caps.split(",")]
for N in (int(n) for n in a.prompts.split(",")):
    ids = prompt_stream(pipe, find_questions(None), N + 100)[100:100 + N]
    secs, first = {c: [] for c in caps}, {}
    for r in range(5):
        for c in caps:
            cap["v"] = c
            t = time.perf_counter()
            g = pipe.generate(ids, max_new_tokens=1, draft="none")
            if r:
                secs[c].append(time.perf_counter() - t)
            first[c] = g.token_ids
    base = np.median(secs[None])
    print(f"{N} tokens: " + ", ".join(f"{'shipped' if c is None else f'cap {c}'} {np.median(secs[c]):.3f} s "
                                       f"({np.median(secs[c]) / base:.2f}x)" for c in caps)
          + f"; same first token: {len({tuple(v) for v in first.values()}) == 1}", flush=True)
