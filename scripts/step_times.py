"""Median time of one step of a bundle's target graph per (T, S), through the runtime's own backend.

  python scripts/step_times.py bundles/smollm2 --T 1,3,5,9,64 --S 256,2048
  python scripts/step_times.py bundles/smollm2 --T 1-10,12,16 --S 256 --any-T   # the cost curve
  python scripts/step_times.py bundles/smollm2 --T 1,9 --S 256 --ort-profile      # ms per op type

--any-T also times T values the bundle has no profile for (the exported graphs are symbolic in T; the
manifest's profiles only say which T the runtime runs), to choose which verify profiles to build. Runs
are interleaved over T (machine drift hits every T alike); the ratio column is against T=1.
"""
import argparse
import collections
import json
import os
import tempfile
import time

import numpy as np

import specexport


def ints(s):
    out = []
    for part in s.split(","):
        a, _, b = part.partition("-")
        out += list(range(int(a), int(b) + 1)) if b else [int(a)]
    return out


p = argparse.ArgumentParser()
p.add_argument("bundle")
p.add_argument("--T", default="1,3,5,9,64", help="comma-separated, ranges allowed: 1-9,16")
p.add_argument("--S", default="256,2048")
p.add_argument("--role", default="target")
p.add_argument("--runs", type=int, default=15)
p.add_argument("--any-T", action="store_true", help="also T values without a profile in the bundle")
p.add_argument("--ort-profile", action="store_true",
               help="also run onnxruntime's profiler and print ms per step by op type (MatMul split into the LM "
                    "head and the rest); the profiler's per-node cost inflates small ops")
a = p.parse_args()
pipe = specexport.load(a.bundle, verify=False)
model = pipe.target if a.role == "target" else pipe.draft
if a.ort_profile:
    import onnxruntime as ort

    from specexport.backends.ort import session_options

    so = session_options()
    so.enable_profiling = True
    so.profile_file_prefix = os.path.join(tempfile.gettempdir(), "step_times_profile")
    model.session = ort.InferenceSession(str(pipe.root / model.entry.graph), so)
if a.any_T:
    model.profile_ts = set(range(1, max(ints(a.T)) + 1))
Ts = [t for t in ints(a.T) if t in model.profile_ts]
Ss = ints(a.S)
times = {(T, S): [] for T in Ts for S in Ss}
caches = {}
for S in Ss:
    cache = model.new_cache()
    cache.reserve(S)
    cache.n = S // 2  # a half-full cache (its contents do not change the cost)
    caches[S] = cache
for _ in range(a.runs):
    for S in Ss:
        for T in Ts:
            t = time.perf_counter()
            model.step(caches[S], [1] * T, caches[S].n)
            times[T, S].append(time.perf_counter() - t)
med = {k: np.median(v) for k, v in times.items()}
print("| T | " + " | ".join(f"S={s}" for s in Ss) + " |")
print("|---|" + "---|" * len(Ss))
for T in Ts:
    row = [f"{med[T, S] * 1e3:.1f} ms" + (f" ({med[T, S] / med[1, S]:.2f}x)" if 1 in Ts else "") for S in Ss]
    print(f"| {T} | " + " | ".join(row) + " |")

if a.ort_profile:
    # events in run order: a step's node events come before its model_run event
    path = model.session.end_profiling()
    events = json.load(open(path))
    os.remove(path)
    head = max((e for e in events if e.get("cat") == "Node" and e["args"].get("op_name") == "MatMul"),
               key=lambda e: int(e["args"].get("output_size", 0)))["name"]  # the widest output: [T,V]
    per_run, cur = [], collections.Counter()
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            op = e["args"]["op_name"]
            cur["MatMul (LM head)" if e["name"] == head else op] += e["dur"] / 1e3
        elif e.get("cat") == "Session" and e["name"] == "model_run":
            per_run.append(cur)
            cur = collections.Counter()
    keys = [(T, S) for _ in range(a.runs) for S in Ss for T in Ts]  # the order the runs were made in
    by = collections.defaultdict(list)
    for k, c in zip(keys, per_run):
        by[k].append(c)
    cols = [k for k in by]
    ops = sorted({op for cs in by.values() for c in cs for op in c}, key=lambda op: -sum(
        np.median([c[op] for c in by[k]]) for k in cols))
    print("\nms per step inside the profiler, by op type (median over runs)\n")
    print("| op | " + " | ".join(f"T={T} S={S}" for T, S in cols) + " |")
    print("|---|" + "---|" * len(cols))
    for op in ops + ["all"]:
        vals = [np.median([sum(c.values()) if op == "all" else c[op] for c in by[k]]) for k in cols]
        print(f"| {op} | " + " | ".join(f"{v:.2f}" for v in vals) + " |")
