"""Prefill on OpenVINO with each chunk's past cut to the first n+T slots against the whole bucket (what the
backend does): time per prompt and whether the logits and the cache come out the same. Weighed, not shipped
(docs/benchmarks.md, "Measured, not shipped"): the cut is an ROI tensor (a strided view of the cache, no
copy), and a process whose dynamic model ran both ROI and dense past inputs on two infer requests crashed
later (SIGSEGV in the next large allocation), for a gain within the machine's noise.

    python experiments/ov_prefill_past_ab.py SLOTS_BUNDLE [--backends openvino-bf16,openvino-int4] [--rounds 5]

Two targets per backend in one process, one with the cut (`cut_step`, patched onto it); random prompts
of 60, 200, 800 and 1,500 tokens, prefilled by `prefill.feed` on a fresh cache, the two interleaved prompt by
prompt, `rounds` rounds; medians.
"""
import argparse
import os
import time

import numpy as np

import specexport
from specexport.runtime import prefill
from specexport.backends.base import StepOut, logit_rows, step_inputs  # noqa: E402 (after runtime: import order)

SPAN = 32  # the past is the first n+T slots rounded up to this


def cut_step(m, cache, ids, start, new_mask=None, positions=None, rows=None):
    """OvBackend.step for a prefill chunk with its past inputs cut to the first L = n+T (rounded up to SPAN)
    slots: ROI tensors over the cache's layer buffers, past_mask cut to L."""
    import openvino as ov

    T = len(ids)
    cache.reserve(start + T)
    feeds = step_inputs(cache, ids, start, new_mask, positions)
    L = min(cache.S, -(-(start + T) // SPAN) * SPAN)
    held, req, full = cache.scratch.get("cut", (None, None, None))
    if held is not cache.data:
        req = req or m.compiled.create_infer_request()
        full = [ov.Tensor(v, shared_memory=True) for v in cache.views()]
        cache.scratch["cut"] = (cache.data, req, full)
    hi = list(full[0].shape)
    hi[2] = L
    for name, t in zip(m.kv_names, full):
        req.set_tensor(name, ov.Tensor(t, ov.Coordinate([0, 0, 0, 0]), ov.Coordinate(hi)))
    feeds["past_mask"] = feeds["past_mask"][:, :L]
    feeds["logit_rows"] = logit_rows(T, rows)
    logits, new_kv, run_s = m._run(req, feeds)
    return StepOut(logits[0], new_kv, run_s)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("slots")
    p.add_argument("--backends", default="openvino-bf16,openvino-int4")
    p.add_argument("--rounds", type=int, default=5)
    a = p.parse_args()
    os.environ.setdefault("SPECEXPORT_OV_FIXED", "0")  # prefill calls run on the dynamic model anyway
    for b in a.backends.split(","):
        cut = specexport.load(a.slots, threads=2, backend=b).target
        cut.step = cut_step.__get__(cut)
        whole = specexport.load(a.slots, threads=2, backend=b).target
        for N in (60, 200, 800, 1500):
            ids = [int(x) for x in np.random.RandomState(N).randint(100, 40000, N)]
            times, outs = {"cut": [], "whole": []}, {}
            for _ in range(a.rounds):
                for name, m in (("cut", cut), ("whole", whole)):
                    c = m.new_cache()
                    t = time.perf_counter()
                    logits, _ = prefill.feed(m, c, ids)
                    times[name].append(time.perf_counter() - t)
                    outs[name] = logits, c.data[:, :, :, :, :N].copy()
            same = all(np.array_equal(x, y) for x, y in zip(outs["cut"], outs["whole"]))
            cut_s, whole_s = np.median(times["cut"]), np.median(times["whole"])
            print(f"{b:14s} {N:5d} tokens: cut {cut_s:.3f} s, whole bucket {whole_s:.3f} s "
                  f"({whole_s / cut_s:.2f}x); logits and cache identical: {same}", flush=True)


if __name__ == "__main__":
    main()
