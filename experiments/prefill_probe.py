"""Where a prefill chunk's time goes as the cache grows: one T-token call of a bundle's target at n cached
tokens, medians of a few calls, and onnxruntime's per-op profile of the call at the last n.

    python experiments/prefill_probe.py bundles/smol-fused-long [--T 64] [--at 0,512,1400]

The cache holds zeros (the cost of a call does not depend on the values); the profile groups kernel time by
op type (MatMul, GroupQueryAttention, ...). docs/benchmarks.md "Time to first token" quotes it.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import specexport  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("bundle")
    ap.add_argument("--T", type=int, default=64)
    ap.add_argument("--at", default="0,512,1400")
    ap.add_argument("--calls", type=int, default=5)
    a = ap.parse_args()
    t = specexport.load(a.bundle, threads=2).target
    t.profile_ts = t.profile_ts | {a.T}  # any T the graph takes, not only the built profiles
    rng = np.random.default_rng(0)
    ns = [int(x) for x in a.at.split(",")]

    def call(n):
        cache = t.new_cache()
        cache.reserve(n + a.T)
        cache.n = n
        return t.step(cache, rng.integers(100, 40000, a.T).tolist(), n, rows=[a.T - 1]).run_s

    for n in ns:
        secs = [call(n) for _ in range(a.calls)]
        print(f"T={a.T} at n={n}: {statistics.median(secs) * 1e3:.1f} ms ({a.T / statistics.median(secs):.0f} tokens/s)")
    from specexport.backends.ort import session_options

    so = session_options()
    so.enable_profiling = True
    so.profile_file_prefix = "/tmp/prefill_probe"
    t.session = ort.InferenceSession(str(Path(a.bundle) / t.entry.graph), so, providers=["CPUExecutionProvider"])
    for _ in range(a.calls):
        call(ns[-1])
    path = t.session.end_profiling()
    ops, total = collections.Counter(), 0
    for e in json.load(open(path)):
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            ops[e["args"]["op_name"]] += e["dur"]
            total += e["dur"]
    os.remove(path)
    print(f"profile at n={ns[-1]} (per call):")
    for op, us in ops.most_common(6):
        print(f"  {op:28s} {us / a.calls / 1e3:7.1f} ms  {100 * us / total:4.1f}%")


if __name__ == "__main__":
    main()
