"""specexport's MatMulNBits (kernels/matmul4.c) against onnxruntime's, on an int4 target with int8 activations:
one pipeline each in one process (SPECEXPORT_MATMUL4=0 for onnxruntime's), the same cache prefilled, then
calls of T = 1 and of each verify T, taking turns; medians of the call times; and what each loaded as (the
load-time verify-vs-decode measurement of a --pad-decode target).

    python experiments/matmul4_ab.py bundles/a8 [--calls 40] [--n 300]
"""
import argparse
import os
import statistics

import numpy as np

import specexport
from specexport.runtime.prefill import feed


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle")
    ap.add_argument("--calls", type=int, default=40)
    ap.add_argument("--n", type=int, default=300, help="cached tokens before the timed calls")
    a = ap.parse_args()
    models = {}
    for name, env in (("onnxruntime", "0"), ("specexport", "1")):
        os.environ["SPECEXPORT_MATMUL4"] = env
        models[name] = specexport.load(a.bundle, threads=2).target
    print({n: getattr(m, "nbits", None) for n, m in models.items()})
    m0 = models["specexport"]
    V = m0.entry.arch["vocab_size"]
    ts = [1] + sorted(m0.entry.profiles[f"verify_{k}"] for k in m0.entry.verify_ks())
    ids = np.random.default_rng(0).integers(0, V, a.n + max(ts)).tolist()
    caches = {}
    for name, m in models.items():
        caches[name] = m.new_cache()
        feed(m, caches[name], ids[:a.n])
    times = {(n, T): [] for n in models for T in ts}
    for _ in range(a.calls):
        for T in ts:
            for name, m in models.items():
                out = m.step(caches[name], ids[a.n:a.n + T], a.n)
                times[(name, T)].append(out.run_s)
    for T in ts:
        row = {n: statistics.median(times[(n, T)]) * 1e3 for n in models}
        print(f"T={T}: " + "  ".join(f"{n} {v:.2f} ms" for n, v in row.items())
              + f"  onnxruntime / specexport {row['onnxruntime'] / row['specexport']:.2f}x")
    for name, m in models.items():
        print(f"{name}: pad_decode {m.pad_decode}, trees exact {m.exact_trees}, speculative {m.entry.speculative}, "
              f"verify drift measured at load {m.entry.verify_drift}")

if __name__ == "__main__":
    main()
