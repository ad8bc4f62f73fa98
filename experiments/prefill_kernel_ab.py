"""A whole prompt's prefill (the runtime's chunks, prefill.feed) on this checkout's kernels against another git
revision's, one bundle loaded twice in the same weight format, interleaved (order swapped each round), the
same random prompt per length: seconds per prompt length, medians, and whether the first token agrees; then a
one-token decode call after the longest prompt (each round 10 of them, both caches as their prefill left them).
    python experiments/prefill_kernel_ab.py BUNDLE REV [--weights float32|bf16|bf16dot] [--lengths 200,800,1500]
        [--rounds 5]"""
import argparse, statistics, time

import numpy as np
import onnxruntime as ort

import specexport
from specexport.backends import ORT_WEIGHTS
from specexport.backends.ort import session_options
from specexport.runtime import prefill
from fused_calls import rev_library  # experiments/

p = argparse.ArgumentParser()
p.add_argument("bundle")
p.add_argument("rev")
p.add_argument("--weights", default="float32")
p.add_argument("--lengths", default="200,800,1500")
p.add_argument("--rounds", type=int, default=5)
a = p.parse_args()
backend = next(b for b, w in ORT_WEIGHTS.items() if w == a.weights)
# this checkout's kernels: the backend's own session; REV's: the same graph reopened with REV's library
models = {who: specexport.load(a.bundle, threads=2, backend=backend).target for who in ("here", a.rev)}
old = models[a.rev]
old.session = ort.InferenceSession(str(old.root / old.entry.graph), session_options(2, rev_library(a.rev), a.weights),
                                   providers=["CPUExecutionProvider"])
V = models["here"].entry.arch["vocab_size"]
lengths = [int(x) for x in a.lengths.split(",")]
T, first = {}, {}
for r in range(a.rounds):
    for n in lengths:
        ids = np.random.default_rng(n).integers(3, V, n).tolist()
        for who in (list(models) if r % 2 == 0 else list(models)[::-1]):
            cache = models[who].new_cache()
            t = time.perf_counter()
            logits, _ = prefill.feed(models[who], cache, ids)
            T.setdefault((who, n), []).append(time.perf_counter() - t)
            first.setdefault((who, n), int(np.argmax(logits)))
            if n == lengths[-1]:
                for _ in range(10):
                    t = time.perf_counter()
                    models[who].step(cache, [int(np.argmax(logits))], n)
                    T.setdefault((who, "decode"), []).append(time.perf_counter() - t)
print(f"{a.bundle} on {backend}: this checkout's kernels against {a.rev}'s, {a.rounds} rounds, medians")
for n in lengths:
    h, o = statistics.median(T["here", n]), statistics.median(T[a.rev, n])
    print(f"  {n} tokens: here {h:.3f} s, {a.rev} {o:.3f} s, {a.rev} / here {o / h:.2f}x; "
          f"first token {'the same' if first['here', n] == first[a.rev, n] else 'differs'}")
h, o = statistics.median(T["here", "decode"]), statistics.median(T[a.rev, "decode"])
print(f"  decode (1 token) at {lengths[-1]}: here {h * 1e3:.1f} ms, {a.rev} {o * 1e3:.1f} ms, {a.rev} / here {o / h:.2f}x")
