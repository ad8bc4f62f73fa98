"""`openvino-int4` with the CPU plugin's dynamic quantization of activations (group 32, its default: int8
kernels) against it turned off (DYNAMIC_QUANTIZATION_GROUP_SIZE 0: float32 activations, int4 weights
decompressed): the load-time drift, and plain / recycle / prompt lookup on 6 chat prompts, 96 new tokens,
two interleaved rounds, medians.

    python experiments/ov_int4_dq_ab.py [BUNDLE]   (a --attention slots bundle; default bundles/smol-slots)
"""
import sys
import time

import numpy as np
import openvino as ov

import specexport

BUNDLE = sys.argv[1] if len(sys.argv) > 1 else "bundles/smol-slots"
real = ov.Core.compile_model


def load(dq: str):
    ov.Core.compile_model = lambda self, m, d, props: real(self, m, d, {**props, "DYNAMIC_QUANTIZATION_GROUP_SIZE": dq})
    try:
        return specexport.load(BUNDLE, threads=2, backend="openvino-int4")
    finally:
        ov.Core.compile_model = real


pipes = {"DQ 32": load("32"), "DQ off": load("0")}
for k, p in pipes.items(): print(k, "drift", p.target.entry.verify_drift, "exact_trees", p.target.exact_trees)
qs = ["Write a short story about a robot learning to paint.", "Explain how a hash map works, with an example in Python.",
      "Summarize the causes of the French revolution in five bullet points.", "What are the health benefits of green tea?",
      "Translate into French: The weather is nice today and we are going to the park.", "Solve: if 3x + 5 = 20, what is x? Explain."]
rate, outs = {}, {}
for _ in range(2):
    for draft in ("none", "recycle", "ngram"):
        for k, p in pipes.items():
            toks, secs, out = 0, 0.0, []
            for q in qs:
                t = time.perf_counter(); g = p.generate(q, max_new_tokens=96, draft=draft, chat=True); secs += time.perf_counter() - t
                toks += len(g.token_ids); out.append(g.token_ids)
            rate.setdefault((draft, k), []).append(toks / secs); outs[draft, k] = out
base = np.median(rate["none", "DQ 32"])
for (d, k), v in sorted(rate.items()):
    print(f"{k:7s} {d:8s} {np.median(v):.1f} tok/s ({np.median(v)/base:.2f}x DQ-32 plain), identical to its plain: {outs[d, k] == outs['none', k]}")
